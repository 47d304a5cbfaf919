// Graphs: a replayed graph against the same ops issued one by one, and against the raw
// driver's cuGraphLaunch of the same graph, all in one run.
//
// Work: chains of 10 and 50 empty kernels (each depending on the one before), and the
// copy-launch-copy pipeline of pipeline_bench (4 KiB in, add_f32 over 512 floats, 2 KiB back).
// Each is completed and awaited, K clients at a time (K = 1 and 4 executor threads), and the
// latency of one completion is reported (p50_us, p99_us) with completions per second (per_s).
//
// Rows per device and work:
//   cora_graph/K:k     co_await exec.launch(stream) (the hybrid completion policy, as the
//                      cora rows below; cora_graph_spin/K:1 with the spin policy, which
//                      busy-polls as the raw rows do)
//   cora_ops/K:k       the same ops through cora, each awaited (the pipeline: the copies and
//                      the launch issued, the last copy awaited, as pipeline_bench does)
//   cora_enqueued/K:k  chains: the launches issued one by one, the last one awaited
//   raw_graph/K:k      CUDA: cuGraphLaunch of the same graph + cuEventRecord + busy cuEventQuery
//   raw_ops/K:k        CUDA: the same ops (cuLaunchKernel, cuMemcpyAsync) + event + busy poll
// And the costs around replays (p50_us of one call):
//   instantiate/cora, instantiate/raw   10-kernel chain: graph.instantiate() against
//                                       cuGraphCreate + nodes + cuGraphInstantiate + cuGraphUpload
//   set_args/cora, set_args/raw         exec.set_launch_args against cuGraphExecKernelNodeSetParams
//   update/cora, update/raw             exec.update(graph) against build + cuGraphExecUpdate
//
// Settings: CORA_BENCH_SECONDS (per configuration, default 0.3).
#include <asio/io_context.hpp>

#include <atomic>
#include <cstring>
#include <memory>
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

constexpr std::size_t elements = 512;  // pipeline: x and y in, z out
constexpr std::size_t in_bytes = 2 * elements * sizeof(float);
constexpr std::size_t out_bytes = elements * sizeof(float);

/// What a client completes per iteration: a chain of `chain` empty kernels, or (chain == 0)
/// the copy-launch-copy pipeline.
struct work {
  int chain = 0;
  std::string name() const { return chain ? "chain:" + std::to_string(chain) : "pipeline"; }
};

/// The measured window: the first 10 % of the run warms up and is not counted.
struct window {
  window() {
    const double s = cb::env_double("CORA_BENCH_SECONDS", 0.3);
    start = clk::now();
    from = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(0.1 * s));
    end = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(1.1 * s));
  }
  double seconds() const { return std::chrono::duration<double>(end - from).count(); }
  clk::time_point start, from, end;
};

/// Latencies of every client of one run, merged.
struct samples {
  std::mutex mutex;
  cb::latencies all;
  std::uint64_t count = 0;
  void merge(const std::vector<double>& v) {
    std::lock_guard lock(mutex);
    for (double us : v) all.add_us(us);
    count += v.size();
  }
  void report(benchmark::State& state, const window& w, const std::string& label) {
    all.report(state);
    state.counters["per_s"] = static_cast<double>(count) / w.seconds();
    state.SetLabel(label);
  }
};

// --- cora ----------------------------------------------------------------------------------

enum class mode { graph, ops, enqueued };

struct cora_client {
  cora::stream s;
  cora::graph_exec exec;
  cora::host_buffer<float> host_in, host_out;
  cora::device_buffer<float> dev_in, dev_out;
};

struct cora_run {
  cora::kernel empty, add;
  cora::launch_config add_cfg;
  work w;
  mode m = mode::graph;
  window win;
  samples lat;
};

// The work's ops on `s` (eager, or captured); returns the last op's pending.
cora::pending<void> issue(cora_run& r, cora_client& c, cora::stream& s) {
  if (r.w.chain) {
    for (int i = 0; i + 1 < r.w.chain; ++i) (void)s.launch(r.empty, {});
    return s.launch(r.empty, {});
  }
  float* din = c.dev_in.data();
  (void)s.copy(din, c.host_in.data(), in_bytes);
  (void)s.launch(r.add, r.add_cfg, din, din + elements, c.dev_out.data(), std::uint64_t{elements});
  return s.copy(c.host_out.data(), c.dev_out.data(), out_bytes);
}

