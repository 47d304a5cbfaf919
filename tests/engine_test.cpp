// The completion engine: where waiters resume, which ops get markers, cancellation, errors,
// shutdown, and many coroutines at once.
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <coroutine>
#include <cstdlib>
#include <future>
#include <latch>
#include <optional>
#include <random>
#include <thread>

#include "backend/backend.hpp"
#include "core/engine.hpp"
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

  /// A device whose streams ring doorbells: the fixture's on the CPU device; on CUDA, one of
  /// a runtime of its own (kept in `own`) with counter markers, since auto markers may record
  /// events, which ring none.
  device& ringing_device(std::unique_ptr<runtime>& own) {
    if (GetParam() != backend::cuda) return dev();
    const char* before = std::getenv("CORA_CUDA_MARKER");
    const std::string saved = before ? before : "";
    ::setenv("CORA_CUDA_MARKER", "counter", 1);
    runtime_options o;
    o.use_environment = false;
    o.backend = backend_selection::cuda;
    own = std::make_unique<runtime>(o);
    if (before)
      ::setenv("CORA_CUDA_MARKER", saved.c_str(), 1);
    else
      ::unsetenv("CORA_CUDA_MARKER");
    return own->device(0);
  }
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
  for (int i = 0; i < 100; ++i) (void)s.launch(k, {});  // pendings dropped at once
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
              (void)s.copy(x, h);
              (void)s.launch(add, {.grid = 2}, x, x, z, std::uint64_t{64});
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


// ---------------------------------------------------------------------------------------------
// Ownership of waits (DESIGN section 4, rule 8) and where executor-less completions run.

/// An op that completes when the test opens the gate: a host function waiting for it.
struct gate {
  std::promise<void> open_;
  std::shared_future<void> opened = open_.get_future().share();
  pending<void> hold(stream& s) {
    return s.host_func([f = opened] { f.wait(); });
  }
  void open() { open_.set_value(); }
};

