// Engine scaling: W waits pending at once over S streams (W/S empty launches per stream, each
// awaited by its own coroutine), all held back by one gate kernel that runs G us (the other
// streams wait on an event recorded after it). Reports the host cost of enqueuing, the CPU
// the process burns per wall-second while everything is pending (the polling cost), and the
// resumption latency of each wait: when its coroutine ran, less the gate's nominal end (launch
// time + G). Raw: one thread records an event after every launch and polls the oldest pending
// event of each stream in turn. cora: one io_context thread, policies spin and hybrid.
//
// Settings: CORA_BENCH_WAITS (10000 on a GPU, 2000 on the CPU device), CORA_BENCH_GATE_US
// (20000).
#include <asio/io_context.hpp>

#include <thread>

#include <cora/cora.hpp>

#include "bench_support.hpp"
#if defined(CORA_HAS_CUDA)
#include "raw_cuda.hpp"
#endif

namespace {

using clk = std::chrono::steady_clock;
namespace cb = cora::bench;

std::size_t waits(bool gpu) { return static_cast<std::size_t>(cb::env_long("CORA_BENCH_WAITS", gpu ? 10000 : 2000)); }
std::uint64_t gate_us() { return static_cast<std::uint64_t>(cb::env_long("CORA_BENCH_GATE_US", 20000)); }

/// What one run measured.
struct run_result {
  double enqueue_us_per_op = 0;
  double pending_cpu_s_per_s = 0;
  cb::latencies resume;
  double drain_ms = 0;  // first resumption to last
  void report(benchmark::State& state) {
    state.counters["enqueue_us"] = enqueue_us_per_op;
    state.counters["pending_cpu_s_per_s"] = pending_cpu_s_per_s;
    state.counters["drain_ms"] = drain_ms;
    resume.report(state, "resume_");
  }
  /// From the gate's launch time, the end of enqueuing and each wait's completion time.
  void finish(clk::time_point gate_launch, clk::time_point enqueued, double cpu_at_enqueued,
              std::vector<clk::time_point>& done, double cpu_at_first) {
    const auto first = *std::min_element(done.begin(), done.end());
    const auto last = *std::max_element(done.begin(), done.end());
    const double pending_wall = std::chrono::duration<double>(first - enqueued).count();
    pending_cpu_s_per_s = pending_wall > 0 ? (cpu_at_first - cpu_at_enqueued) / pending_wall : 0;
    drain_ms = std::chrono::duration<double, std::milli>(last - first).count();
    const auto gate_end = gate_launch + std::chrono::microseconds(gate_us());
    for (auto t : done) resume.add(t - gate_end);
  }
};

#if defined(CORA_HAS_CUDA)
void raw_gpu(benchmark::State& state, std::size_t ordinal, std::size_t streams) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  auto& a = r.api();
  const std::size_t w = waits(true), per = std::max<std::size_t>(1, w / streams);
  const CUfunction slow = r.function("slow"), empty = r.function("empty");
  CUstream gate = r.make_stream();
  CUevent gate_done = r.make_event();
  CUdeviceptr flag = r.alloc(4);
  std::vector<CUstream> ss(streams);
  for (auto& s : ss) s = r.make_stream();
  std::vector<CUevent> events(streams * per);
  for (auto& e : events) e = r.make_event();
  for (auto _ : state) {
    run_result out;
    std::uint64_t us = gate_us();
    auto p = cb::params(us, flag);
    const auto t_gate = clk::now();
    cb::check(a.cuLaunchKernel(slow, 1, 1, 1, 1, 1, 1, 0, gate, p.data(), nullptr), "cuLaunchKernel");
    cb::check(a.cuEventRecord(gate_done, gate), "cuEventRecord");
    for (std::size_t s = 0; s < streams; ++s) {
      cb::check(a.cuStreamWaitEvent(ss[s], gate_done, 0), "cuStreamWaitEvent");
      for (std::size_t i = 0; i < per; ++i) {
        cb::check(a.cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, ss[s], nullptr, nullptr), "cuLaunchKernel");
        cb::check(a.cuEventRecord(events[s * per + i], ss[s]), "cuEventRecord");
      }
    }
    const auto enqueued = clk::now();
    const double cpu_enqueued = cb::process_cpu_seconds();
    out.enqueue_us_per_op = std::chrono::duration<double, std::micro>(enqueued - t_gate).count() / static_cast<double>(streams * per);
    std::vector<std::size_t> next(streams, 0);
    std::vector<clk::time_point> done;
    done.reserve(w);
    double cpu_first = 0;
    while (done.size() < streams * per) {
      for (std::size_t s = 0; s < streams; ++s) {
        while (next[s] < per) {
          const CUresult q = a.cuEventQuery(events[s * per + next[s]]);
          if (q == CUDA_ERROR_NOT_READY) break;
          cb::check(q, "cuEventQuery");
          if (done.empty()) cpu_first = cb::process_cpu_seconds();
          done.push_back(clk::now());
          ++next[s];
        }
      }
    }
    out.finish(t_gate, enqueued, cpu_enqueued, done, cpu_first);
    out.report(state);
  }
  state.SetLabel("one thread polls events");
  for (auto e : events) a.cuEventDestroy(e);
  for (auto s : ss) a.cuStreamDestroy(s);
  a.cuEventDestroy(gate_done);
  a.cuStreamDestroy(gate);
  a.cuMemFree(flag);
}
#endif

