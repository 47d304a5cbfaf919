#include "cora/task.hpp"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_future.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <atomic>
#include <future>
#include <stdexcept>

#include "cora/spawn.hpp"
#include "cora/sync_wait.hpp"
#include "cora/use_task.hpp"
#include "cora/when_all.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

task<int> value(int v) { co_return v; }

task<int> add(int a, int b) {
  const int x = co_await value(a);
  const int y = co_await value(b);
  co_return x + y;
}

task<void> thrower() {
  throw std::runtime_error("boom");
  co_return;
}

TEST(task, IsLazy) {
  bool started = false;
  auto make = [&]() -> task<void> {
    started = true;
    co_return;
  };
  auto t = make();
  EXPECT_FALSE(started);
  sync_wait(std::move(t));
  EXPECT_TRUE(started);
}

TEST(task, ReturnsValuesThroughAwaits) { EXPECT_EQ(sync_wait(add(2, 40)), 42); }

TEST(task, ExceptionsPropagateToTheAwaiter) {
  auto outer = []() -> task<std::string> {
    try {
      co_await thrower();
    } catch (const std::runtime_error& e) {
      co_return std::string(e.what());
    }
    co_return std::string("no exception");
  };
  EXPECT_EQ(sync_wait(outer()), "boom");
  EXPECT_THROW(sync_wait(thrower()), std::runtime_error);
}

task<int> count_down(int n) {
  int total = 0;
  for (int i = 0; i < n; ++i) total += co_await value(1);
  co_return total;
}

TEST(task, LongSynchronousChainsDoNotGrowTheStack) {
  // A million synchronously completing awaits: symmetric transfer keeps the stack flat.
  EXPECT_EQ(sync_wait(count_down(1000000)), 1000000);
}

TEST(task, InheritsTheAwaitersExecutor) {
  asio::io_context ctx;
  auto child = []() -> task<bool> {
    auto ex = co_await this_executor();
    co_return static_cast<bool>(ex);
  };
  auto parent = [&]() -> task<bool> { co_return co_await child(); };
  std::future<bool> f = spawn(ctx, parent(), asio::use_future);
  ctx.run();
  EXPECT_TRUE(f.get());
}

TEST(task, SpawnReportsExceptionsThroughTheToken) {
  asio::io_context ctx;
  std::exception_ptr got;
  spawn(ctx, thrower(), [&](std::exception_ptr e) { got = e; });
  ctx.run();
  ASSERT_TRUE(got);
  EXPECT_THROW(std::rethrow_exception(got), std::runtime_error);
}

TEST(task, SpawnRunsOnTheGivenExecutor) {
  asio::thread_pool pool(2);
  std::promise<bool> on_pool;
  auto t = [&]() -> task<void> {
    on_pool.set_value(pool.get_executor().running_in_this_thread());
    co_return;
  };
  spawn(pool, t(), [](std::exception_ptr) {});
  EXPECT_TRUE(on_pool.get_future().get());
  pool.join();
}

TEST(task, WhenAllRunsConcurrentlyAndKeepsOrder) {
  auto t = []() -> task<std::tuple<int, std::monostate, int>> {
    co_return co_await when_all(value(1), []() -> task<void> { co_return; }(), add(2, 3));
  };
  auto [a, b, c] = sync_wait(t());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(c, 5);
  (void)b;
}

TEST(task, WhenAllOfAVectorRethrowsAfterAllFinished) {
  std::atomic<int> finished{0};
  auto ok = [&]() -> task<int> {
    ++finished;
    co_return 1;
  };
  auto bad = [&]() -> task<int> {
    ++finished;
    throw std::runtime_error("one failed");
    co_return 0;
  };
  auto run = [&]() -> task<void> {
    std::vector<task<int>> ts;
    ts.push_back(ok());
    ts.push_back(bad());
    ts.push_back(ok());
    co_await when_all(std::move(ts));
  };
  EXPECT_THROW(sync_wait(run()), std::runtime_error);
  EXPECT_EQ(finished.load(), 3);
}

TEST(task, AwaitsAsioOperationsWithUseTask) {
  auto t = []() -> task<int> {
    auto ex = co_await this_executor();
    asio::steady_timer timer(ex, std::chrono::milliseconds(5));
    const auto t0 = std::chrono::steady_clock::now();
    co_await timer.async_wait(use_task);
    co_return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - t0).count());
  };
  EXPECT_GE(sync_wait(t()), 4);
}

TEST(task, UseTaskThrowsAsioErrors) {
  auto t = []() -> task<void> {
    auto ex = co_await this_executor();
    asio::steady_timer timer(ex, std::chrono::hours(1));
    asio::steady_timer canceller(ex, std::chrono::milliseconds(1));
    canceller.async_wait([&](std::error_code) { timer.cancel(); });
    co_await timer.async_wait(use_task);
  };
  try {
    sync_wait(t());
    FAIL();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), asio::error::operation_aborted);
  }
}


