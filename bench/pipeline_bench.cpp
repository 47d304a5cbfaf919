// Small pipelines per second: 4 KiB host-to-device, an add kernel over 512 floats, 2 KiB back,
// awaited. Raw: a thread per request (T threads, each its own stream, blocking sync) and one
// thread polling S streams' events; on the CPU device, T plain threads doing the same copies
// and loop. cora: C coroutines on an io_context run by K threads, over a pool of streams; and
// the same with B pipelines merged into one copy, one launch and one copy back (batched).
// The coroutines use slices of four shared allocations; the `cora_own_buffers` rows give each
// one buffers of its own, as each raw thread has (for information: no goal reads them).
//
// Settings: CORA_BENCH_SECONDS (per configuration, default 0.3), CORA_BENCH_BATCH (the
// second batch size, 64; the first is 16).
#include <asio/io_context.hpp>

#include <atomic>
#include <cstring>
#include <thread>

#include <cora/cora.hpp>

#include "bench_support.hpp"
#if defined(CORA_HAS_CUDA)
#include "raw_cuda.hpp"
#endif

namespace {

using clk = std::chrono::steady_clock;
namespace cb = cora::bench;

constexpr std::size_t elements = 512;  // x and y: 4 KiB in; z: 2 KiB out
constexpr std::size_t in_bytes = 2 * elements * sizeof(float);
constexpr std::size_t out_bytes = elements * sizeof(float);

/// The measured window: the first 10 % of the run warms up and is not counted.
struct window {
  window() {
    cpu0 = cb::process_cpu_seconds();
    const double s = cb::env_double("CORA_BENCH_SECONDS", 0.3);
    start = clk::now();
    from = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(0.1 * s));
    end = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(1.1 * s));
  }
  double seconds() const { return std::chrono::duration<double>(end - from).count(); }
  clk::time_point start, from, end;
  double cpu0 = 0;  // process CPU seconds at the start
};

void report(benchmark::State& state, const window& w, std::uint64_t pipelines, const std::string& label) {
  state.counters["per_s"] = static_cast<double>(pipelines) / w.seconds();
  // CPU of the whole process (every thread, the driver's included) per wall-second of the run.
  state.counters["cpu_s_per_s"] = (cb::process_cpu_seconds() - w.cpu0) / cb::seconds_since(w.start);
  state.SetLabel(label);
}

// --- raw: plain threads on the CPU device ------------------------------------------------

void raw_cpu_threads(benchmark::State& state, int threads) {
  for (auto _ : state) {
    window w;
    std::atomic<std::uint64_t> total{0};
    cb::on_threads(threads, [&](int) {
        std::vector<float> host_in(2 * elements, 1.0f), host_out(elements), dev_in(2 * elements), dev_out(elements);
        std::uint64_t n = 0;
        for (auto now = clk::now(); now < w.end; now = clk::now()) {
          std::memcpy(dev_in.data(), host_in.data(), in_bytes);
          for (std::size_t i = 0; i < elements; ++i) dev_out[i] = dev_in[i] + dev_in[elements + i];
          std::memcpy(host_out.data(), dev_out.data(), out_bytes);
          benchmark::DoNotOptimize(host_out.data());
          if (now >= w.from) ++n;
        }
        total += n;
      });
    report(state, w, total, "plain threads");
  }
}

#if defined(CORA_HAS_CUDA)
// --- raw: the CUDA driver ------------------------------------------------------------------

struct raw_slot {
  explicit raw_slot(const cb::raw_cuda& rc) : r(rc) {
    stream = r.make_stream();
    event = r.make_event();
    host_in = static_cast<float*>(r.host_alloc(in_bytes));
    host_out = static_cast<float*>(r.host_alloc(out_bytes));
    dev_in = r.alloc(in_bytes);
    dev_out = r.alloc(out_bytes);
    for (std::size_t i = 0; i < 2 * elements; ++i) host_in[i] = 1.0f;
  }
  ~raw_slot() {
    r.api().cuStreamSynchronize(stream);
    r.api().cuEventDestroy(event);
    r.api().cuStreamDestroy(stream);
    r.api().cuMemFreeHost(host_in);
    r.api().cuMemFreeHost(host_out);
    r.api().cuMemFree(dev_in);
    r.api().cuMemFree(dev_out);
  }
  void submit(CUfunction add) {
    auto& a = r.api();
    cb::check(a.cuMemcpyAsync(dev_in, reinterpret_cast<CUdeviceptr>(host_in), in_bytes, stream), "cuMemcpyAsync");
    CUdeviceptr x = dev_in, y = dev_in + elements * sizeof(float), z = dev_out;
    std::uint64_t n = elements;
    auto p = cb::params(x, y, z, n);
    cb::check(a.cuLaunchKernel(add, 2, 1, 1, 256, 1, 1, 0, stream, p.data(), nullptr), "cuLaunchKernel");
    cb::check(a.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(host_out), dev_out, out_bytes, stream), "cuMemcpyAsync");
  }
  const cb::raw_cuda& r;
  CUstream stream = nullptr;
  CUevent event = nullptr;
  float* host_in = nullptr;
  float* host_out = nullptr;
  CUdeviceptr dev_in = 0, dev_out = 0;
};

