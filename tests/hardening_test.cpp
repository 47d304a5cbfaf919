// Bad input that used to crash or corrupt: wild host addresses given to copies, fills and raw
// argument blocks (refused before the op is queued), and sizes whose arithmetic wraps.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "core/binary_format.hpp"
#include "core/host_memory_probe.hpp"
#include "cora/kernel_args.hpp"
#include "support/device_fixture.hpp"
#include "support/temp_files.hpp"

namespace cora::test {
namespace {

void* const wild = reinterpret_cast<void*>(0x1000);

// GCC says __SANITIZE_ADDRESS__, clang 14 only __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define CORA_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CORA_TEST_UNDER_ASAN 1
#endif
#endif

class hardening_test : public device_test {
 protected:
  /// Expects `p` to have failed with invalid_pointer when it was made: never queued.
  static void expect_refused(pending<void> p) {
    EXPECT_TRUE(p.ready());
    std::error_code ec;
    p.wait(ec);
    EXPECT_EQ(ec, make_error_code(errc::invalid_pointer)) << last_error_message();
  }
  /// The stream still copies correctly.
  void expect_works(stream& s) {
    std::vector<std::uint32_t> in(64, 7), out(64, 0);
    auto d = dev().alloc<std::uint32_t>(64);
    (void)s.copy(d.data(), in.data(), 256);
    s.copy(out.data(), d.data(), 256).wait();
    EXPECT_EQ(out, in);
  }
  /// add_f32's argument block: x, y, z, n.
  static std::vector<std::byte> add_block(const void* x, const void* y, void* z, std::uint64_t n) {
    std::vector<std::byte> b(32);
    std::memcpy(b.data(), &x, 8);
    std::memcpy(b.data() + 8, &y, 8);
    std::memcpy(b.data() + 16, &z, 8);
    std::memcpy(b.data() + 24, &n, 8);
    return b;
  }
};
CORA_DEVICE_SUITE(hardening_test);

TEST_P(hardening_test, CopiesAndFillsWithAWildHostAddressAreRefused) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(4096);
  expect_refused(s.copy(d.data(), wild, 64));
  expect_refused(s.copy(wild, d.data(), 64));
  expect_refused(s.copy(wild, wild, 64));
  expect_refused(s.fill(wild, 0, 64));
  // Ranges that wrap the address space.
  void* top = reinterpret_cast<void*>(UINTPTR_MAX - 15);
  expect_refused(s.copy(d.data(), top, 64));
  expect_refused(s.fill(top, 0, 64));
  s.synchronize().wait();
  expect_works(s);
}

TEST_P(hardening_test, FileReadsIntoAWildHostAddressAreRefused) {
  temp_dir dir;
  const auto file = dir / "data";
  write_pattern_file(file, 4096);
  auto s = dev().make_stream();
  std::error_code ec;
  EXPECT_EQ(s.read_file(wild, file, 0, 4096).wait(ec), 0u);
  EXPECT_EQ(ec, make_error_code(errc::invalid_pointer)) << last_error_message();
  std::vector<std::uint8_t> host(4096);
  EXPECT_EQ(s.read_file(host.data(), file, 0, 4096).wait(), 4096u);
}

TEST_P(hardening_test, UnmappedAndInaccessibleHostPagesAreRefused) {
#if defined(CORA_TEST_UNDER_ASAN)
  GTEST_SKIP() << "AddressSanitizer's allocator maps memory into the unmapped hole this test makes";
#endif
  const std::size_t ps = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto* m = static_cast<std::uint8_t*>(
      ::mmap(nullptr, 4 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(m, MAP_FAILED);
  // Pages: 0 readable, 1 unmapped, 2 PROT_NONE, 3 readable.
  ASSERT_EQ(::munmap(m + ps, ps), 0);
  ASSERT_EQ(::mprotect(m + 2 * ps, ps, PROT_NONE), 0);
  detail::forget_host_ranges();
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(4 * ps);
  expect_refused(s.copy(d.data(), m + ps, 16));      // inside the hole
  expect_refused(s.copy(d.data(), m + ps - 8, 16));  // runs into it
  expect_refused(s.copy(d.data(), m, 4 * ps));       // spans the hole, ends readable
  expect_refused(s.copy(m + ps, d.data(), 16));
  // Inaccessible pages: refused where the device reads host memory itself (the CPU device). A
  // GPU accepts them: its driver's unified addresses are reserved PROT_NONE on the host.
  if (GetParam() == backend::cpu) {
    expect_refused(s.copy(d.data(), m + 2 * ps, 16));
    expect_refused(s.fill(m + 2 * ps + 8, 1, 8));
  }
  // The readable pages themselves work.
  std::memset(m, 5, ps);
  std::memset(m + 3 * ps, 6, ps);
  (void)s.copy(d.data(), m, ps);
  s.copy(m + 3 * ps, d.data(), ps).wait();
  EXPECT_EQ(m[3 * ps], 5);
  EXPECT_EQ(m[4 * ps - 1], 5);
  ::munmap(m, 4 * ps);
}

TEST_P(hardening_test, PointerParametersAreMarkedInTheKernelMetadata) {
  auto k = kernels().kernel("add_f32");
  if (GetParam() != backend::cpu && !k.params()[0].pointer)
    GTEST_SKIP() << "this backend's images do not say which parameters are pointers";
  ASSERT_EQ(k.params().size(), 4u);
  EXPECT_TRUE(k.params()[0].pointer);
  EXPECT_TRUE(k.params()[1].pointer);
  EXPECT_TRUE(k.params()[2].pointer);
  EXPECT_FALSE(k.params()[3].pointer);
  auto m = kernels().kernel("mixed_args");
  for (std::size_t i = 0; i + 1 < m.params().size(); ++i) EXPECT_FALSE(m.params()[i].pointer) << i;
  EXPECT_TRUE(m.params().back().pointer);
}

// The pointer flags of a container's metadata are checked against the CPU image's records, as
// the sizes are: a cleared flag would let a raw block pass anything in that slot.
TEST_P(hardening_test, ContainerWhosePointerFlagsDisagreeWithTheImageIsRefused) {
  if (GetParam() != backend::cpu) GTEST_SKIP() << "the CPU image's records are checked";
  std::ifstream f(kernel_file("test_kernels.cora/test_kernels.cpu.so"), std::ios::binary);
  const std::vector<char> raw{std::istreambuf_iterator<char>(f), {}};
  ASSERT_FALSE(raw.empty());
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(raw.data()), raw.size());
  std::error_code ec;
  std::string message;
  auto records = detail::read_cpu_kernel_records(image, ec, message);
  ASSERT_FALSE(ec) << message;
  std::vector<detail::corabin_input> images{
      {detail::binary_kind::cpu_elf, 0, std::vector<std::byte>(image.begin(), image.end())}};
  // As written, the container loads.
  auto good = detail::write_corabin(images, records);
  EXPECT_TRUE(dev().load_binary(good).wait().kernel("add_f32"));
  auto it = std::find_if(records.begin(), records.end(), [](const auto& k) { return k.name == "add_f32"; });
  ASSERT_NE(it, records.end());
  ASSERT_TRUE(it->params[0].pointer);
  it->params[0].pointer = false;
  auto bad = detail::write_corabin(images, records);
  dev().load_binary(bad).wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary)) << last_error_message();
}