/// A coroutine type with no executor and no owner: whoever holds it may destroy the frame.
struct bare_coroutine {
  struct promise_type {
    bare_coroutine get_return_object() {
      return {std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
  std::coroutine_handle<promise_type> h;
};

// Defect: destroying a frame suspended in `co_await pending` left its awaiter registered, and
// the completion then resumed freed memory.
TEST_P(engine_test, DestroyingASuspendedFrameWithdrawsItsWait) {
  auto s = dev().make_stream();
  gate g;
  auto& inline_group = detail::engine::get().inline_group();
  const std::size_t before = inline_group.pending();
  bool resumed = false;
  auto body = [&]() -> bare_coroutine {
    co_await g.hold(s);
    resumed = true;
  };
  bare_coroutine c = body();
  ASSERT_FALSE(c.h.done());
  EXPECT_EQ(inline_group.pending(), before + 1);
  c.h.destroy();
  EXPECT_EQ(inline_group.pending(), before) << "the destroyed frame's wait is still armed";
  g.open();
  s.synchronize().wait();
  EXPECT_FALSE(resumed);
}

// Defect: destroying an io_context while a cora::task was suspended on a cora op never
// destroyed the task's frame (a bare handle was posted and dropped), leaking what it held.
TEST_P(engine_test, DestroyingTheContextDestroysASuspendedTask) {
  auto s = dev().make_stream();
  gate g;
  auto alive = std::make_shared<int>(0);
  std::weak_ptr<int> watch = alive;
  {
    asio::io_context ctx;
    auto body = [](stream& st, pending<void> p, std::shared_ptr<int> held) -> task<void> {
      (void)held;
      co_await p;
      (void)st.synchronize();
    };
    spawn(ctx, body(s, g.hold(s), std::move(alive)), asio::detached);
    ctx.poll();  // the task starts and suspends on the gated op
    EXPECT_FALSE(watch.expired());
  }
  EXPECT_TRUE(watch.expired()) << "the task's frame outlived its io_context";
  g.open();
  s.synchronize().wait();
}

// The same with the task awaited by a parent task and inside when_all: the whole tree goes.
TEST_P(engine_test, DestroyingTheContextDestroysNestedAndWhenAllTasks) {
  auto s = dev().make_stream();
  gate g;
  auto alive = std::make_shared<int>(0);
  std::weak_ptr<int> watch = alive;
  {
    asio::io_context ctx;
    auto leaf = [](pending<void> p, std::shared_ptr<int> held) -> task<int> {
      (void)held;
      co_await p;
      co_return 1;
    };
    auto root = [leaf](pending<void> a, pending<void> b, std::shared_ptr<int> held) -> task<void> {
      auto [x, y] = co_await when_all(leaf(std::move(a), held), leaf(std::move(b), held));
      ADD_FAILURE() << "resumed after its context was destroyed: " << x + y;
    };
    auto pa = g.hold(s);
    auto pb = s.launch(kernels().kernel("empty"), {});
    spawn(ctx, root(std::move(pa), std::move(pb), std::move(alive)), asio::detached);
    for (int i = 0; i < 3; ++i) ctx.poll();
    EXPECT_FALSE(watch.expired());
  }
  EXPECT_TRUE(watch.expired()) << "a frame of the tree outlived its io_context";
  g.open();
  s.synchronize().wait();
}

std::thread::id handler_thread_id() {
  std::promise<std::thread::id> id;
  asio::post(handler_executor(), [&] { id.set_value(std::this_thread::get_id()); });
  return id.get_future().get();
}

// Defect: a wait without an executor ran on whichever thread detected the completion, for
// example a user thread blocked in an unrelated wait() on the same stream.
TEST_P(engine_test, ExecutorlessWaitNeverRunsOnAThreadBlockedInWait) {
  with_watchdog(60s, [&] {
    // The handler thread exists before any blocked thread does: a thread started later could
    // reuse a finished thread's id.
    const auto handler_id = handler_thread_id();
    auto s = dev().make_stream();
    for (int round = 0; round < 3; ++round) {
      gate g;
      std::promise<std::thread::id> ran_on;
      g.hold(s).async_wait([&](std::error_code) { ran_on.set_value(std::this_thread::get_id()); });
      auto later = s.launch(kernels().kernel("empty"), {});
      std::thread::id blocked_id;
      std::thread blocked([&] {
        blocked_id = std::this_thread::get_id();
        later.wait();
      });
      g.open();
      blocked.join();
      const auto id = ran_on.get_future().get();
      EXPECT_NE(id, blocked_id) << "round " << round;
      EXPECT_EQ(id, handler_id) << "round " << round;
    }
  });
}

// Defect: a handler without an executor that blocked in device.synchronize().wait() hung the
// one thread that detected completions for everyone.
TEST_P(engine_test, ExecutorlessHandlerMayBlockInDeviceSynchronize) {
  with_watchdog(60s, [&] {
    auto s = dev().make_stream();
    auto other = dev().make_stream();
    std::promise<std::error_code> done;
    s.launch(kernels().kernel("empty"), {}).async_wait([&](std::error_code) {
      (void)other.launch(kernels().kernel("empty"), {});
      std::error_code ec;
      dev().synchronize().wait(ec);
      done.set_value(ec);
    });
    EXPECT_FALSE(done.get_future().get());
  });
}

// Issue 18 item 6: sync_wait inside an executor-less handler works.
TEST_P(engine_test, SyncWaitInsideAnExecutorlessHandler) {
  with_watchdog(60s, [&] {
    auto s = dev().make_stream();
    auto other = dev().make_stream();
    std::promise<int> done;
    s.launch(kernels().kernel("empty"), {}).async_wait([&](std::error_code) {
      auto t = [&]() -> task<int> {
        co_await other.launch(kernels().kernel("empty"), {});
        co_await other.synchronize();
        co_return 7;
      };
      done.set_value(sync_wait(t()));
    });
    EXPECT_EQ(done.get_future().get(), 7);
  });
}

// Issue 18 item 6: a handler that blocks stalls no parked wait of anyone else (user handlers
// never run on the thread that detects completions for everyone).
TEST_P(engine_test, BlockingHandlerDoesNotStallOtherWaits) {
  with_watchdog(60s, [&] {
    auto s = dev().make_stream();
    auto other = dev().make_stream();
    std::promise<void> release, entered;
    s.launch(kernels().kernel("empty"), {}).async_wait([&](std::error_code) {
      entered.set_value();
      release.get_future().wait();  // blocks until the other waits have completed
    });
    entered.get_future().wait();
    asio::io_context ctx;
    int completed = 0;
    auto flag = dev().alloc<std::uint32_t>(1);
    auto body = [&]() -> task<void> {
      for (int i = 0; i < 5; ++i) {
        // Long enough to be parked with the engine thread under the hybrid policy.
        co_await other.launch(kernels().kernel("slow"), {}, std::uint64_t{3000}, flag);
        ++completed;
      }
    };
    spawn(ctx, body(), asio::detached);
    ctx.run();
    EXPECT_EQ(completed, 5);
    release.set_value();
    s.synchronize().wait();
  });
}

// Issue 18 item 6: a host function that waits for its own stream fails at once.
TEST_P(engine_test, HostFunctionWaitingForItsOwnStreamFails) {
  with_watchdog(60s, [&] {
    auto s = dev().make_stream();
    std::error_code own, device_wide;
    std::string what;
    s.host_func([&] {
       try {
         s.synchronize().wait();
       } catch (const error& e) {
         own = e.code();
         what = e.what();
       }
       dev().synchronize().wait(device_wide);
     }).wait();
    EXPECT_EQ(own, std::errc::resource_deadlock_would_occur);
    EXPECT_NE(what.find("host function"), std::string::npos) << what;
    EXPECT_EQ(device_wide, std::errc::resource_deadlock_would_occur);
  });
}

// Rule 10: each thread that waits on a context gets a lane of its own, polled by a chain of
// its own, so detection is not one chain per context.
TEST_P(engine_test, WaitsArmedOnDifferentThreadsArePolledInLanesOfTheirOwn) {
  with_watchdog(60s, [&] {
    asio::io_context ctx;
    auto work = asio::make_work_guard(ctx);
    auto& group = detail::executor_group::of(ctx.get_executor());
    auto s = dev().make_stream();
    gate g;
    auto held = g.hold(s);
    std::atomic<int> done{0};
    auto arm = [&] {
      for (int i = 0; i < 2; ++i)
        s.launch(kernels().kernel("empty"), {}).async_wait(asio::bind_executor(ctx, [&](std::error_code ec) {
          EXPECT_FALSE(ec);
          if (++done == 4) work.reset();
        }));
    };
    // Both threads live until both armed (a finished thread's id may be given to the next).
    std::latch armed(3);
    auto arm_and_stay = [&] {
      arm();
      armed.arrive_and_wait();
    };
    std::thread a(arm_and_stay), b(arm_and_stay);
    armed.arrive_and_wait();
    a.join();
    b.join();
    EXPECT_EQ(group.lanes(), 2u) << "two threads' waits share a lane";
    EXPECT_EQ(group.pending(), 4u);
    g.open();
    ctx.run();
    EXPECT_EQ(done.load(), 4);
    EXPECT_EQ(group.pending(), 0u);
  });
}

// Rule 10: a poll of a stream whose doorbell has not moved reads it and takes no lock (on a
// doorbell that a fault may keep still, at most once per recheck period).
TEST_P(engine_test, PollsOfAStreamWhoseDoorbellStandsStillTakeNoLock) {
  std::unique_ptr<runtime> own;
  device* d = &ringing_device(own);
  with_watchdog(60s, [&] {
    auto s = d->make_stream();
    detail::stream_state* st = s.state();
    const ::cora::backend::doorbell bell = st->backend->bell();
    ASSERT_NE(bell.word, nullptr) << "both backends' streams have doorbells";
    asio::io_context ctx;  // not run until the bell has been polled: nobody else polls the stream
    auto work = asio::make_work_guard(ctx);
    gate g;
    bool fired = false;
    g.hold(s).async_wait(asio::bind_executor(ctx, [&](std::error_code ec) {
      fired = !ec;
      work.reset();
    }));
    ASSERT_TRUE(st->watching_doorbell());
    const std::uint64_t before = st->locked_polls();
    const auto start = std::chrono::steady_clock::now();
    std::vector<detail::wait_node*> nodes;
    for (int i = 0; i < 1000; ++i) EXPECT_FALSE(st->poll(nodes));
    const auto elapsed = std::chrono::steady_clock::now() - start;
    const std::uint64_t locked = st->locked_polls() - before;
    const std::uint64_t allowed =
        bell.recheck.count() == 0 ? 0 : 1 + static_cast<std::uint64_t>(elapsed / bell.recheck);
    EXPECT_LE(locked, allowed) << "of 1000 polls while the op ran";
    EXPECT_TRUE(nodes.empty());
    g.open();
    ctx.run();  // the bell rings: a poll takes the lock and fires the waiter
    EXPECT_TRUE(fired);
    EXPECT_GT(st->locked_polls(), before + locked);
  });
}

// The hybrid policy sleeps until an op is expected to end, learnt from the ops before it. Ops
// found done together in one poll teach only through the first: the ones after it ended at
// some unknown time before the poll. Taking each of them as just as long as the gap since the
// one before (about nothing) made the next 1 ms kernel expected at once, and the waits after
// it spin, then poll in growing steps and learn of the end late.
TEST_P(engine_test, OpsFoundDoneInOnePollTeachTheirDurationOnce) {
  std::unique_ptr<runtime> own;
  device& d = ringing_device(own);
  with_watchdog(60s, [&] {
    auto s = d.make_stream();
    detail::stream_state* st = s.state();
    const ::cora::backend::doorbell bell = st->backend->bell();
    ASSERT_NE(bell.word, nullptr);
    const auto held_for = 20ms;
    gate g;
    auto first = g.hold(s);
    st->mark(st->last_position());
    auto second = s.host_func([] {});
    const std::uint64_t last = st->last_position();
    st->mark(last);
    std::this_thread::sleep_for(held_for);  // the first op lasts at least this long
    g.open();
    // Both done before anyone polls: the doorbell (read without polling) reaches the second.
    while (static_cast<std::int32_t>(__atomic_load_n(bell.word, __ATOMIC_ACQUIRE) - static_cast<std::uint32_t>(last)) < 0)
      std::this_thread::yield();
    std::vector<detail::wait_node*> nodes;
    st->poll(nodes);
    ASSERT_EQ(st->completed_position(), last) << "one poll found both ops done";
    // The next op is expected to take about as long as the first.
    gate g2;
    auto third = g2.hold(s);
    st->mark(st->last_position());
    st->poll(nodes);
    const auto expected = st->expected_ready();
    ASSERT_NE(expected, std::chrono::steady_clock::time_point::max()) << "the estimate was lost";
    EXPECT_GT(expected - std::chrono::steady_clock::now(), held_for / 2)
        << "the op found done right after another taught its duration";
    g2.open();
    third.wait();
    first.wait();
    second.wait();
  });
}

// A wait armed on a context whose shutdown already withdrew its waits (another thread arming
// while the context is destroyed) ends at once instead of staying in a lane that is about to go.
TEST_P(engine_test, AWaitArmedAfterItsContextShutDownEndsAtOnce) {
  struct closable_context : asio::io_context {
    using asio::io_context::shutdown;
  };
  with_watchdog(60s, [&] {
    auto s = dev().make_stream();
    gate g;
    auto held = g.hold(s);
    std::optional<closable_context> ctx(std::in_place);
    auto& group = detail::executor_group::of(ctx->get_executor());
    auto token = std::make_shared<int>(0);
    s.launch(kernels().kernel("empty"), {}).async_wait(asio::bind_executor(*ctx, [token](std::error_code) {}));
    EXPECT_EQ(group.pending(), 1u);
    ctx->shutdown();  // as ~io_context does first: the wait is withdrawn, its handler dropped
    EXPECT_EQ(group.pending(), 0u);
    EXPECT_EQ(token.use_count(), 1) << "the withdrawn wait's handler is still held";
    s.launch(kernels().kernel("empty"), {}).async_wait(asio::bind_executor(*ctx, [token](std::error_code) {}));
    EXPECT_EQ(group.pending(), 0u) << "a wait was left in a lane of a context that is going";
    ctx.reset();  // its queue, with the aborted completion in it, goes with it
    EXPECT_EQ(token.use_count(), 1);
    g.open();
    s.synchronize().wait();
  });
}

// A blocking wait moves the completed position without firing anyone; a waiter at that
// position must then fire although the doorbell still shows a later op running.
TEST_P(engine_test, AWaiterABlockingWaitOvertookFiresWhileLaterOpsRun) {
  with_watchdog(60s, [&] {
    auto s = dev().make_stream();
    asio::io_context ctx;
    auto work = asio::make_work_guard(ctx);
    gate first, second;
    auto a = first.hold(s);
    auto sync_a = s.synchronize();
    auto b = second.hold(s);
    auto c = s.host_func([] {});  // b is still held: it gets a marker of its own
    bool fired = false;
    a.async_wait(asio::bind_executor(ctx, [&](std::error_code ec) {
      fired = !ec;
      work.reset();
    }));
    first.open();
    sync_a.wait();  // completes a's position on this thread, and fires nobody
    ctx.run();
    EXPECT_TRUE(fired);
    EXPECT_FALSE(b.ready()) << "the later op was let through";
    second.open();
    c.wait();
  });
}

// Defect: ~runtime resumed executor-less waiters inline on the destroying thread, and waited
// up to 10 s per device for device work.
TEST(engine, RuntimeDestructionNeitherBlocksNorRunsHandlersInline) {
  with_watchdog(60s, [] {
    runtime_options o;
    o.use_environment = false;
    o.backend = backend_selection::cpu;
    o.cpu_compute_units = 2;
    auto rt = std::make_unique<runtime>(o);
    auto s = rt->device(0).make_stream();
    gate g;
    std::promise<void> started;
    auto held = s.host_func([&started, f = g.opened] {
      started.set_value();
      f.wait();
    });
    started.get_future().wait();  // running on a worker: the runtime cannot stop it
    auto queued = s.launch(rt->device(0).load_binary(kernel_file("test_kernels.corabin")).wait().kernel("empty"), {});
    std::promise<std::pair<std::error_code, std::thread::id>> got;
    queued.async_wait([&](std::error_code ec) { got.set_value({ec, std::this_thread::get_id()}); });
    rt.reset();  // the host function still holds a worker: this must not wait for it
    auto [ec, id] = got.get_future().get();
    EXPECT_EQ(ec, asio::error::operation_aborted);
    EXPECT_NE(id, std::this_thread::get_id());
    g.open();
    std::error_code held_ec;
    held.wait(held_ec);
    EXPECT_FALSE(held_ec) << "the host function that ran completes with its result";
    std::error_code queued_ec;
    queued.wait(queued_ec);
    EXPECT_EQ(queued_ec, errc::runtime_shut_down);
  });
}

// The ownership rules under stress: 1000 tasks (at scale 100) on several io_contexts, each
// cancelled, destroyed with its context, or left to complete, with the runtime destroyed at a
// random point of some rounds. Every frame must end resumed or destroyed (none leaks: the
// guards all go), and nothing may touch freed memory (ASan, TSan in scripts/sanitize).
TEST(engine, StressOwnershipUnderCancellationAndDestruction) {
  const int total = 10 * stress_scale();
  const int rounds = std::max(1, total / 100);
  with_watchdog(600s, [&] {
    std::mt19937 rng(20261203);
    std::atomic<int> frames{0}, completed{0}, spawned{0};
    struct guard {
      std::atomic<int>* n;
      explicit guard(std::atomic<int>* c) : n(c) { ++*n; }
      guard(const guard&) = delete;
      ~guard() { --*n; }
    };
    for (int round = 0; round < rounds; ++round) {
      runtime_options o;
      o.use_environment = false;
      o.backend = backend_selection::cpu;
      o.cpu_compute_units = 2;
      auto rt = std::make_unique<runtime>(o);
      auto& dev = rt->device(0);
      auto bin = dev.load_binary(kernel_file("test_kernels.corabin")).wait();
      const kernel empty = bin.kernel("empty"), slow = bin.kernel("slow");
      auto flag = dev.alloc<std::uint32_t>(1);
      std::vector<stream> streams;
      for (int i = 0; i < 3; ++i) streams.push_back(dev.make_stream());

      constexpr int contexts = 3;
      std::vector<std::unique_ptr<asio::io_context>> ctx;
      std::vector<std::optional<asio::executor_work_guard<asio::io_context::executor_type>>> work(contexts);
      std::vector<std::thread> threads;
      for (int c = 0; c < contexts; ++c) {
        ctx.push_back(std::make_unique<asio::io_context>(1));
        work[c].emplace(ctx[c]->get_executor());
      }
      for (int c = 0; c < contexts; ++c) threads.emplace_back([&, c] { ctx[c]->run(); });
      std::vector<std::unique_ptr<asio::cancellation_signal>> signals;

      auto body = [](stream& s, kernel e, kernel sl, device_buffer<std::uint32_t>& f, int ops,
                     std::unique_ptr<guard> g) -> task<void> {
        (void)g;
        for (int i = 0; i < ops; ++i) {
          try {
            switch (i % 3) {
              case 0: co_await s.launch(e, {}); break;
              case 1: co_await s.launch(sl, {}, std::uint64_t{30}, f); break;
              default: {
                asio::steady_timer t(co_await this_executor(), std::chrono::microseconds(50));
                co_await t.async_wait(use_task);
              }
            }
          } catch (const std::system_error& ex) {
            if (ex.code() == asio::error::operation_aborted) co_return;  // cancelled
            if (ex.code() == errc::runtime_shut_down) co_return;
          }
        }
      };

      const int per_round = total / rounds;
      const int doomed = static_cast<int>(rng() % contexts);  // destroyed mid-round
      const int doom_at = static_cast<int>(rng() % per_round);
      const int rt_at = round % 2 ? static_cast<int>(rng() % per_round) : -1;
      for (int i = 0; i < per_round; ++i) {
        if (i == rt_at) rt.reset();  // waits pending: they end with operation_aborted
        if (i == doom_at) {
          work[doomed].reset();
          ctx[doomed]->stop();
          threads[doomed].join();
          ctx[doomed].reset();  // destroys the frames suspended there
        }
        int c = static_cast<int>(rng() % contexts);
        if (!ctx[c]) c = (c + 1) % contexts;
        auto& s = streams[rng() % streams.size()];
        auto g = std::make_unique<guard>(&frames);
        signals.push_back(std::make_unique<asio::cancellation_signal>());
        ++spawned;
        spawn(*ctx[c], body(s, empty, slow, flag, 1 + static_cast<int>(rng() % 12), std::move(g)),
              asio::bind_cancellation_slot(signals.back()->slot(), [&](std::exception_ptr e) {
                EXPECT_FALSE(e);
                ++completed;
              }));
        if (rng() % 3 == 0) {
          auto* sig = signals.back().get();
          auto delay = std::chrono::microseconds(rng() % 300);
          auto t = std::make_shared<asio::steady_timer>(*ctx[c], delay);
          t->async_wait([t, sig](std::error_code ec) {
            if (!ec) sig->emit(asio::cancellation_type::terminal);
          });
        }
      }
      for (int c = 0; c < contexts; ++c) {
        if (!ctx[c]) continue;
        work[c].reset();
        threads[c].join();
        ctx[c].reset();
      }
      EXPECT_EQ(frames.load(), 0) << "round " << round << ": frames neither resumed nor destroyed";
      streams.clear();
      flag.reset();
      rt.reset();
      signals.clear();
    }
    EXPECT_EQ(spawned.load(), rounds * (total / rounds));
    EXPECT_GT(completed.load(), 0);
  });
}

}  // namespace
}  // namespace cora::test
