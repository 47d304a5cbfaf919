// The completion engine: where waiters resume, which ops get markers, cancellation, errors,
// shutdown, and many coroutines at once.
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstdlib>
#include <future>
#include <random>
#include <thread>

#include "core/state.hpp"
#include "cora/cora.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

using namespace std::chrono_literals;

// Scales the stress test down where it runs under sanitizers.
int stress_scale() {
  const char* s = std::getenv("CORA_STRESS_SCALE");
  return s ? std::max(1, std::atoi(s)) : 100;
}

class engine_test : public device_test {
 protected:
  std::uint64_t markers() { return dev().state()->backend->markers_recorded(); }
};
CORA_DEVICE_SUITE(engine_test);

TEST_P(engine_test, ResumesOnTheWaitersExecutor) {
  asio::io_context a, b;
  auto s = dev().make_stream();
  auto flag = dev().alloc<std::uint32_t>(1);
  std::atomic<int> checks{0};
  auto body = [&](asio::io_context& own) -> task<void> {
    for (int i = 0; i < 20; ++i) {
      co_await s.launch(kernels().kernel("slow"), {}, std::uint64_t{200}, flag);
      if (own.get_executor().running_in_this_thread()) ++checks;
    }
  };
  spawn(a, body(a), asio::detached);
  spawn(b, body(b), asio::detached);
  std::thread tb([&] { b.run(); });
  a.run();
  tb.join();
  EXPECT_EQ(checks.load(), 40);
}

TEST_P(engine_test, ResumesInsideAStrand) {
  asio::io_context ctx;
  auto strand = asio::make_strand(ctx);
  auto s = dev().make_stream();
  bool in_strand = false;
  auto body = [&]() -> task<void> {  // named: the coroutine refers to the lambda's captures
    co_await s.synchronize();
    co_await s.launch(kernels().kernel("empty"), {});
    in_strand = strand.running_in_this_thread();
  };
  spawn(strand, body(), asio::detached);
  std::thread t2([&] { ctx.run(); });
  ctx.run();
  t2.join();
  EXPECT_TRUE(in_strand);
}

TEST_P(engine_test, AwaitingAnOpDoesNotWaitForLaterOps) {
  auto s = dev().make_stream();
  auto flag = dev().alloc<std::uint32_t>(1);
  auto t = [&]() -> task<bool> {
    auto first = s.launch(kernels().kernel("empty"), {});
    auto second = s.launch(kernels().kernel("slow"), {}, std::uint64_t{500000}, flag);
    co_await first;
    const bool second_running = !second.ready();
    co_await second;
    co_return second_running;
  };
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(sync_wait(t()));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 400ms);
}

TEST_P(engine_test, AnOpNobodyAwaitsCreatesNoMarker) {
  auto s = dev().make_stream();
  auto k = kernels().kernel("empty");
  s.synchronize().wait();
  const auto before = markers();
  for (int i = 0; i < 100; ++i) s.launch(k, {});  // pendings dropped at once
  EXPECT_EQ(markers(), before);
  s.synchronize().wait();  // the one wait: one marker
  EXPECT_EQ(markers(), before + 1);
}

TEST_P(engine_test, OneMarkerServesEveryWaiterAtOrBeforeIt) {
  auto s = dev().make_stream();
  auto k = kernels().kernel("empty");
  s.synchronize().wait();
  const auto before = markers();
  auto t = [&]() -> task<void> {
    auto p = s.launch(k, {});
    co_await when_all([](pending<void> q) -> task<void> { co_await q; }(std::move(p)),
                      [&]() -> task<void> { co_await s.synchronize(); }());
  };
  sync_wait(t());
  EXPECT_EQ(markers(), before + 1);
}

TEST_P(engine_test, TimerBeatsASlowKernelAndTheKernelStillFinishes) {
  using namespace asio::experimental::awaitable_operators;
  asio::io_context ctx;
  auto s = dev().make_stream();
  auto flag = dev().alloc<std::uint32_t>(1);
  s.fill(flag, 0).wait();
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(ctx, 10ms);
        auto slow = s.launch(kernels().kernel("slow"), {}, std::uint64_t{500000}, flag);
        auto r = co_await (slow.async_wait(asio::use_awaitable) || timer.async_wait(asio::use_awaitable));
        // The first to complete wins: the timer, long before the kernel (no timed assertion:
        // sanitizer builds on a loaded machine are slow).
        EXPECT_EQ(r.index(), 1u) << "the timer should win";
      },
      asio::detached);
  ctx.run();
  // The kernel runs on and completes; its output is right.
  std::uint32_t h = 0;
  s.copy(&h, flag.data(), 4).wait();
  EXPECT_EQ(h, 1u);
}