TEST_P(hardening_test, RawBlocksWithAGarbagePointerAreRefused) {
  auto k = kernels().kernel("add_f32");
  if (!k.params()[0].pointer) GTEST_SKIP() << "no pointer metadata for this backend's images";
  auto s = dev().make_stream();
  const std::uint64_t n = 16;
  auto x = dev().alloc<float>(n), y = dev().alloc<float>(n), z = dev().alloc<float>(n);
  std::vector<float> ones(n, 1.0f), out(n, 0.0f);
  (void)s.copy(x.data(), ones.data(), n * 4);
  (void)s.copy(y.data(), ones.data(), n * 4);
  void* garbage = reinterpret_cast<void*>(0xdead00000000);
  expect_refused(s.launch_host_block(k, {}, add_block(garbage, y.data(), z.data(), n)));
  expect_refused(s.launch_host_block(k, {}, add_block(x.data(), y.data(), wild, n)));
  // Memory freed before the launch: in no live allocation any more. (On the CPU device; a GPU
  // driver may keep a freed range's addresses reserved, and cora does not track them.)
  if (GetParam() == backend::cpu) {
    void* freed = dev().malloc(64);
    dev().free(freed);
    expect_refused(s.launch_host_block(k, {}, add_block(x.data(), freed, z.data(), n)));
  }
  // The pointer-array form and argument lists check the same slots.
  const void* xp = garbage;
  const void* yp = y.data();
  void* zp = z.data();
  const void* array[] = {&xp, &yp, &zp, &n};
  expect_refused(s.launch_pointer_array(k, {}, array));
  kernel_args args(k);
  args.append(&xp, 8);
  args.append(&yp, 8);
  args.append(&zp, 8);
  args.append(&n, 8);
  args.finalize();
  expect_refused(s.launch(k, {}, args));
  // A good block still launches; null stays allowed (a kernel may take optional pointers).
  (void)s.launch_host_block(k, {}, add_block(x.data(), y.data(), z.data(), n));
  s.copy(out.data(), z.data(), n * 4).wait();
  EXPECT_EQ(out, std::vector<float>(n, 2.0f));
  s.launch_host_block(k, {}, add_block(nullptr, nullptr, nullptr, 0)).wait();
}

TEST_P(hardening_test, AllocationSizesThatOverflowAreRefused) {
  EXPECT_CORA_ERROR(dev().alloc<float>((std::size_t{1} << 62) + 1), errc::invalid_argument);
  EXPECT_CORA_ERROR(dev().alloc<double>(SIZE_MAX / 4), errc::invalid_argument);
  EXPECT_CORA_ERROR(dev().alloc_host<float>((std::size_t{1} << 62) + 1), errc::invalid_argument);
  // Raw sizes that no rounding may wrap: out_of_memory (or invalid_argument from a driver).
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX - 62}) {
    std::error_code ec;
    EXPECT_EQ(dev().malloc_host(bytes, ec), nullptr) << bytes;
    EXPECT_TRUE(ec == errc::out_of_memory || ec == errc::invalid_argument) << ec.message();
    EXPECT_EQ(dev().malloc(bytes, ec), nullptr) << bytes;
    EXPECT_TRUE(ec == errc::out_of_memory || ec == errc::invalid_argument) << ec.message();
  }
}

TEST_P(hardening_test, OversizedPlaceholderBufferIsRefused) {
  kernel_args args(kernels().kernel("add_f32"));
  auto ph = args.append_placeholder();
  std::error_code ec;
  EXPECT_EQ(args.placeholder_buffer(ph, SIZE_MAX, ec), nullptr);
  EXPECT_EQ(ec, make_error_code(errc::too_many_arguments)) << last_error_message();
  EXPECT_EQ(args.placeholder_buffer(ph, (64 << 10) + 1, ec), nullptr);
  EXPECT_EQ(ec, make_error_code(errc::too_many_arguments));
  EXPECT_NE(args.placeholder_buffer(ph, 64, ec), nullptr);
  EXPECT_FALSE(ec);
}

}  // namespace
}  // namespace cora::test
