// Round trip of one empty launch awaited, per device and completion policy: `co_await` in a
// cora::task (sync_wait's thread polls) and `async_wait(asio::use_awaitable)` in an
// asio::awaitable on an io_context run by one thread, against the raw driver in the same run
// (launch + event record + busy cuEventQuery; launch + cuStreamSynchronize; launch +
// cuLaunchHostFunc setting a flag the host spins on) and, on any machine, the cost of an Asio
// post to the same thread and to another thread and back. p50 and p99 per row. On a GPU, the
// `paired` rows run the raw event round trip and cora's `co_await` alternately in one loop
// (paired_empty_launch): the goals read those.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <thread>

#include <cora/cora.hpp>

#include "bench_support.hpp"
#if defined(CORA_HAS_CUDA)
#include "raw_cuda.hpp"
#endif

namespace {

using clk = std::chrono::steady_clock;
namespace cb = cora::bench;

const cora::completion_policy policies[] = {cora::completion_policy::spin, cora::completion_policy::hybrid,
                                             cora::completion_policy::blocking, cora::completion_policy::callback};

void co_await_empty_launch(benchmark::State& state, std::size_t index, cora::completion_policy policy) {
  auto& dev = cb::shared_runtime(policy).device(index);
  auto s = dev.make_stream();
  auto k = cb::test_kernels(policy, index).kernel("empty");
  cb::latencies lat;
  auto body = [](benchmark::State& st, cora::stream& str, cora::kernel& ker, cb::latencies& l) -> cora::task<void> {
    for (int i = 0; i < 200; ++i) co_await str.launch(ker, {});  // warm-up: learn durations
    for (auto _ : st) {
      const auto t0 = clk::now();
      co_await str.launch(ker, {});
      l.add(clk::now() - t0);
    }
  };
  cora::sync_wait(body(state, s, k, lat));
  lat.report(state);
  state.SetLabel(std::string("co_await, ") + cora::to_string(policy));
}

asio::awaitable<void> awaitable_loop(benchmark::State& state, cora::stream& s, cora::kernel& k, cb::latencies& lat) {
  for (int i = 0; i < 200; ++i) co_await s.launch(k, {}).async_wait(asio::use_awaitable);
  for (auto _ : state) {
    const auto t0 = clk::now();
    co_await s.launch(k, {}).async_wait(asio::use_awaitable);
    lat.add(clk::now() - t0);
  }
}

void async_wait_empty_launch(benchmark::State& state, std::size_t index, cora::completion_policy policy) {
  auto& dev = cb::shared_runtime(policy).device(index);
  auto s = dev.make_stream();
  auto k = cb::test_kernels(policy, index).kernel("empty");
  cb::latencies lat;
  asio::io_context ctx(1);
  asio::co_spawn(ctx, awaitable_loop(state, s, k, lat), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  ctx.run();
  lat.report(state);
  state.SetLabel(std::string("async_wait(use_awaitable), ") + cora::to_string(policy));
}

#if defined(CORA_HAS_CUDA)
enum class raw_wait { event_spin, stream_sync, host_func };

/// The raw side's empty-kernel round trip: its own stream and event on the primary context,
/// one launch awaited the way `how` says.
class raw_empty {
 public:
  explicit raw_empty(std::size_t ordinal) : r_(cb::raw_test_kernels(ordinal)) {
    r_.bind();
    empty_ = r_.function("empty");
    s_ = r_.make_stream();
    e_ = r_.make_event();
  }
  ~raw_empty() {
    r_.api().cuEventDestroy(e_);
    r_.api().cuStreamDestroy(s_);
  }
  raw_empty(const raw_empty&) = delete;
  raw_empty& operator=(const raw_empty&) = delete;

  void once(raw_wait how) {
    auto& a = r_.api();
    cb::check(a.cuLaunchKernel(empty_, 1, 1, 1, 1, 1, 1, 0, s_, nullptr, nullptr), "cuLaunchKernel");
    switch (how) {
      case raw_wait::event_spin:
        cb::check(a.cuEventRecord(e_, s_), "cuEventRecord");
        r_.spin(e_);
        break;
      case raw_wait::stream_sync:
        cb::check(a.cuStreamSynchronize(s_), "cuStreamSynchronize");
        break;
      case raw_wait::host_func:
        flag_.store(0, std::memory_order_relaxed);
        cb::check(a.cuLaunchHostFunc(
                      s_, [](void* f) { static_cast<std::atomic<int>*>(f)->store(1, std::memory_order_release); }, &flag_),
                  "cuLaunchHostFunc");
        while (flag_.load(std::memory_order_acquire) == 0) {
        }
        break;
    }
  }

 private:
  const cb::raw_cuda& r_;
  CUfunction empty_ = nullptr;
  CUstream s_ = nullptr;
  CUevent e_ = nullptr;
  std::atomic<int> flag_{0};
};

void raw_empty_launch(benchmark::State& state, std::size_t ordinal, raw_wait how) {
  raw_empty raw(ordinal);
  for (int i = 0; i < 200; ++i) raw.once(how);
  cb::latencies lat;
  for (auto _ : state) {
    const auto t0 = clk::now();
    raw.once(how);
    lat.add(clk::now() - t0);
  }
  lat.report(state);
  state.SetLabel(how == raw_wait::event_spin    ? "launch + event + busy cuEventQuery"
                 : how == raw_wait::stream_sync ? "launch + cuStreamSynchronize"
                                                : "launch + cuLaunchHostFunc + busy flag");
}

/// paired: the raw round trip (launch + event record + busy cuEventQuery) and cora's `co_await`
/// round trip alternately in one loop on one thread (raw first in even rounds, cora first in odd
/// ones), so that both sides meet the same machine: separate rows, run seconds apart, drift by
/// more than the goal's 5% (the thread's core, its clock, the driver's state). Counters:
/// raw_p50_us, cora_p50_us (and p99s), ratio = cora / raw of the p50s. The goals read it.
void paired_empty_launch(benchmark::State& state, std::size_t index, std::size_t ordinal,
                         cora::completion_policy policy) {
  auto& dev = cb::shared_runtime(policy).device(index);
  auto s = dev.make_stream();
  auto k = cb::test_kernels(policy, index).kernel("empty");
  raw_empty raw(ordinal);
  cb::latencies raw_lat, cora_lat;
  auto raw_once = [&](bool timed) {
    const auto t0 = clk::now();
    raw.once(raw_wait::event_spin);
    if (timed) raw_lat.add(clk::now() - t0);
  };
  auto body = [](benchmark::State& st, cora::stream& str, cora::kernel& ker, auto& raw_round, cb::latencies& l) -> cora::task<void> {
    for (int i = 0; i < 200; ++i) {  // warm-up: learn durations
      raw_round(false);
      co_await str.launch(ker, {});
    }
    std::size_t round = 0;
    for (auto _ : st) {
      const bool raw_first = round++ % 2 == 0;
      if (raw_first) raw_round(true);
      const auto t0 = clk::now();
      co_await str.launch(ker, {});
      l.add(clk::now() - t0);
      if (!raw_first) raw_round(true);
    }
  };
  cora::sync_wait(body(state, s, k, raw_once, cora_lat));
  const double rp = raw_lat.at(0.5), cp = cora_lat.at(0.5);
  raw_lat.report(state, "raw_");
  cora_lat.report(state, "cora_");
  state.counters["ratio"] = rp > 0 ? cp / rp : 0;
  state.SetLabel(std::string("co_await, ") + cora::to_string(policy) + " against launch + event + busy cuEventQuery, alternately");
}
#endif

// The same thread posts to its own io_context and resumes: the cheapest executor hop.
void asio_post_self(benchmark::State& state) {
  asio::io_context ctx(1);
  cb::latencies lat;
  auto body = [](benchmark::State& st, cb::latencies& l) -> cora::task<void> {
    auto ex = co_await cora::this_executor();
    for (auto _ : st) {
      const auto t0 = clk::now();
      co_await asio::post(ex, cora::use_task);
      l.add(clk::now() - t0);
    }
  };
  cora::spawn(ctx, body(state, lat), [](std::exception_ptr) {});
  ctx.run();
  lat.report(state);
}

// A post to another thread's io_context and back: a cross-thread round trip.
void asio_post_ping_pong(benchmark::State& state) {
  asio::io_context here(1), there(1);
  auto work = asio::make_work_guard(there);
  std::thread t([&] { there.run(); });
  cb::latencies lat;
  auto body = [](benchmark::State& st, cb::latencies& l, asio::io_context& other) -> cora::task<void> {
    auto ex = co_await cora::this_executor();
    for (auto _ : st) {
      const auto t0 = clk::now();
      co_await asio::post(other.get_executor(), cora::use_task);
      co_await asio::post(ex, cora::use_task);
      l.add(clk::now() - t0);
    }
  };
  cora::spawn(here, body(state, lat, there), [](std::exception_ptr) {});
  here.run();
  work.reset();
  t.join();
  lat.report(state);
}

BENCHMARK(asio_post_self)->Name("roundtrip/raw_asio_post_self")->UseRealTime();
BENCHMARK(asio_post_ping_pong)->Name("roundtrip/raw_asio_post_ping_pong")->UseRealTime();

const bool registered = cb::at_start([] {
  for (const auto& d : cb::devices()) {
    const std::string base = "roundtrip/" + d.tag + "/";
    std::string raw_name = "roundtrip/raw_asio_post_ping_pong/real_time";
#if defined(CORA_HAS_CUDA)
    if (d.backend == cora::backend_kind::cuda) {
      for (auto [how, n] : {std::pair{raw_wait::event_spin, "raw_event_spin"}, std::pair{raw_wait::stream_sync, "raw_stream_sync"},
                            std::pair{raw_wait::host_func, "raw_host_func"}})
        benchmark::RegisterBenchmark((base + n).c_str(), [o = d.ordinal, h = how](benchmark::State& st) {
          cb::guarded(st, [&] { raw_empty_launch(st, o, h); });
        })->UseRealTime();
      raw_name = base + "raw_event_spin/real_time";
      // The goals' rows: raw and cora alternately (paired_empty_launch).
      for (auto p : {cora::completion_policy::spin, cora::completion_policy::hybrid})
        benchmark::RegisterBenchmark((base + "paired/" + cora::to_string(p)).c_str(), [i = d.index, o = d.ordinal, p](benchmark::State& st) {
          cb::guarded(st, [&] { paired_empty_launch(st, i, o, p); });
        })->UseRealTime();
    }
#endif
    for (auto p : policies) {
      const std::string co = base + "cora_co_await/" + cora::to_string(p), aw = base + "cora_async_wait/" + cora::to_string(p);
      benchmark::RegisterBenchmark(co.c_str(), [i = d.index, p](benchmark::State& st) { cb::guarded(st, [&] { co_await_empty_launch(st, i, p); }); })
          ->UseRealTime();
      benchmark::RegisterBenchmark(aw.c_str(), [i = d.index, p](benchmark::State& st) { cb::guarded(st, [&] { async_wait_empty_launch(st, i, p); }); })
          ->UseRealTime();
      cb::compare(co + "/real_time", raw_name);
      cb::compare(aw + "/real_time", raw_name);
    }
  }
});

}  // namespace