TEST_P(engine_test, CancelledWaitCompletesWithOperationAborted) {
  asio::io_context ctx;
  asio::cancellation_signal sig;
  auto s = dev().make_stream();
  auto flag = dev().alloc<std::uint32_t>(1);
  std::error_code got;
  s.launch(kernels().kernel("slow"), {}, std::uint64_t{300000}, flag)
      .async_wait(asio::bind_cancellation_slot(
          sig.slot(), asio::bind_executor(ctx, [&](std::error_code ec) { got = ec; })));
  asio::steady_timer t(ctx, 5ms);
  t.async_wait([&](std::error_code) { sig.emit(asio::cancellation_type::terminal); });
  const auto t0 = std::chrono::steady_clock::now();
  ctx.run();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 150ms);
  EXPECT_EQ(got, asio::error::operation_aborted);
  s.synchronize().wait();
}

TEST_P(engine_test, FaultReachesEveryWaiterOfTheStreamOnly) {
  CORA_SKIP_FAULTS_ON_GPU();
  asio::io_context ctx;
  auto s = dev().make_stream(), other = dev().make_stream();
  auto flags = dev().alloc<std::uint32_t>(4);
  std::atomic<int> faults{0}, fine{0};
  auto waiter = [&](pending<void> p) -> task<void> {
    try {
      co_await p;
      ++fine;
    } catch (const error& e) {
      if (e.code() == make_error_code(errc::kernel_fault)) ++faults;
    }
  };
  auto trap = s.launch(kernels().kernel("trap"), {}, flags);
  auto later = s.fill(flags, 0);
  auto other_op = other.launch(kernels().kernel("empty"), {});
  spawn(ctx, waiter(std::move(trap)), asio::detached);
  spawn(ctx, waiter(std::move(later)), asio::detached);
  spawn(ctx, waiter(std::move(other_op)), asio::detached);
  ctx.run();
  EXPECT_EQ(faults.load(), 2);
  EXPECT_EQ(fine.load(), 1);
}

TEST(engine, ShutdownCompletesPendingWaitsWithOperationAborted) {
  with_watchdog(30s, [] {
    asio::io_context ctx;
    std::atomic<int> aborted{0};
    {
      runtime_options o;
      o.use_environment = false;
      o.backend = backend_selection::cpu;
      auto rt = std::make_unique<runtime>(o);
      auto& dev = rt->device(0);
      auto bin = dev.load_binary(kernel_file("test_kernels.corabin")).wait();
      auto s = dev.make_stream();
      auto flag = dev.alloc<std::uint32_t>(1);
      for (int i = 0; i < 4; ++i)
        s.launch(bin.kernel("slow"), {}, std::uint64_t{200000}, flag)
            .async_wait(asio::bind_executor(ctx, [&](std::error_code ec) {
              if (ec == asio::error::operation_aborted) ++aborted;
            }));
      ctx.poll();
      rt.reset();  // waits pending
    }
    ctx.run();
    EXPECT_EQ(aborted.load(), 4);
  });
}

TEST_P(engine_test, EveryPolicyCompletesWaits) {
  for (auto policy : {completion_policy::spin, completion_policy::hybrid, completion_policy::blocking,
                      completion_policy::callback}) {
    runtime_options o;
    o.use_environment = false;
    o.backend = GetParam() == backend::cpu ? backend_selection::cpu : backend_selection::cuda;
    o.completion = policy;
    runtime rt(o);
    auto& d = rt.device(0);
    auto bin = d.load_binary(kernel_file("test_kernels.corabin")).wait();
    auto s = d.make_stream();
    auto flag = d.alloc<std::uint32_t>(1);
    auto t = [&]() -> task<int> {
      int n = 0;
      for (int i = 0; i < 20; ++i, ++n) co_await s.launch(bin.kernel("slow"), {}, static_cast<std::uint64_t>(i % 2 ? 2000 : 10), flag);
      co_return n;
    };
    EXPECT_EQ(sync_wait(t()), 20) << to_string(policy);
    s.launch(bin.kernel("empty"), {}).wait();
  }
}

