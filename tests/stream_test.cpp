#include "cora/stream.hpp"

#include <numeric>
#include <thread>
#include <vector>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

class stream_test : public device_test {};
CORA_DEVICE_SUITE(stream_test);

TEST_P(stream_test, CopiesRoundTripThroughDeviceMemory) {
  auto s = dev().make_stream();
  const std::size_t n = 100000;
  auto h = dev().alloc_host<std::uint32_t>(n);
  auto back = dev().alloc_host<std::uint32_t>(n);
  std::iota(h.begin(), h.end(), 7u);
  auto d = dev().alloc<std::uint32_t>(n);
  (void)s.copy(d, h);
  s.copy(back, d).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], i + 7);
}

TEST_P(stream_test, TypedLaunchComputesOnTheDevice) {
  auto s = dev().make_stream();
  const std::size_t n = 1 << 16;
  auto x = dev().alloc<float>(n), y = dev().alloc<float>(n), z = dev().alloc<float>(n);
  auto hx = dev().alloc_host<float>(n), hz = dev().alloc_host<float>(n);
  for (std::size_t i = 0; i < n; ++i) hx[i] = static_cast<float>(i);
  (void)s.copy(x, hx);
  (void)s.copy(y, hx);
  (void)s.launch(kernels().kernel("add_f32"), {.grid = 16}, x, y, z, std::uint64_t{n});
  s.copy(hz, z).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hz[i], 2.0f * static_cast<float>(i));
}

}  // namespace
}  // namespace cora::test

namespace cora::test {
namespace {

TEST_P(stream_test, CopiesInEveryDirection) {
  auto s = dev().make_stream();
  std::vector<std::uint8_t> pageable(1000);
  for (std::size_t i = 0; i < pageable.size(); ++i) pageable[i] = static_cast<std::uint8_t>(i);
  auto d1 = dev().alloc<std::uint8_t>(1000), d2 = dev().alloc<std::uint8_t>(1000);
  auto pinned = dev().alloc_host<std::uint8_t>(1000);
  std::vector<std::uint8_t> out(1000);
  (void)s.copy(d1.data(), pageable.data(), 1000);  // H2D from pageable memory
  pageable.assign(1000, 0);                  // the source was read before copy() returned
  (void)s.copy(d2, d1);                             // D2D
  (void)s.copy(pinned, d2);                         // D2H into pinned memory
  (void)s.copy(out.data(), pinned.data(), 1000);    // H2H
  s.synchronize().wait();
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<std::uint8_t>(i));
}

TEST_P(stream_test, FillSetsBytes) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(64);
  (void)s.fill(d, 0xab);
  std::uint32_t h[64];
  s.copy(h, d.data(), sizeof(h)).wait();
  for (auto v : h) ASSERT_EQ(v, 0xababababu);
}

// A dropped stream whose work is done serves the next make_stream (where the device pools
// its streams), and starts afresh there: waits on it still wait for their own ops.
TEST_P(stream_test, DrainedStreamsServeAgainFromAFreshStart) {
  constexpr std::size_t n = 1 << 16;
  auto d = dev().alloc<std::uint8_t>(n);
  auto h = dev().alloc_host<std::uint8_t>(n);
  void* previous = nullptr;
  int reused = 0;
  for (int round = 0; round < 40; ++round) {
    auto s = dev().make_stream();
    if (previous && s.native_handle() == previous) ++reused;
    const auto value = static_cast<std::uint8_t>(round + 1);
    (void)s.fill(d, value);
    s.copy(h, d).wait();
    for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(h[i], value) << "round " << round << ", byte " << i;
    previous = s.native_handle();
  }
  // The pool's refill on a cora thread may slip a new stream in now and then.
  if (previous) {
    EXPECT_GE(reused, 30) << "drained streams should serve the next rounds";
  }
}

TEST_P(stream_test, OpsCompleteInCallOrder) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(1);
  std::vector<pending<void>> ps;
  for (std::uint8_t v = 1; v <= 50; ++v) ps.push_back(s.fill(d, v));
  std::uint32_t h = 0;
  s.copy(&h, d.data(), 4).wait();
  EXPECT_EQ(h, 0x32323232u);
  for (auto& p : ps) EXPECT_TRUE(p.ready());
}

TEST_P(stream_test, NullPointerIsInvalid) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(16);
  EXPECT_CORA_ERROR(s.copy(nullptr, d.data(), 16).wait(), errc::invalid_pointer);
  EXPECT_CORA_ERROR(s.copy(d.data(), nullptr, 16).wait(), errc::invalid_pointer);
  EXPECT_CORA_ERROR(s.fill(nullptr, 0, 16).wait(), errc::invalid_pointer);
}

