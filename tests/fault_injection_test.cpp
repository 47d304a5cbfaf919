// Faults injected into the CPU device (backend::cpu::fault_injection): each completes every
// waiter with its own error and leaves the other streams, and for local faults the device,
// usable.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "core/state.hpp"
#include "cora/cora.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

using namespace std::chrono_literals;

class fault_injection_test : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_options o;
    o.use_environment = false;
    o.backend = backend_selection::cpu;
    o.cpu_devices = 2;
    o.cpu_compute_units = 4;  // a stuck kernel holds one worker; the others keep running
    o.cpu_memory = std::size_t{1} << 30;
    rt_ = std::make_unique<runtime>(o);
    kernels_ = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  }
  void TearDown() override {
    kernels_ = {};
    rt_.reset();
  }
  cora::device& dev(std::size_t i = 0) { return rt_->device(i); }
  ::cora::backend::cpu::cpu_device& cpu(std::size_t i = 0) {
    return dynamic_cast<::cora::backend::cpu::cpu_device&>(*dev(i).state()->backend);
  }
  ::cora::backend::cpu::fault_injection& faults() { return cpu().faults(); }

  // Fills `d` with `value` on stream `s` and reads it back: the stream and device still work.
  void expect_works(cora::stream& s, device_buffer<std::uint32_t>& d, std::uint8_t value) {
    auto h = dev().alloc_host<std::uint32_t>(d.size());
    (void)s.fill(d, value);
    s.copy(h, d).wait();
    const std::uint32_t want = 0x01010101u * value;
    for (std::size_t i = 0; i < d.size(); ++i) ASSERT_EQ(h[i], want) << i;
  }

  std::unique_ptr<runtime> rt_;
  cora::binary kernels_;
};

// A coroutine waiter on `p` that stores the error it completed with.
asio::awaitable<void> await_into(pending<void> p, std::error_code& out, std::atomic<int>& done) {
  auto [ec] = co_await p.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  out = ec;
  done.fetch_add(1);
}

TEST_F(fault_injection_test, KernelTrapFailsItsWaitersOnly) {
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(64);
  faults().kernel_traps = 1;
  auto launch = s.launch(kernels_.kernel("iota_u32"), {.grid = 4}, d, std::uint64_t{64});
  auto after = s.fill(d, 0);
  // Three waiters at once: the launch, a later op of its stream, and a synchronize.
  asio::io_context ctx;
  std::vector<std::error_code> got(3);
  std::atomic<int> done{0};
  asio::co_spawn(ctx, await_into(std::move(launch), got[0], done), asio::detached);
  asio::co_spawn(ctx, await_into(std::move(after), got[1], done), asio::detached);
  asio::co_spawn(ctx, await_into(s.synchronize(), got[2], done), asio::detached);
  with_watchdog(30s, [&] { ctx.run(); });
  EXPECT_EQ(done.load(), 3);
  for (auto& ec : got) EXPECT_EQ(ec, make_error_code(errc::kernel_fault));
  EXPECT_EQ(faults().kernel_traps.load(), 0u);
  expect_works(other, d, 3);
  expect_works(s, d, 4);  // the synchronize above reported it: the stream goes on
  s.launch(kernels_.kernel("iota_u32"), {.grid = 4}, d, std::uint64_t{64}).wait();
}

TEST_F(fault_injection_test, AllocationFailureIsOutOfMemoryAndPasses) {
  faults().alloc_failures = 2;
  std::error_code ec;
  EXPECT_EQ(dev().malloc(256, ec), nullptr);
  EXPECT_EQ(ec, make_error_code(errc::out_of_memory));
  EXPECT_CORA_ERROR(dev().alloc<std::uint32_t>(64), errc::out_of_memory);
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(64);
  expect_works(s, d, 5);
}

TEST_F(fault_injection_test, CopyFaultWritesNothingAndFailsItsWaiters) {
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(64);
  auto h = dev().alloc_host<std::uint32_t>(64);
  s.fill(d, 1).wait();
  std::fill(h.begin(), h.end(), 0xabcdu);
  faults().copy_faults = 1;
  auto copy = s.copy(d, h);
  auto back = s.copy(h, d);
  EXPECT_CORA_ERROR(copy.wait(), errc::copy_fault);
  EXPECT_CORA_ERROR(back.wait(), errc::copy_fault);
  std::error_code ec;
  s.synchronize().wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::copy_fault));
  // The faulting copy wrote nothing; the copy after it still ran, in stream order.
  EXPECT_EQ(h[0], 0x01010101u);
  expect_works(other, d, 6);
  expect_works(s, d, 7);
}