TEST_P(engine_test, StressManyCoroutinesManyStreams) {
  const int coroutines = 10 * stress_scale();  // 1000 by default
  const int ops = stress_scale();               // 100 each
  with_watchdog(600s, [&] {
    asio::io_context ctx;
    std::vector<stream> streams;
    for (int i = 0; i < 16; ++i) streams.push_back(dev().make_stream());
    auto add = kernels().kernel("add_f32");
    auto empty = kernels().kernel("empty");
    std::atomic<long> done{0}, checked{0}, failed{0};
    auto worker = [&](int id) -> task<void> {
      std::mt19937 rng(static_cast<unsigned>(id));
      auto x = dev().alloc<float>(64), z = dev().alloc<float>(64);
      auto h = dev().alloc_host<float>(64);
      for (int i = 0; i < ops; ++i) {
        stream& s = streams[rng() % streams.size()];
        try {
          switch (rng() % 4) {
            case 0: {  // copy in, add, copy out, check
              const float v = static_cast<float>(rng() % 1000);
              for (auto& e : h) e = v;
              s.copy(x, h);
              s.launch(add, {.grid = 2}, x, x, z, std::uint64_t{64});
              co_await s.copy(h, z);
              if (h[0] == 2 * v && h[63] == 2 * v) ++checked; else ++failed;
              break;
            }
            case 1: co_await s.launch(empty, {}); break;
            case 2: co_await s.fill(x, 0); break;
            default: {
              auto p = s.launch(empty, {});  // awaited later, with another op in between
              auto q = s.fill(z, 1);
              co_await p;
              co_await q;  // z is used next on another stream: the fill must be done by then
            }
          }
          ++done;
        } catch (const std::exception& e) {
          ++failed;
          ADD_FAILURE() << e.what();
        }
      }
    };
    for (int c = 0; c < coroutines; ++c) spawn(ctx, worker(c), asio::detached);
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) threads.emplace_back([&] { ctx.run(); });
    ctx.run();
    for (auto& t : threads) t.join();
    EXPECT_EQ(done.load(), static_cast<long>(coroutines) * ops);
    EXPECT_EQ(failed.load(), 0);
    EXPECT_GT(checked.load(), 0);
  });
}

// The hybrid policy sleeps until an op is expected to end, learning durations per stream. A
// long op must not teach it to sleep that long for the short ops that follow (each would
// then take as long as the long one to be seen complete).
TEST_P(engine_test, LongOpDoesNotDelayLaterShortOpsOnTheEngineThread) {
  auto s = dev().make_stream();
  s.host_func([] { std::this_thread::sleep_for(300ms); }).wait();
  std::chrono::steady_clock::duration worst{};
  for (int i = 0; i < 12; ++i) {
    std::promise<void> done;
    const auto t0 = std::chrono::steady_clock::now();
    // No executor: the engine thread detects completion and runs the handler.
    s.host_func([] { std::this_thread::sleep_for(2ms); }).async_wait([&](std::error_code) { done.set_value(); });
    done.get_future().wait();
    if (i >= 6) worst = std::max(worst, std::chrono::steady_clock::now() - t0);
  }
  EXPECT_LT(worst, 50ms) << "short ops are detected as late as the long op before them";
}

// A cancellation emitted on the waiter's strand while the op's completion is detected on
// another thread (a poll step on a plain executor of the same context): the wait ends once,
// either way, and nothing is touched after it is freed. (The op used to be freed on the
// detecting thread while the strand's emit was still calling into it.)
TEST_P(engine_test, CancellationRacingCompletionOnAnotherThread) {
  const int rounds = 200 * stress_scale();  // 20000 by default
  with_watchdog(300s, [&] {
    asio::io_context ctx;
    auto s = dev().make_stream();
    auto empty = kernels().kernel("empty");
    std::atomic<int> done{0}, aborted{0};
    auto racer = [&]() -> asio::awaitable<void> {
      auto ex = co_await asio::this_coro::executor;
      for (int i = 0; i < rounds; ++i) {
        auto sig = std::make_shared<asio::cancellation_signal>();
        auto p = s.launch(empty, {});
        asio::steady_timer t(ex, std::chrono::microseconds(i % 30));
        t.async_wait([sig](std::error_code ec) {
          if (!ec) sig->emit(asio::cancellation_type::terminal);
        });
        auto [ec] = co_await p.async_wait(asio::bind_cancellation_slot(
            sig->slot(), asio::experimental::as_tuple(asio::use_awaitable)));
        if (ec == asio::error::operation_aborted) ++aborted;
        else EXPECT_FALSE(ec) << ec.message();
        ++done;
      }
    };
    // The first wait of the context is on its plain executor, so its poll steps run there, on
    // any thread; the racer then runs on a strand.
    asio::co_spawn(ctx, [&]() -> asio::awaitable<void> {
      co_await s.launch(empty, {}).async_wait(asio::use_awaitable);
      asio::co_spawn(asio::make_strand(ctx), racer(), asio::detached);
    }, asio::detached);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) threads.emplace_back([&] { ctx.run(); });
    ctx.run();
    for (auto& t : threads) t.join();
    EXPECT_EQ(done.load(), rounds);
    s.synchronize().wait();
  });
}

}  // namespace
}  // namespace cora::test
