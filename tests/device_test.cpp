#include "cora/device.hpp"

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

class device_test_suite : public device_test {};
CORA_DEVICE_SUITE(device_test_suite);

TEST_P(device_test_suite, AllocatesAndFreesDeviceMemory) {
  const auto before = dev().memory_in_use();
  {
    auto b = dev().alloc<double>(1000);
    EXPECT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), 1000u);
    EXPECT_EQ(b.size_bytes(), 8000u);
    EXPECT_GE(dev().memory_in_use(), before + 8000);
  }
  EXPECT_EQ(dev().memory_in_use(), before);
}

TEST_P(device_test_suite, ZeroBytesIsInvalid) {
  EXPECT_CORA_ERROR(dev().malloc(0), errc::invalid_argument);
  EXPECT_CORA_ERROR(dev().malloc_host(0), errc::invalid_argument);
  EXPECT_CORA_ERROR(dev().alloc<float>(0), errc::invalid_argument);
}

TEST_P(device_test_suite, MoreThanTheDeviceHasIsOutOfMemory) {
  std::error_code ec;
  void* p = dev().malloc(dev().properties().total_memory + 1, ec);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ec, make_error_code(errc::out_of_memory));
}

TEST_P(device_test_suite, FreeOfAForeignPointerIsInvalid) {
  int local = 0;
  EXPECT_CORA_ERROR(dev().free(&local), errc::invalid_pointer);
  EXPECT_CORA_ERROR(dev().free(nullptr), errc::invalid_pointer);
  void* p = dev().malloc(64);
  dev().free(p);
  EXPECT_CORA_ERROR(dev().free(p), errc::invalid_pointer);  // double free
  EXPECT_CORA_ERROR(dev().free_host(&local), errc::invalid_pointer);
}

// Allocations that span many of the allocation table's shards are found from any address
// inside them, and a range that runs past their end is refused.
TEST_P(device_test_suite, InteriorAddressesOfLargeAllocationsAreFound) {
  constexpr std::size_t bytes = (std::size_t{3} << 20) + 1000;  // about fifty 64 KiB granules
  auto d = dev().alloc<std::uint8_t>(bytes);
  auto h = dev().alloc_host<std::uint8_t>(bytes);
  auto back = dev().alloc_host<std::uint8_t>(4096);
  for (std::size_t i = 0; i < bytes; ++i) h[i] = static_cast<std::uint8_t>(i * 7);
  auto s = dev().make_stream();
  for (std::size_t off : {std::size_t{0}, std::size_t{70000}, std::size_t{2} << 20, bytes - 4096}) {
    s.copy(d.data() + off, h.data() + off, 4096).wait();
    s.copy(back.data(), d.data() + off, 4096).wait();
    for (std::size_t i = 0; i < 4096; i += 511)
      ASSERT_EQ(back[i], static_cast<std::uint8_t>((off + i) * 7)) << "offset " << off;
  }
  EXPECT_CORA_ERROR(s.copy(d.data() + bytes - 100, h.data(), 4096).wait(), errc::out_of_range);
  EXPECT_CORA_ERROR(s.copy(back.data(), h.data() + bytes - 100, 4096).wait(), errc::out_of_range);
}

TEST_P(device_test_suite, PinnedMemoryIsHostAccessible) {
  auto h = dev().alloc_host<int>(10);
  for (int i = 0; i < 10; ++i) h[i] = i * i;
  int sum = 0;
  for (int v : h) sum += v;
  EXPECT_EQ(sum, 285);
  void* raw = dev().malloc_host(128);
  dev().free_host(raw);
}

TEST_P(device_test_suite, SynchronizeWaitsForEveryStream) {
  auto a = dev().make_stream(), b = dev().make_stream();
  auto flags = dev().alloc<std::uint32_t>(2);
  a.fill(flags, 0).wait();
  auto slow = kernels().kernel("slow");
  auto pa = a.launch(slow, {}, std::uint64_t{30000}, flags.data());
  auto pb = b.launch(slow, {}, std::uint64_t{40000}, flags.data() + 1);
  dev().synchronize().wait();
  EXPECT_TRUE(pa.ready());
  EXPECT_TRUE(pb.ready());
}

TEST_P(device_test_suite, SynchronizeReportsAStreamsFault) {
  CORA_SKIP_FAULTS_ON_GPU();
  auto s = dev().make_stream();
  auto flags = dev().alloc<std::uint32_t>(1);
  (void)s.launch(kernels().kernel("trap"), {}, flags);
  EXPECT_CORA_ERROR(dev().synchronize().wait(), errc::kernel_fault);
}

}  // namespace
}  // namespace cora::test
