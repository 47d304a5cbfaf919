// The CPU cost of waiting: K waiters each awaiting kernels that run 1 ms on the device, one
// after another. Reports CPU-seconds per wall-second of the whole process (getrusage, every
// thread: the driver's and cora's engine included) and how late the waiter learns of
// completion (round trip minus the kernel's duration; launch latency included).
// Raw: K threads busy-polling an event, or blocking in cuEventSynchronize on a blocking-sync
// event; on the CPU device, a plain worker thread runs the job while the waiter spins on a
// flag or blocks on a future. cora: K coroutines on one io_context thread, per policy.
//
// Settings: CORA_BENCH_WAIT_ROUNDS (per waiter, default 100), CORA_BENCH_KERNEL_US (1000).
#include <asio/io_context.hpp>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include <cora/cora.hpp>

#include "bench_support.hpp"
#if defined(CORA_HAS_CUDA)
#include "raw_cuda.hpp"
#endif

namespace {

using clk = std::chrono::steady_clock;
namespace cb = cora::bench;

constexpr int warm_rounds = 10;

std::uint64_t kernel_us() { return static_cast<std::uint64_t>(cb::env_long("CORA_BENCH_KERNEL_US", 1000)); }
int rounds() { return static_cast<int>(cb::env_long("CORA_BENCH_WAIT_ROUNDS", 100)); }

/// CPU and wall time from construction; and the waits' lateness.
struct meter {
  void start() {
    cpu0 = cb::process_cpu_seconds();
    t0 = clk::now();
  }
  void stop() {
    wall = cb::seconds_since(t0);
    cpu = cb::process_cpu_seconds() - cpu0;
  }
  void late(clk::duration round_trip) {
    std::lock_guard lock(m);
    lat.add_us(std::chrono::duration<double, std::micro>(round_trip).count() - static_cast<double>(kernel_us()));
  }
  void report(benchmark::State& state, const std::string& label) {
    state.counters["cpu_s_per_s"] = cpu / wall;
    state.counters["late_p50_us"] = lat.at(0.5);
    state.counters["late_p99_us"] = lat.at(0.99);
    state.SetLabel(label);
  }
  double cpu0 = 0, cpu = 0, wall = 0;
  clk::time_point t0;
  std::mutex m;
  cb::latencies lat;
};

/// Runs `waiter(i, rounds, meter*)` on K threads, metering after a warm-up round each.
template <class F>
void metered(benchmark::State& state, int k, const std::string& label, F waiter) {
  for (auto _ : state) {
    meter mt;
    cb::on_threads(k, [&](int i) { waiter(i, warm_rounds, nullptr); });
    mt.start();
    cb::on_threads(k, [&](int i) { waiter(i, rounds(), &mt); });
    mt.stop();
    mt.report(state, label);
  }
}

// --- raw, CPU device: a worker thread runs the 1 ms job ----------------------------------

void busy_for(std::uint64_t us) {
  const auto end = clk::now() + std::chrono::microseconds(us);
  while (clk::now() < end) {
  }
}

void raw_cpu(benchmark::State& state, int k, bool spin) {
  metered(state, k, spin ? "worker thread, waiter spins on a flag" : "worker thread, waiter blocks on a future",
             [spin](int, int n, meter* mt) {
               for (int r = 0; r < n; ++r) {
                 const auto t0 = clk::now();
                 if (spin) {
                   std::atomic<bool> done{false};
                   std::thread w([&] {
                     busy_for(kernel_us());
                     done.store(true, std::memory_order_release);
                   });
                   while (!done.load(std::memory_order_acquire)) {
                   }
                   if (mt) mt->late(clk::now() - t0);
                   w.join();
                 } else {
                   auto f = std::async(std::launch::async, [] { busy_for(kernel_us()); });
                   f.wait();
                   if (mt) mt->late(clk::now() - t0);
                 }
               }
             });
}

#if defined(CORA_HAS_CUDA)
// --- raw, CUDA driver --------------------------------------------------------------------

void raw_cuda_wait(benchmark::State& state, std::size_t ordinal, int k, bool spin) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  const CUfunction slow = r.function("slow");
  // Each waiter's stream, event and flag, made before anything is metered.
  std::vector<CUstream> streams(static_cast<std::size_t>(k));
  std::vector<CUevent> events(streams.size());
  std::vector<CUdeviceptr> flags(streams.size());
  for (std::size_t i = 0; i < streams.size(); ++i) {
    streams[i] = r.make_stream();
    events[i] = r.make_event(CU_EVENT_DISABLE_TIMING | (spin ? 0u : unsigned{CU_EVENT_BLOCKING_SYNC}));
    flags[i] = r.alloc(sizeof(std::uint32_t));
  }
  metered(state, k, spin ? "busy cuEventQuery" : "blocking-sync event, cuEventSynchronize", [&](int w, int n, meter* mt) {
    r.bind();
    const auto i = static_cast<std::size_t>(w);
    std::uint64_t us = kernel_us();
    CUdeviceptr flag = flags[i];
    auto p = cb::params(us, flag);
    for (int round = 0; round < n; ++round) {
      const auto t0 = clk::now();
      cb::check(r.api().cuLaunchKernel(slow, 1, 1, 1, 1, 1, 1, 0, streams[i], p.data(), nullptr), "cuLaunchKernel");
      cb::check(r.api().cuEventRecord(events[i], streams[i]), "cuEventRecord");
      if (spin)
        r.spin(events[i]);
      else
        cb::check(r.api().cuEventSynchronize(events[i]), "cuEventSynchronize");
      if (mt) mt->late(clk::now() - t0);
    }
  });
  for (std::size_t i = 0; i < streams.size(); ++i) {
    r.api().cuMemFree(flags[i]);
    r.api().cuEventDestroy(events[i]);
    r.api().cuStreamDestroy(streams[i]);
  }
}
#endif