void raw_cuda_threads(benchmark::State& state, std::size_t ordinal, int threads) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  const CUfunction add = r.function("add_f32");
  // Streams and buffers first, so that setting them up takes nothing from the window.
  std::vector<std::unique_ptr<raw_slot>> slots;
  for (int i = 0; i < threads; ++i) slots.push_back(std::make_unique<raw_slot>(r));
  for (auto _ : state) {
    window w;
    std::atomic<std::uint64_t> total{0};
    cb::on_threads(threads, [&](int i) {
      r.bind();
      raw_slot& s = *slots[static_cast<std::size_t>(i)];
      std::uint64_t n = 0;
      for (auto now = clk::now(); now < w.end; now = clk::now()) {
        s.submit(add);
        cb::check(r.api().cuStreamSynchronize(s.stream), "cuStreamSynchronize");
        if (now >= w.from) ++n;
      }
      total += n;
    });
    report(state, w, total, "thread per request, blocking sync");
  }
}

void raw_cuda_poll(benchmark::State& state, std::size_t ordinal, int streams) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  const CUfunction add = r.function("add_f32");
  for (auto _ : state) {
    std::vector<std::unique_ptr<raw_slot>> slots;
    for (int i = 0; i < streams; ++i) slots.push_back(std::make_unique<raw_slot>(r));
    window w;
    std::uint64_t n = 0;
    for (auto& s : slots) {
      s->submit(add);
      cb::check(r.api().cuEventRecord(s->event, s->stream), "cuEventRecord");
    }
    for (bool running = true; running;) {
      for (auto& s : slots) {
        const CUresult q = r.api().cuEventQuery(s->event);
        if (q == CUDA_ERROR_NOT_READY) continue;
        cb::check(q, "cuEventQuery");
        const auto now = clk::now();
        if (now >= w.end) {
          running = false;
          break;
        }
        if (now >= w.from) ++n;
        s->submit(add);
        cb::check(r.api().cuEventRecord(s->event, s->stream), "cuEventRecord");
      }
    }
    report(state, w, n, "one thread polling events");
  }
}
#endif

// --- cora ----------------------------------------------------------------------------------

/// One client's buffers, for the runs in which each client has its own (as each raw thread does).
struct client_buffers {
  cora::host_buffer<float> host_in, host_out;
  cora::device_buffer<float> dev_in, dev_out;
};

struct cora_setup {
  std::vector<cora::stream> streams;
  cora::kernel add;
  cora::launch_config cfg;
  cora::host_buffer<float> host_in, host_out;
  cora::device_buffer<float> dev_in, dev_out;
  std::vector<client_buffers> own;  // per client, when not empty; else slices of the above
  std::size_t batch = 1;
  window w;
  std::atomic<std::uint64_t> total{0};
};

// One client: submits its pipeline (or batch of them) and awaits the copy back, until the
// window ends. A free function, not a lambda: a coroutine must not refer to a lambda's
// captures, which die with the lambda object.
cora::task<void> client(cora_setup& c, std::size_t i) {
  auto& s = c.streams[i % c.streams.size()];
  const std::size_t b = c.batch, n = elements * b;
  const bool own = !c.own.empty();
  float* hin = own ? c.own[i].host_in.data() : c.host_in.data() + i * 2 * n;
  float* hout = own ? c.own[i].host_out.data() : c.host_out.data() + i * n;
  float* din = own ? c.own[i].dev_in.data() : c.dev_in.data() + i * 2 * n;
  float* dout = own ? c.own[i].dev_out.data() : c.dev_out.data() + i * n;
  std::uint64_t done = 0;
  for (auto now = clk::now(); now < c.w.end; now = clk::now()) {
    (void)s.copy(din, hin, b * in_bytes);
    (void)s.launch(c.add, c.cfg, din, din + n, dout, static_cast<std::uint64_t>(n));
    co_await s.copy(hout, dout, b * out_bytes);
    const auto t = clk::now();  // count what completes inside the window
    if (t >= c.w.from && t < c.w.end) done += b;
  }
  c.total += done;
}