TEST_P(stream_test, FreedDeviceMemoryIsNoLiveAllocation) {
  if (GetParam() == backend::cuda) GTEST_SKIP() << "the CUDA driver cannot tell freed device memory from host memory";
  auto s = dev().make_stream();
  void* p = dev().malloc(256);
  dev().free(p);
  std::uint8_t h[16] = {};
  EXPECT_CORA_ERROR(s.copy(p, h, 16).wait(), errc::invalid_pointer);
}

TEST_P(stream_test, RangePastTheEndOfAnAllocationIsOutOfRange) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(100);
  std::vector<std::uint8_t> h(200);
  EXPECT_CORA_ERROR(s.copy(d.data(), h.data(), 101).wait(), errc::out_of_range);
  EXPECT_CORA_ERROR(s.copy(h.data(), d.data() + 50, 51).wait(), errc::out_of_range);
  EXPECT_CORA_ERROR(s.fill(d.data() + 99, 0, 2).wait(), errc::out_of_range);
  auto small = dev().alloc_host<std::uint8_t>(10);
  EXPECT_CORA_ERROR(s.copy(small, d).wait(), errc::out_of_range);
}

TEST_P(stream_test, ZeroByteCopyCompletesAtOnce) {
  auto s = dev().make_stream();
  auto p = s.copy(nullptr, nullptr, 0);
  EXPECT_TRUE(p.ready());
  p.wait();
}

TEST_P(stream_test, TrapFailsTheStreamUntilSynchronizeReportsIt) {
  CORA_SKIP_FAULTS_ON_GPU();
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  auto flags = dev().alloc<std::uint32_t>(4);
  auto trap = s.launch(kernels().kernel("trap"), {.grid = 2}, flags);
  auto after = s.fill(flags, 0);
  try {
    trap.wait();
    FAIL() << "the trap was not reported";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::kernel_fault));
    EXPECT_NE(std::string(e.what()).find("trap"), std::string::npos) << e.what();
  }
  // A later op on the same stream is affected too.
  EXPECT_CORA_ERROR(after.wait(), errc::kernel_fault);
  // Other streams keep working.
  auto h = dev().alloc_host<std::uint32_t>(4);
  (void)other.fill(flags, 7);
  other.copy(h, flags).wait();
  EXPECT_EQ(h[0], 0x07070707u);
  // synchronize reports the fault once, then the stream is usable again.
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::kernel_fault);
  (void)s.fill(flags, 1);
  s.copy(h, flags).wait();
  EXPECT_EQ(h[0], 0x01010101u);
}

TEST_P(stream_test, DroppedFailureSurfacesAtTheNextWait) {
  auto s = dev().make_stream();
  (void)s.copy(nullptr, nullptr, 4);  // fails validation; the pending is dropped
  auto d = dev().alloc<std::uint8_t>(4);
  EXPECT_CORA_ERROR(s.fill(d, 0).wait(), errc::invalid_pointer);
  std::error_code ec;
  s.synchronize().wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_pointer));
  s.synchronize().wait();  // reported once: cleared
}

TEST_P(stream_test, DestroyingAStreamWithWorkInFlightLetsTheWorkFinish) {
  auto flag = dev().alloc<std::uint32_t>(1);
  auto h = dev().alloc_host<std::uint32_t>(1);
  auto done = dev().make_event();
  {
    auto s = dev().make_stream();
    (void)s.fill(flag, 0);
    (void)s.launch(kernels().kernel("slow"), {}, std::uint64_t{20000}, flag);
    (void)s.record(done);
  }  // the stream handle is gone, its work is not
  // Read the flag after the kernel through the event, not by polling it while the kernel
  // writes it (a data race, which ThreadSanitizer reports on the CPU device).
  auto s2 = dev().make_stream();
  (void)s2.wait(done);
  s2.copy(h, flag).wait();
  EXPECT_EQ(h[0], 1u);
}

TEST_P(stream_test, StreamsRunConcurrently) {
  if (dev().properties().compute_units < 2) GTEST_SKIP() << "one compute unit";
  auto a = dev().make_stream(), b = dev().make_stream();
  auto flags = dev().alloc<std::uint32_t>(2);
  const auto t0 = std::chrono::steady_clock::now();
  auto pa = a.launch(kernels().kernel("slow"), {}, std::uint64_t{100000}, flags.data());
  auto pb = b.launch(kernels().kernel("slow"), {}, std::uint64_t{100000}, flags.data() + 1);
  pa.wait();
  pb.wait();
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 190.0) << "two 100 ms kernels on two streams ran one after the other";
}

TEST_P(stream_test, HostFunctionRunsInStreamOrder) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(1);
  auto h = dev().alloc_host<std::uint32_t>(1);
  (void)s.fill(d, 5);
  (void)s.copy(h, d);
  std::uint32_t seen = 0;
  s.host_func([&] { seen = h[0]; }).wait();
  EXPECT_EQ(seen, 0x05050505u);
}

}  // namespace
}  // namespace cora::test