// --- cora: K coroutines on one io_context thread ------------------------------------------

cora::task<void> waiter(cora::stream& s, cora::kernel k, std::uint32_t* flag, int n, meter* mt) {
  for (int i = 0; i < n; ++i) {
    const auto t0 = clk::now();
    co_await s.launch(k, {}, kernel_us(), flag);
    if (mt) mt->late(clk::now() - t0);
  }
}

void cora_wait(benchmark::State& state, std::size_t index, int k, cora::completion_policy policy) {
  auto& dev = cb::shared_runtime(policy).device(index);
  const auto slow = cb::test_kernels(policy, index).kernel("slow");
  std::vector<cora::stream> streams;
  for (int i = 0; i < k; ++i) streams.push_back(dev.make_stream());
  auto flags = dev.alloc<std::uint32_t>(static_cast<std::size_t>(k));
  auto run = [&](int n, meter* mt) {
    asio::io_context ctx(1);
    for (std::size_t i = 0; i < streams.size(); ++i)
      cora::spawn(ctx, waiter(streams[i], slow, flags.data() + i, n, mt), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
    ctx.run();
  };
  for (auto _ : state) {
    run(warm_rounds, nullptr);
    meter mt;
    mt.start();
    run(rounds(), &mt);
    mt.stop();
    mt.report(state, std::string("co_await, ") + cora::to_string(policy));
  }
}

const bool registered = cb::at_start([] {
  for (const auto& d : cb::devices()) {
    for (int k : {1, 8}) {
      const std::string base = "wait_cost/" + d.tag + "/K:" + std::to_string(k) + "/";
#if defined(CORA_HAS_CUDA)
      if (d.backend == cora::backend_kind::cuda) {
        cb::register_once(base + "raw_spin", raw_cuda_wait, d.ordinal, k, true);
        cb::register_once(base + "raw_blocking_sync", raw_cuda_wait, d.ordinal, k, false);
      }
#endif
      if (d.backend == cora::backend_kind::cpu) {
        cb::register_once(base + "raw_spin", raw_cpu, k, true);
        cb::register_once(base + "raw_blocking_sync", raw_cpu, k, false);
      }
      for (auto p : {cora::completion_policy::spin, cora::completion_policy::hybrid, cora::completion_policy::blocking,
                     cora::completion_policy::callback})
        cb::register_once(base + "cora/" + cora::to_string(p), cora_wait, d.index, k, p);
    }
  }
});

}  // namespace