// `per_thread`: one io_context per executor thread (Asio's io_context-per-core pattern), the
// coroutines dealt round-robin; else one io_context run by all `threads`. `own_buffers`: each
// client allocates its own four buffers, as each raw thread does; else the clients use slices
// of four shared allocations (every op then counts a reference on the same four records).
void cora_pipelines(benchmark::State& state, std::size_t index, int threads, int coroutines, int batch,
                    cora::completion_policy policy, bool per_thread, bool own_buffers) {
  auto& dev = cb::shared_runtime(policy).device(index);
  const bool cuda = dev.backend() == cora::backend_kind::cuda;
  const std::size_t clients = static_cast<std::size_t>(coroutines), b = static_cast<std::size_t>(batch);
  cora_setup c;
  c.add = cb::test_kernels(policy, index).kernel("add_f32");
  c.batch = b;
  for (std::size_t i = 0; i < std::min<std::size_t>(clients, 256); ++i) c.streams.push_back(dev.make_stream());
  if (own_buffers) {
    c.own.resize(clients);
    for (auto& o : c.own) {
      o.host_in = dev.alloc_host<float>(b * 2 * elements);
      o.host_out = dev.alloc_host<float>(b * elements);
      o.dev_in = dev.alloc<float>(o.host_in.size());
      o.dev_out = dev.alloc<float>(o.host_out.size());
      std::fill(o.host_in.data(), o.host_in.data() + o.host_in.size(), 1.0f);
    }
  } else {
    c.host_in = dev.alloc_host<float>(clients * b * 2 * elements);
    c.host_out = dev.alloc_host<float>(clients * b * elements);
    c.dev_in = dev.alloc<float>(c.host_in.size());
    c.dev_out = dev.alloc<float>(c.host_out.size());
    std::fill(c.host_in.data(), c.host_in.data() + c.host_in.size(), 1.0f);
  }
  const std::uint64_t n = elements * b;
  c.cfg.grid = cuda ? static_cast<std::uint32_t>((n + 255) / 256) : 1u;
  c.cfg.block = cuda ? 256u : 1u;
  for (auto _ : state) {
    std::vector<std::unique_ptr<asio::io_context>> ctx;
    for (int t = 0; t < (per_thread ? threads : 1); ++t)
      ctx.push_back(std::make_unique<asio::io_context>(per_thread ? 1 : threads));
    c.w = window{};
    c.total = 0;
    for (std::size_t i = 0; i < clients; ++i)
      cora::spawn(*ctx[i % ctx.size()], client(c, i), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
    cb::on_threads(threads, [&](int t) {
      auto& mine = *ctx[static_cast<std::size_t>(t) % ctx.size()];
      try {
        mine.run();
      } catch (...) {
        for (auto& x : ctx) x->stop();  // a client failed: end the run on every thread
        throw;
      }
    });
    report(state, c.w, c.total,
           std::string(batch > 1 ? "batched, " : "") + (per_thread ? "io_context per thread, " : "") +
               (own_buffers ? "buffers per client, " : "") + cora::to_string(policy));
  }
  for (auto& s : c.streams) s.synchronize().wait();
}

std::string name(const cb::bench_device& d, const std::string& rest) { return "pipeline/" + d.tag + "/" + rest; }

const bool registered = cb::at_start([] {
  for (const auto& d : cb::devices()) {
    for (int t : {1, 4, 16, 64}) {
#if defined(CORA_HAS_CUDA)
      if (d.backend == cora::backend_kind::cuda) {
        cb::register_once(name(d, "raw_threads/T:" + std::to_string(t)), raw_cuda_threads, d.ordinal, t);
        continue;
      }
#endif
      cb::register_once(name(d, "raw_threads/T:" + std::to_string(t)), raw_cpu_threads, t);
    }
#if defined(CORA_HAS_CUDA)
    if (d.backend == cora::backend_kind::cuda)
      for (int s : {1, 4, 16, 256})
        cb::register_once(name(d, "raw_poll/S:" + std::to_string(s)), raw_cuda_poll, d.ordinal, s);
#endif
    const auto hybrid = cora::completion_policy::hybrid, spin = cora::completion_policy::spin;
    for (int k : {1, 2, 4, 8, 16})
      for (int c : {16, 64, 256, 1024, 4096})
        cb::register_once(name(d, "cora/K:" + std::to_string(k) + "/C:" + std::to_string(c)), cora_pipelines, d.index, k,
                          c, 1, hybrid, false, false);
    // One io_context per executor thread: each thread polls and resumes only its own waits.
    for (int k : {1, 2, 4, 8, 16})
      for (int c : {64, 256, 1024})
        cb::register_once(name(d, "cora_per_thread/K:" + std::to_string(k) + "/C:" + std::to_string(c)),
                          cora_pipelines, d.index, k, c, 1, hybrid, true, false);
    // Each client with buffers of its own, as each raw thread has (io_context per thread).
    for (int k : {1, 4, 16})
      for (int c : {64, 256, 1024})
        cb::register_once(name(d, "cora_own_buffers/K:" + std::to_string(k) + "/C:" + std::to_string(c)),
                          cora_pipelines, d.index, k, c, 1, hybrid, true, true);
    // The spin policy, to tell the cost of the policy from the cost of the rest.
    for (int k : {1, 2, 4})
      for (int c : {64, 256, 1024})
        cb::register_once(name(d, "cora_spin/K:" + std::to_string(k) + "/C:" + std::to_string(c)), cora_pipelines,
                          d.index, k, c, 1, spin, false, false);
    for (int b : {16, static_cast<int>(cb::env_long("CORA_BENCH_BATCH", 64))})
      for (int k : {1, 4})
        for (int c : {16, 64})
          cb::register_once(
              name(d, "cora_batched/K:" + std::to_string(k) + "/C:" + std::to_string(c) + "/B:" + std::to_string(b)),
              cora_pipelines, d.index, k, c, b, hybrid, false, false);
  }
});

}  // namespace
