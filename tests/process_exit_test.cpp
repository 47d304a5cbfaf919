// What cora does when the process exits: its exit handler waits for the driver calls that its
// own threads have in flight (the CUDA side is in cuda_backend_test, "process exit").
#include <asio/post.hpp>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "core/engine.hpp"
#include "core/host_pool.hpp"
#include "core/process_exit.hpp"
#include "cora/cora.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

using std::chrono::steady_clock;

TEST(process_exit, PoolBarrierWaitsForTheTaskInFlight) {
  // A pool task that is busy (as a driver call waiting for a kernel would be) holds the
  // barrier until it ends; the barrier gives up at its deadline meanwhile.
  std::promise<void> release;
  std::atomic<bool> started{false};
  asio::post(detail::host_pool(), [&started, go = release.get_future().share()] {
    started = true;
    go.wait();
  });
  while (!started) std::this_thread::yield();
  EXPECT_FALSE(detail::pass_barrier(detail::host_pool(), detail::host_pool_threads,
                                    steady_clock::now() + std::chrono::milliseconds(50)));
  release.set_value();
  EXPECT_TRUE(detail::pass_barrier(detail::host_pool(), detail::host_pool_threads,
                                   steady_clock::now() + std::chrono::seconds(30)));
}

TEST(process_exit, PoolBarrierRunsAfterTheTasksQueuedBeforeIt) {
  std::atomic<int> done{0};
  for (int i = 0; i < 16; ++i)
    asio::post(detail::device_wait_pool(), [&done] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++done;
    });
  EXPECT_TRUE(detail::pass_barrier(detail::device_wait_pool(), detail::device_wait_pool_threads,
                                   steady_clock::now() + std::chrono::seconds(30)));
  EXPECT_EQ(done.load(), 16);
}

TEST(process_exit, EngineBarrierPassesWhileStreamsDrain) {
  // The engine thread polls a stream whose last handle was dropped with work queued; the
  // barrier returns once the thread is between passes, with the work still there or done.
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  runtime rt(o);
  auto& dev = rt.default_device();
  {
    auto s = dev.make_stream();
    auto a = dev.alloc<std::uint32_t>(1 << 16);
    for (int i = 0; i < 32; ++i) (void)s.fill(a, static_cast<std::uint8_t>(i));
  }
  EXPECT_TRUE(detail::engine::get().barrier(steady_clock::now() + std::chrono::seconds(30)));
}

[[noreturn]] void cpu_exit_scenario() {
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  runtime rt(o);
  auto& dev = rt.default_device();
  auto s = dev.make_stream();
  auto a = dev.alloc<std::uint32_t>(64);
  const bool drained = detail::begin_process_exit();
  // Only driver calls stop: the CPU device goes on working while statics are destroyed.
  std::error_code ec;
  s.fill(a, 1).wait(ec);
  std::fprintf(stderr, "drained %d, fill %s\n", drained ? 1 : 0, ec ? ec.message().c_str() : "ok");
  std::fflush(stderr);
  std::_Exit(drained && !ec ? 0 : 1);
}

TEST(process_exit, TheExitHandlerLeavesTheCpuDeviceWorking) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(cpu_exit_scenario(), ::testing::ExitedWithCode(0), "drained 1, fill ok");
}

}  // namespace
}  // namespace cora::test