// ---------------------------------------------------------------------------------------------
// Cancellation end to end (DESIGN section 4, rule 9).

class task_device_test : public device_test {
 protected:
  /// An op that completes when `gate` is opened.
  pending<void> gated(stream& s, std::shared_future<void> gate) {
    return s.host_func([gate] { gate.wait(); });
  }
};
CORA_DEVICE_SUITE(task_device_test);

TEST_P(task_device_test, SpawnForwardsItsTokensCancellationSlot) {
  asio::io_context ctx;
  auto s = dev().make_stream();
  std::promise<void> open;
  auto gate = open.get_future().share();
  asio::cancellation_signal sig;
  std::error_code seen;
  bool handler_ran = false;
  auto body = [&]() -> task<int> {
    try {
      co_await gated(s, gate);
    } catch (const error& e) {
      seen = e.code();
    }
    co_return 3;
  };
  spawn(ctx, body(), asio::bind_cancellation_slot(sig.slot(), [&](std::exception_ptr e, int v) {
          EXPECT_FALSE(e);
          EXPECT_EQ(v, 3);
          handler_ran = true;
        }));
  ctx.poll();  // started, suspended on the gated op
  EXPECT_FALSE(handler_ran);
  sig.emit(asio::cancellation_type::terminal);
  ctx.run();
  EXPECT_TRUE(handler_ran);
  EXPECT_EQ(seen, asio::error::operation_aborted);
  open.set_value();
  s.synchronize().wait();
}

TEST(task, CancellationReachesUseTaskOperationsOfNestedTasks) {
  asio::io_context ctx;
  asio::cancellation_signal sig;
  std::error_code seen;
  auto inner = []() -> task<void> {
    asio::steady_timer timer(co_await this_executor(), std::chrono::hours(1));
    co_await timer.async_wait(use_task);
  };
  auto outer = [&]() -> task<void> {
    try {
      co_await inner();
    } catch (const std::system_error& e) {
      seen = e.code();
    }
  };
  bool done = false;
  spawn(ctx, outer(), asio::bind_cancellation_slot(sig.slot(), [&](std::exception_ptr) { done = true; }));
  ctx.poll();
  EXPECT_FALSE(done);
  sig.emit(asio::cancellation_type::terminal);
  ctx.run();
  EXPECT_TRUE(done);
  EXPECT_EQ(seen, asio::error::operation_aborted);
}

TEST_P(task_device_test, WhenAllCancelsSiblingsOnTheFirstError) {
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  std::promise<void> open;
  auto gate = open.get_future().share();
  std::error_code device_sibling, timer_sibling;
  // Loaded before the gate closes: CUDA's module load waits while a host function blocks.
  const auto empty = kernels().kernel("empty");
  auto failing = [&]() -> task<void> {
    co_await other.launch(empty, {});
    throw std::runtime_error("first failure");
  };
  auto waits_on_device = [&]() -> task<void> {
    try {
      co_await gated(s, gate);
    } catch (const error& e) {
      device_sibling = e.code();
    }
  };
  auto waits_on_timer = [&]() -> task<void> {
    asio::steady_timer timer(co_await this_executor(), std::chrono::hours(1));
    try {
      co_await timer.async_wait(use_task);
    } catch (const std::system_error& e) {
      timer_sibling = e.code();
    }
  };
  EXPECT_THROW(sync_wait(when_all(waits_on_device(), failing(), waits_on_timer())), std::runtime_error);
  EXPECT_EQ(device_sibling, asio::error::operation_aborted);
  EXPECT_EQ(timer_sibling, asio::error::operation_aborted);
  open.set_value();
  s.synchronize().wait();
}

TEST(task, WhenAllForwardsTheParentsCancellation) {
  asio::io_context ctx;
  asio::cancellation_signal sig;
  int aborted = 0;
  auto sleeper = [&]() -> task<void> {
    asio::steady_timer timer(co_await this_executor(), std::chrono::hours(1));
    try {
      co_await timer.async_wait(use_task);
    } catch (const std::system_error& e) {
      if (e.code() == asio::error::operation_aborted) ++aborted;
    }
  };
  auto parent = [&]() -> task<void> {
    std::vector<task<void>> v;
    for (int i = 0; i < 3; ++i) v.push_back(sleeper());
    co_await when_all(std::move(v));
  };
  bool done = false;
  spawn(ctx, parent(), asio::bind_cancellation_slot(sig.slot(), [&](std::exception_ptr) { done = true; }));
  ctx.poll();
  sig.emit(asio::cancellation_type::terminal);
  ctx.run();
  EXPECT_TRUE(done);
  EXPECT_EQ(aborted, 3);
}

}  // namespace
}  // namespace cora::test