cora::task<void> cora_loop(cora_run& r, cora_client& c) {
  std::vector<double> mine;
  mine.reserve(1 << 16);
  for (auto now = clk::now(); now < r.win.end; now = clk::now()) {
    const auto t0 = clk::now();
    switch (r.m) {
      case mode::graph:
        co_await c.exec.launch(c.s);
        break;
      case mode::enqueued:
        co_await issue(r, c, c.s);
        break;
      case mode::ops:
        if (r.w.chain) {
          for (int i = 0; i < r.w.chain; ++i) co_await c.s.launch(r.empty, {});
        } else {
          co_await issue(r, c, c.s);
        }
        break;
    }
    const auto t1 = clk::now();
    if (t0 >= r.win.from && t1 < r.win.end) mine.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  r.lat.merge(mine);
}

void cora_bench(benchmark::State& state, std::size_t index, work w, mode m, int threads,
                cora::completion_policy policy) {
  auto& dev = cb::shared_runtime(policy).device(index);
  const bool cuda = dev.backend() == cora::backend_kind::cuda;
  cora_run r;
  r.empty = cb::test_kernels(policy, index).kernel("empty");
  r.add = cb::test_kernels(policy, index).kernel("add_f32");
  r.add_cfg.grid = cuda ? 2u : 1u;
  r.add_cfg.block = cuda ? 256u : 1u;
  r.w = w;
  r.m = m;
  std::vector<std::unique_ptr<cora_client>> clients;
  for (int i = 0; i < threads; ++i) {
    auto c = std::make_unique<cora_client>();
    c->s = dev.make_stream();
    c->host_in = dev.alloc_host<float>(2 * elements);
    c->host_out = dev.alloc_host<float>(elements);
    c->dev_in = dev.alloc<float>(2 * elements);
    c->dev_out = dev.alloc<float>(elements);
    std::fill(c->host_in.data(), c->host_in.data() + c->host_in.size(), 1.0f);
    if (m == mode::graph) {
      auto& cl = *c;
      cora::graph g = cl.s.capture([&](cora::stream& s) { (void)issue(r, cl, s); }).wait();
      cl.exec = g.instantiate();
      cl.exec.launch(cl.s).wait();  // first touch, as the others get in their first iteration
    }
    clients.push_back(std::move(c));
  }
  for (auto _ : state) {
    asio::io_context ctx(threads);
    r.win = window{};
    for (auto& c : clients)
      cora::spawn(ctx, cora_loop(r, *c), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
    cb::on_threads(threads, [&](int) {
      try {
        ctx.run();
      } catch (...) {
        ctx.stop();
        throw;
      }
    });
    r.lat.report(state, r.win,
                 std::string(m == mode::graph ? "graph replay, " : m == mode::ops ? "each op awaited, " : "last op awaited, ") +
                     cora::to_string(policy));
  }
  for (auto& c : clients) c->s.synchronize().wait();
}

// Costs around replays: instantiation and parameter updates of a 10-kernel chain.
void cora_costs(benchmark::State& state, std::size_t index, int what) {
  const auto policy = cora::completion_policy::hybrid;
  auto& dev = cb::shared_runtime(policy).device(index);
  auto scale = cb::test_kernels(policy, index).kernel("scale_7");
  auto x = dev.alloc<float>(256);
  auto s = dev.make_stream();
  cora::graph g(dev);
  cora::graph_node last;
  std::vector<cora::graph_node> nodes;
  for (int i = 0; i < 10; ++i) {
    last = i ? g.add_launch(last, scale, {}, x, 1.0f, std::uint64_t{256}) : g.add_launch(scale, {}, x, 1.0f, std::uint64_t{256});
    nodes.push_back(last);
  }
  cora::graph_exec exec = g.instantiate();
  cb::latencies lat;
  for (auto _ : state) {
    const auto end = clk::now() + std::chrono::duration<double>(cb::env_double("CORA_BENCH_SECONDS", 0.3));
    float f = 1.0f;
    while (clk::now() < end) {
      const auto t0 = clk::now();
      if (what == 0) {
        cora::graph_exec e = g.instantiate();
        benchmark::DoNotOptimize(e);
      } else if (what == 1) {
        exec.set_launch_args(nodes[0], x, f, std::uint64_t{256});
      } else {
        exec.update(g);
      }
      lat.add(clk::now() - t0);
      f += 1.0f;
    }
  }
  lat.report(state);
  exec.launch(s).wait();
  state.SetLabel(what == 0 ? "graph.instantiate()" : what == 1 ? "exec.set_launch_args()" : "exec.update(graph)");
}

#if defined(CORA_HAS_CUDA)
// --- raw: the CUDA driver ------------------------------------------------------------------

struct raw_client {
  explicit raw_client(const cb::raw_cuda& rc, const work& w) : r(rc), wk(w) {
    stream = r.make_stream();
    event = r.make_event();
    host_in = static_cast<float*>(r.host_alloc(in_bytes));
    host_out = static_cast<float*>(r.host_alloc(out_bytes));
    dev_in = r.alloc(in_bytes);
    dev_out = r.alloc(out_bytes);
    for (std::size_t i = 0; i < 2 * elements; ++i) host_in[i] = 1.0f;
    empty = r.function("empty");
    add = r.function("add_f32");
  }
  ~raw_client() {
    auto& a = r.api();
    a.cuStreamSynchronize(stream);
    if (exec) a.cuGraphExecDestroy(exec);
    if (graph) a.cuGraphDestroy(graph);
    a.cuEventDestroy(event);
    a.cuStreamDestroy(stream);
    a.cuMemFreeHost(host_in);
    a.cuMemFreeHost(host_out);
    a.cuMemFree(dev_in);
    a.cuMemFree(dev_out);
  }
  // The ops, one by one.
  void issue() {
    auto& a = r.api();
    if (wk.chain) {
      for (int i = 0; i < wk.chain; ++i)
        cb::check(a.cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr), "cuLaunchKernel");
      return;
    }
    cb::check(a.cuMemcpyAsync(dev_in, reinterpret_cast<CUdeviceptr>(host_in), in_bytes, stream), "cuMemcpyAsync");
    CUdeviceptr x = dev_in, y = dev_in + elements * sizeof(float), z = dev_out;
    std::uint64_t n = elements;
    auto p = cb::params(x, y, z, n);
    cb::check(a.cuLaunchKernel(add, 2, 1, 1, 256, 1, 1, 0, stream, p.data(), nullptr), "cuLaunchKernel");
    cb::check(a.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(host_out), dev_out, out_bytes, stream), "cuMemcpyAsync");
  }
  // The same ops as a graph, node by node, instantiated and uploaded.
  void build() {
    auto& a = r.api();
    cb::check(a.cuGraphCreate(&graph, 0), "cuGraphCreate");
    CUgraphNode prev = nullptr;
    auto kernel = [&](CUfunction f, unsigned grid, unsigned block, void** params) {
      CUDA_KERNEL_NODE_PARAMS p{};
      p.func = f;
      p.gridDimX = grid;
      p.gridDimY = p.gridDimZ = 1;
      p.blockDimX = block;
      p.blockDimY = p.blockDimZ = 1;
      p.kernelParams = params;
      CUgraphNode n = nullptr;
      cb::check(a.cuGraphAddKernelNode(&n, graph, prev ? &prev : nullptr, prev ? 1 : 0, &p), "cuGraphAddKernelNode");
      prev = n;
    };
    auto copy = [&](CUmemorytype dt, void* dh, CUdeviceptr dd, CUmemorytype st, const void* sh, CUdeviceptr sd,
                    std::size_t bytes) {
      CUDA_MEMCPY3D p{};
      p.srcMemoryType = st;
      p.srcHost = sh;
      p.srcDevice = sd;
      p.dstMemoryType = dt;
      p.dstHost = dh;
      p.dstDevice = dd;
      p.WidthInBytes = bytes;
      p.Height = p.Depth = 1;
      CUcontext ctx = nullptr;
      cb::check(a.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
      CUgraphNode n = nullptr;
      cb::check(a.cuGraphAddMemcpyNode(&n, graph, prev ? &prev : nullptr, prev ? 1 : 0, &p, ctx), "cuGraphAddMemcpyNode");
      prev = n;
    };
    if (wk.chain) {
      for (int i = 0; i < wk.chain; ++i) kernel(empty, 1, 1, nullptr);
    } else {
      copy(CU_MEMORYTYPE_DEVICE, nullptr, dev_in, CU_MEMORYTYPE_HOST, host_in, 0, in_bytes);
      CUdeviceptr x = dev_in, y = dev_in + elements * sizeof(float), z = dev_out;
      std::uint64_t n = elements;
      auto p = cb::params(x, y, z, n);
      kernel(add, 2, 256, p.data());
      copy(CU_MEMORYTYPE_HOST, host_out, 0, CU_MEMORYTYPE_DEVICE, nullptr, dev_out, out_bytes);
    }
    cb::check(a.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
    cb::check(a.cuGraphUpload(exec, stream), "cuGraphUpload");
    cb::check(a.cuStreamSynchronize(stream), "cuStreamSynchronize");
  }
  const cb::raw_cuda& r;
  work wk;
  CUstream stream = nullptr;
  CUevent event = nullptr;
  float* host_in = nullptr;
  float* host_out = nullptr;
  CUdeviceptr dev_in = 0, dev_out = 0;
  CUfunction empty = nullptr, add = nullptr;
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
};

void raw_bench(benchmark::State& state, std::size_t ordinal, work w, bool graph, int threads) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  std::vector<std::unique_ptr<raw_client>> clients;
  for (int i = 0; i < threads; ++i) {
    clients.push_back(std::make_unique<raw_client>(r, w));
    if (graph) clients.back()->build();
  }
  for (auto _ : state) {
    window win;
    samples lat;
    cb::on_threads(threads, [&](int i) {
      r.bind();
      raw_client& c = *clients[static_cast<std::size_t>(i)];
      auto& a = r.api();
      std::vector<double> mine;
      mine.reserve(1 << 16);
      for (auto now = clk::now(); now < win.end; now = clk::now()) {
        const auto t0 = clk::now();
        if (graph)
          cb::check(a.cuGraphLaunch(c.exec, c.stream), "cuGraphLaunch");
        else
          c.issue();
        cb::check(a.cuEventRecord(c.event, c.stream), "cuEventRecord");
        r.spin(c.event);
        const auto t1 = clk::now();
        if (t0 >= win.from && t1 < win.end) mine.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      lat.merge(mine);
    });
    lat.report(state, win, graph ? "cuGraphLaunch + event + busy poll" : "ops + event + busy poll");
  }
}

void raw_costs(benchmark::State& state, std::size_t ordinal, int what) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  auto& a = r.api();
  const CUfunction scale = r.function("scale_7");
  const CUdeviceptr x = r.alloc(256 * sizeof(float));
  CUcontext ctx = nullptr;
  cb::check(a.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  const CUstream s = r.make_stream();
  CUdeviceptr px = x;
  float f = 1.0f;
  std::uint64_t n = 256;
  std::vector<CUgraphNode> nodes;
  auto build = [&](CUgraph& g) {
    cb::check(a.cuGraphCreate(&g, 0), "cuGraphCreate");
    nodes.clear();
    auto p = cb::params(px, f, n);
    for (int i = 0; i < 10; ++i) {
      CUDA_KERNEL_NODE_PARAMS kp{};
      kp.func = scale;
      kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
      kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
      kp.kernelParams = p.data();
      CUgraphNode node = nullptr;
      cb::check(a.cuGraphAddKernelNode(&node, g, nodes.empty() ? nullptr : &nodes.back(), nodes.empty() ? 0 : 1, &kp),
                "cuGraphAddKernelNode");
      nodes.push_back(node);
    }
  };
  CUgraph g0 = nullptr;
  build(g0);
  CUgraphExec exec = nullptr;
  cb::check(a.cuGraphInstantiateWithFlags(&exec, g0, 0), "cuGraphInstantiateWithFlags");
  const std::vector<CUgraphNode> exec_nodes = nodes;
  cb::latencies lat;
  for (auto _ : state) {
    const auto end = clk::now() + std::chrono::duration<double>(cb::env_double("CORA_BENCH_SECONDS", 0.3));
    while (clk::now() < end) {
      const auto t0 = clk::now();
      if (what == 0) {
        CUgraph g = nullptr;
        build(g);
        CUgraphExec e = nullptr;
        cb::check(a.cuGraphInstantiateWithFlags(&e, g, 0), "cuGraphInstantiateWithFlags");
        cb::check(a.cuGraphUpload(e, nullptr), "cuGraphUpload");
        a.cuGraphExecDestroy(e);
        a.cuGraphDestroy(g);
      } else if (what == 1) {
        auto p = cb::params(px, f, n);
        CUDA_KERNEL_NODE_PARAMS kp{};
        kp.func = scale;
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
        kp.kernelParams = p.data();
        cb::check(a.cuGraphExecKernelNodeSetParams(exec, exec_nodes[0], &kp), "cuGraphExecKernelNodeSetParams");
      } else {
        CUgraph g = nullptr;
        build(g);
        CUgraphExecUpdateResultInfo info{};
        cb::check(a.cuGraphExecUpdate(exec, g, &info), "cuGraphExecUpdate");
        a.cuGraphDestroy(g);
      }
      lat.add(clk::now() - t0);
      f += 1.0f;
    }
  }
  lat.report(state);
  cb::check(a.cuGraphLaunch(exec, s), "cuGraphLaunch");
  cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
  a.cuGraphExecDestroy(exec);
  a.cuGraphDestroy(g0);
  a.cuStreamDestroy(s);
  a.cuMemFree(x);
  state.SetLabel(what == 0 ? "build + cuGraphInstantiate + cuGraphUpload"
                 : what == 1 ? "cuGraphExecKernelNodeSetParams"
                             : "build + cuGraphExecUpdate");
}
#endif

const bool registered = cb::at_start([] {
  const std::string suffix = "/iterations:1/real_time";
  for (const auto& d : cb::devices()) {
    const std::string base = "graph/" + d.tag + "/";
    const auto hybrid = cora::completion_policy::hybrid, spin = cora::completion_policy::spin;
    for (const work w : {work{10}, work{50}, work{0}}) {
      const std::string gs = base + w.name() + "/cora_graph_spin/K:1";
      cb::register_once(gs, cora_bench, d.index, w, mode::graph, 1, spin);
#if defined(CORA_HAS_CUDA)
      if (d.backend == cora::backend_kind::cuda) cb::compare(gs + suffix, base + w.name() + "/raw_graph/K:1" + suffix);
#endif
      for (int k : {1, 4}) {
        const std::string kk = "/K:" + std::to_string(k);
        const std::string g = base + w.name() + "/cora_graph" + kk;
        cb::register_once(g, cora_bench, d.index, w, mode::graph, k, hybrid);
        cb::register_once(base + w.name() + "/cora_ops" + kk, cora_bench, d.index, w, mode::ops, k, hybrid);
        if (w.chain)
          cb::register_once(base + w.name() + "/cora_enqueued" + kk, cora_bench, d.index, w, mode::enqueued, k, hybrid);
        cb::compare(base + w.name() + "/cora_graph" + kk + suffix, base + w.name() + "/cora_ops" + kk + suffix);
#if defined(CORA_HAS_CUDA)
        if (d.backend == cora::backend_kind::cuda) {
          cb::register_once(base + w.name() + "/raw_graph" + kk, raw_bench, d.ordinal, w, true, k);
          cb::register_once(base + w.name() + "/raw_ops" + kk, raw_bench, d.ordinal, w, false, k);
          cb::compare(g + suffix, base + w.name() + "/raw_graph" + kk + suffix);
        }
#endif
      }
    }
    const char* costs[] = {"instantiate", "set_args", "update"};
    for (int what = 0; what < 3; ++what) {
      const std::string c = base + costs[what] + "/cora";
      cb::register_once(c, cora_costs, d.index, what);
#if defined(CORA_HAS_CUDA)
      if (d.backend == cora::backend_kind::cuda) {
        cb::register_once(base + costs[what] + "/raw", raw_costs, d.ordinal, what);
        cb::compare(c + suffix, base + costs[what] + "/raw" + suffix);
      }
#endif
    }
  }
});

}  // namespace