TEST_F(fault_injection_test, StuckKernelTimesOutAndOtherStreamsRunMeanwhile) {
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(64);
  faults().stuck_kernels = 1;
  auto stuck = s.launch(kernels_.kernel("iota_u32"), {.grid = 1, .timeout = 50ms}, d,
                        std::uint64_t{64});
  auto queued = s.fill(d, 0);
  // The other stream completes while the stuck kernel holds its worker.
  auto d2 = dev().alloc<std::uint32_t>(64);
  with_watchdog(30s, [&] { expect_works(other, d2, 8); });
  with_watchdog(30s, [&] {
    EXPECT_CORA_ERROR(stuck.wait(), errc::kernel_timeout);
    EXPECT_CORA_ERROR(queued.wait(), errc::kernel_timeout);
  });
  std::error_code ec;
  s.synchronize().wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::kernel_timeout));
  expect_works(s, d, 9);
}

TEST_F(fault_injection_test, DeviceLostCompletesEveryWaiterAndSparesOtherDevices) {
  auto d = dev().alloc<std::uint32_t>(64);
  std::vector<cora::stream> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(dev().make_stream());
  // A stuck kernel with no timeout: only the loss ends it.
  faults().stuck_kernels = 1;
  std::vector<pending<void>> waits;
  waits.push_back(
      streams[0].launch(kernels_.kernel("iota_u32"), {.grid = 1}, d, std::uint64_t{64}));
  waits.push_back(streams[0].fill(d, 1));
  cora::event ev = dev().make_event();
  (void)streams[0].record(ev);
  waits.push_back(streams[1].wait(ev));  // blocked behind the stuck kernel
  waits.push_back(streams[1].fill(d, 2));
  // A real kernel, 10 s per block: the loss stops it at its next checkpoint.
  auto flags = dev().alloc<std::uint32_t>(4);
  waits.push_back(streams[2].launch(kernels_.kernel("slow"), {.grid = 2},
                                    std::uint64_t{10'000'000}, flags));
  // Every pending op and a synchronize of each stream, all waited for at once.
  asio::io_context ctx;
  std::vector<std::error_code> got(waits.size() + streams.size());
  std::atomic<int> done{0};
  for (std::size_t i = 0; i < waits.size(); ++i)
    asio::co_spawn(ctx, await_into(std::move(waits[i]), got[i], done), asio::detached);
  for (std::size_t i = 0; i < streams.size(); ++i)
    asio::co_spawn(ctx, await_into(streams[i].synchronize(), got[waits.size() + i], done),
                   asio::detached);
  std::thread loser([&] {
    std::this_thread::sleep_for(20ms);  // let the waits start; the outcome does not depend on it
    cpu().declare_lost();
  });
  with_watchdog(30s, [&] { ctx.run(); });
  loser.join();
  EXPECT_EQ(done.load(), static_cast<int>(got.size()));
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], make_error_code(errc::device_lost)) << "waiter " << i;
  // Nothing works on the lost device any more, and says so.
  EXPECT_CORA_ERROR(streams[2].fill(d, 3).wait(), errc::device_lost);
  EXPECT_CORA_ERROR(dev().alloc<std::uint32_t>(4), errc::device_lost);
  EXPECT_CORA_ERROR(dev().make_stream(), errc::device_lost);
  EXPECT_CORA_ERROR(dev().load_binary(kernel_file("test_kernels.corabin")).wait(),
                    errc::device_lost);
  // The other device of the runtime is untouched.
  auto s1 = dev(1).make_stream();
  auto d1 = dev(1).alloc<std::uint32_t>(64);
  auto h1 = dev(1).alloc_host<std::uint32_t>(64);
  (void)s1.fill(d1, 9);
  s1.copy(h1, d1).wait();
  EXPECT_EQ(h1[63], 0x09090909u);
}

}  // namespace
}  // namespace cora::test
