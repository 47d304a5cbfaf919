// Round trip of one empty launch awaited with co_await, against the round trip of an
// asio::post on the same machine, in the same run.
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <thread>

#include <cora/cora.hpp>

#include "bench_support.hpp"

namespace {

using clk = std::chrono::steady_clock;

struct fixture {
  fixture(cora::completion_policy p) {
    cora::runtime_options o;
    o.completion = p;
    rt = std::make_unique<cora::runtime>(o);
    bin = rt->default_device().load_binary(CORA_BENCH_KERNELS_DIR "/test_kernels.corabin").wait();
  }
  std::unique_ptr<cora::runtime> rt;
  cora::binary bin;
};

void co_await_empty_launch(benchmark::State& state, cora::completion_policy policy) {
  fixture f(policy);
  auto& dev = f.rt->default_device();
  auto s = dev.make_stream();
  auto k = f.bin.kernel("empty");
  cora::bench::latencies lat;
  auto body = [&]() -> cora::task<void> {
    for (auto _ : state) {
      const auto t0 = clk::now();
      co_await s.launch(k, {});
      lat.add(clk::now() - t0);
    }
  };
  cora::sync_wait(body());
  lat.report(state);
  state.SetLabel(dev.name());
}

// The same thread posts to its own io_context and resumes: the cheapest executor hop.
void asio_post_self(benchmark::State& state) {
  asio::io_context ctx(1);
  cora::bench::latencies lat;
  auto body = [&]() -> cora::task<void> {
    auto ex = co_await cora::this_executor();
    for (auto _ : state) {
      const auto t0 = clk::now();
      co_await asio::post(ex, cora::use_task);
      lat.add(clk::now() - t0);
    }
  };
  cora::spawn(ctx, body(), [](std::exception_ptr) {});
  ctx.run();
  lat.report(state);
}

// A post to another thread's io_context and back: a cross-thread round trip.
void asio_post_ping_pong(benchmark::State& state) {
  asio::io_context here(1), there(1);
  auto work = asio::make_work_guard(there);
  std::thread t([&] { there.run(); });
  cora::bench::latencies lat;
  auto body = [&]() -> cora::task<void> {
    auto ex = co_await cora::this_executor();
    for (auto _ : state) {
      const auto t0 = clk::now();
      co_await asio::post(there.get_executor(), cora::use_task);
      co_await asio::post(ex, cora::use_task);
      lat.add(clk::now() - t0);
    }
  };
  cora::spawn(here, body(), [](std::exception_ptr) {});
  here.run();
  work.reset();
  t.join();
  lat.report(state);
}

BENCHMARK_CAPTURE(co_await_empty_launch, spin, cora::completion_policy::spin)->Name("roundtrip/cora_co_await/spin")->UseRealTime();
BENCHMARK_CAPTURE(co_await_empty_launch, hybrid, cora::completion_policy::hybrid)->Name("roundtrip/cora_co_await/hybrid")->UseRealTime();
BENCHMARK_CAPTURE(co_await_empty_launch, blocking, cora::completion_policy::blocking)->Name("roundtrip/cora_co_await/blocking")->UseRealTime();
BENCHMARK(asio_post_self)->Name("roundtrip/raw_asio_post_self")->UseRealTime();
BENCHMARK(asio_post_ping_pong)->Name("roundtrip/raw_asio_post_ping_pong")->UseRealTime();

const bool registered = [] {
  for (const char* p : {"spin", "hybrid", "blocking"}) {
    cora::bench::compare(std::string("roundtrip/cora_co_await/") + p + "/real_time", "roundtrip/raw_asio_post_ping_pong/real_time");
  }
  return true;
}();

}  // namespace