// --- raw on the CPU device: a thread per stream sleeps through the gate, then runs its ops --

void raw_cpu(benchmark::State& state, std::size_t streams) {
  const std::size_t w = waits(false), per = std::max<std::size_t>(1, w / streams);
  for (auto _ : state) {
    run_result out;
    std::vector<clk::time_point> done(streams * per);
    const auto t_gate = clk::now();
    const auto gate_end = t_gate + std::chrono::microseconds(gate_us());
    std::vector<std::thread> ts;
    for (std::size_t s = 0; s < streams; ++s)
      ts.emplace_back([&, s] {
        std::this_thread::sleep_until(gate_end);
        for (std::size_t i = 0; i < per; ++i) done[s * per + i] = clk::now();
      });
    const auto enqueued = clk::now();
    const double cpu_enqueued = cb::process_cpu_seconds();
    std::this_thread::sleep_until(gate_end);
    const double cpu_first = cb::process_cpu_seconds();
    for (auto& t : ts) t.join();
    out.enqueue_us_per_op = std::chrono::duration<double, std::micro>(enqueued - t_gate).count() / static_cast<double>(streams * per);
    out.finish(t_gate, enqueued, cpu_enqueued, done, cpu_first);
    out.report(state);
  }
  state.SetLabel("a plain thread per stream");
}

// --- cora ----------------------------------------------------------------------------------

struct shared_run {
  std::vector<clk::time_point> done;
  double cpu_first = -1;
};

cora::task<void> await_one(cora::pending<void> p, shared_run& r, std::size_t i) {
  co_await p;
  if (r.cpu_first < 0) r.cpu_first = cb::process_cpu_seconds();
  r.done[i] = clk::now();
}

void cora_scaling(benchmark::State& state, std::size_t index, std::size_t streams, cora::completion_policy policy) {
  auto& dev = cb::shared_runtime(policy).device(index);
  const bool gpu = dev.backend() == cora::backend_kind::cuda;
  const auto& bin = cb::test_kernels(policy, index);
  const auto slow = bin.kernel("slow"), empty = bin.kernel("empty");
  const std::size_t w = waits(gpu), per = std::max<std::size_t>(1, w / streams);
  auto gate = dev.make_stream();
  auto gate_done = dev.make_event();
  auto flag = dev.alloc<std::uint32_t>(1);
  std::vector<cora::stream> ss;
  for (std::size_t s = 0; s < streams; ++s) ss.push_back(dev.make_stream());
  for (auto _ : state) {
    run_result out;
    shared_run r;
    r.done.resize(streams * per);
    asio::io_context ctx(1);
    const auto t_gate = clk::now();
    (void)gate.launch(slow, {}, gate_us(), flag.data());
    (void)gate.record(gate_done);
    for (std::size_t s = 0; s < streams; ++s) {
      (void)ss[s].wait(gate_done);
      for (std::size_t i = 0; i < per; ++i)
        cora::spawn(ctx, await_one(ss[s].launch(empty, {}), r, s * per + i), [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
    }
    const auto enqueued = clk::now();
    const double cpu_enqueued = cb::process_cpu_seconds();
    ctx.run();
    out.enqueue_us_per_op = std::chrono::duration<double, std::micro>(enqueued - t_gate).count() / static_cast<double>(streams * per);
    out.finish(t_gate, enqueued, cpu_enqueued, r.done, r.cpu_first);
    out.report(state);
  }
  state.SetLabel(std::string("co_await, ") + cora::to_string(policy));
}

const bool registered = cb::at_start([] {
  for (const auto& d : cb::devices()) {
    for (std::size_t s : {1, 10, 100, 1000}) {
      const std::string base = "engine_scaling/" + d.tag + "/S:" + std::to_string(s) + "/";
#if defined(CORA_HAS_CUDA)
      if (d.backend == cora::backend_kind::cuda) cb::register_once(base + "raw", raw_gpu, d.ordinal, s);
#endif
      if (d.backend == cora::backend_kind::cpu) cb::register_once(base + "raw", raw_cpu, s);
      for (auto p : {cora::completion_policy::spin, cora::completion_policy::hybrid})
        cb::register_once(base + "cora/" + cora::to_string(p), cora_scaling, d.index, s, p);
    }
  }
});

}  // namespace
