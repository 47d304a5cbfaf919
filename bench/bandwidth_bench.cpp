// Bandwidth: pinned host-to-device and device-to-host copies, and an fp32 add kernel
// (z = x + y) over 2^L elements, through cora and raw, in GB/s (10^9 bytes per second; the
// kernel counts the 12 bytes it reads and writes per element). Raw: cuMemcpyAsync and
// cuLaunchKernel on a stream, then cuStreamSynchronize; on the CPU device, memcpy and the
// loop on one plain thread per hardware thread (a team made once, woken each pass). cora: the same operations enqueued on a
// stream, the last one awaited.
//
// First touch: on the CPU device both sides allocate page-aligned memory and fill their inputs
// (x = 1, y = 2, z = 0) with the same loop on the same thread, the calling one, before the
// first timed pass; so neither side reads the kernel's zero page or has its pages placed
// differently. Both sides check z afterwards, so a kernel that skipped its reads would show.
//
// Two kernels more, each against the same work done raw: add_custom_tiling (the CANN sample's
// fp16 add in placeholder mode, 8 blocks tiling their slices; raw: the fp16 add on plain
// threads, one per block, on the CPU device only: the sample fixes its 8 blocks, so neither
// side uses more than 8 cores) and reduce_u32 (a block reduction: each thread sums its
// grid_range part, the block reduces through shared memory and sync_block; raw: the same
// kernel through the driver on a GPU, a sum per plain thread on the CPU device), in GB/s read
// and written.
//
// Settings: CORA_BENCH_COPY_MB (256 on a GPU, 32 on the CPU device), CORA_BENCH_ADD_LOG2
// (28 on a GPU, 24 on the CPU device), CORA_BENCH_REPS (operations per figure, 10).
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include <cora/cora.hpp>
#include <cora/kernel_types.hpp>

#include "bench_support.hpp"
#if defined(CORA_HAS_CUDA)
#include "raw_cuda.hpp"
#endif

namespace {

using clk = std::chrono::steady_clock;
namespace cb = cora::bench;

enum class what { h2d, d2h, add };

std::size_t copy_bytes(bool gpu) { return static_cast<std::size_t>(cb::env_long("CORA_BENCH_COPY_MB", gpu ? 256 : 32)) << 20; }
std::size_t add_elements(bool gpu) { return std::size_t{1} << cb::env_long("CORA_BENCH_ADD_LOG2", gpu ? 28 : 24); }
int reps() { return static_cast<int>(cb::env_long("CORA_BENCH_REPS", 10)); }

void report(benchmark::State& state, double bytes, double seconds) {
  state.counters["GB_per_s"] = bytes / seconds * 1e-9;
  state.SetIterationTime(seconds);
}

/// The first touch both sides share on the CPU device: x = 1, y = 2, z = 0, written by the
/// calling thread.
void first_touch(float* x, float* y, float* z, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = 1.0f;
    y[i] = 2.0f;
    z[i] = 0.0f;
  }
}

/// Throws unless every z[i] is x[i] + y[i] = 3.
void check_sum(const float* z, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (z[i] != 3.0f) throw std::runtime_error("add_f32 gave a wrong sum at " + std::to_string(i));
}

/// Page-aligned host memory, freed on scope exit.
struct page_buffer {
  explicit page_buffer(std::size_t bytes)
      : p(static_cast<float*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
    if (!p) throw std::bad_alloc();
  }
  ~page_buffer() { std::free(p); }
  page_buffer(const page_buffer&) = delete;
  page_buffer& operator=(const page_buffer&) = delete;
  float* p;
};

/// Plain threads made once for the whole run (the calling thread one of them), as an OpenMP
/// team: each pass only wakes them, so the raw side pays no thread creation per pass.
class thread_team {
 public:
  explicit thread_team(std::size_t t) : size_(t), start_(static_cast<std::ptrdiff_t>(t)), end_(static_cast<std::ptrdiff_t>(t)) {
    for (std::size_t i = 1; i < t; ++i)
      threads_.emplace_back([this, i] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          job_(i);
          end_.arrive_and_wait();
        }
      });
  }
  ~thread_team() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& th : threads_) th.join();
  }
  thread_team(const thread_team&) = delete;
  thread_team& operator=(const thread_team&) = delete;
  std::size_t size() const noexcept { return size_; }
  /// Runs job(i) on every thread i of the team (0: the caller) and returns when all are done.
  void run(const std::function<void(std::size_t)>& job) {
    job_ = job;
    start_.arrive_and_wait();
    job_(0);
    end_.arrive_and_wait();
  }

 private:
  std::size_t size_;
  std::barrier<> start_, end_;
  std::function<void(std::size_t)> job_;
  bool stop_ = false;  // written before the start barrier that the threads then pass
  std::vector<std::thread> threads_;
};

/// Runs fn(lo, hi) on the threads of `team`, [lo, hi) being each thread's slice of n.
template <class F>
void on_threads(thread_team& team, std::size_t n, F fn) {
  const std::size_t t = team.size();
  team.run([&](std::size_t i) { fn(n * i / t, n * (i + 1) / t); });
}

/// The size of a team with one thread per hardware thread.
std::size_t all_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

/// Blocks of add_custom_tiling: the CANN sample's kernel fixes 8 (use_core_num), and a block
/// runs on one worker of the CPU device.
constexpr std::size_t tiling_blocks = 8;

/// Elements of the add_custom_tiling and reduce rows: as add_f32.
std::size_t extra_elements(bool gpu) { return add_elements(gpu); }

void raw_cpu_tiling(benchmark::State& state) {
  const std::size_t n = extra_elements(false);
  const std::size_t bytes = n * sizeof(cora::half);
  page_buffer a(bytes), b(bytes), c(bytes);
  auto* x = reinterpret_cast<cora::half*>(a.p);
  auto* y = reinterpret_cast<cora::half*>(b.p);
  auto* z = reinterpret_cast<cora::half*>(c.p);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = cora::half(1.0f);
    y[i] = cora::half(2.0f);
    z[i] = cora::half(0.0f);
  }
  // The kernel's own split: its 8 slices, on as many threads (fewer where the machine has
  // fewer hardware threads, as the CPU device's workers).
  thread_team team(std::min<std::size_t>(tiling_blocks, all_threads()));
  for (auto _ : state) {
    const auto t0 = clk::now();
    for (int r = 0; r < reps(); ++r) {
      on_threads(team, n, [=](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) z[i] = x[i] + y[i];
      });
      benchmark::DoNotOptimize(z);
    }
    report(state, 3.0 * static_cast<double>(bytes) * reps(), cb::seconds_since(t0));
  }
  for (std::size_t i = 0; i < n; ++i)
    if (float(z[i]) != 3.0f) throw std::runtime_error("fp16 add gave a wrong sum");
  state.SetLabel("plain threads, one per block of the kernel (8), fp16, inputs first-touched by the calling thread");
}

void cora_tiling(benchmark::State& state, std::size_t index) {
  auto& dev = cb::shared_runtime(cora::completion_policy::hybrid).device(index);
  const bool gpu = dev.backend() == cora::backend_kind::cuda;
  auto s = dev.make_stream();
  const std::size_t n = extra_elements(gpu);
  auto bin = dev.load_binary(std::filesystem::path(cb::kernels_dir()) / "add_custom_tiling.corabin").wait();
  auto k = bin.kernel("add_custom");
  auto buf = dev.alloc<cora::half>(3 * n);
  std::vector<cora::half> init(n);
  for (auto [off, v] : {std::pair{std::size_t{0}, 1.0f}, std::pair{n, 2.0f}, std::pair{2 * n, 0.0f}}) {
    std::fill(init.begin(), init.end(), cora::half(v));
    if (gpu)
      s.copy(buf.data() + off, init.data(), n * sizeof(cora::half)).wait();
    else
      std::memcpy(static_cast<void*>(buf.data() + off), init.data(), n * sizeof(cora::half));
  }
  auto tiling = dev.alloc<std::int32_t>(2);
  const std::int32_t t[2] = {static_cast<std::int32_t>(n), 8};  // length, tiles per block
  s.copy(tiling.data(), t, sizeof(t)).wait();
  auto* x = reinterpret_cast<cora::gm_addr>(buf.data());
  const cora::launch_config cfg{.grid = static_cast<std::uint32_t>(tiling_blocks), .block = gpu ? 256u : 1u};
  auto launch = [&] {
    return s.launch(k, cfg, x, x + 2 * n, x + 4 * n, tiling.data(), tiling.data() + 1);
  };
  launch().wait();
  for (auto _ : state) {
    const auto t0 = clk::now();
    cora::pending<void> last;
    for (int r = 0; r < reps(); ++r) last = launch();
    last.wait();
    report(state, 6.0 * static_cast<double>(n) * reps(), cb::seconds_since(t0));
  }
  s.copy(init.data(), buf.data() + 2 * n, n * sizeof(cora::half)).wait();
  for (std::size_t i = 0; i < n; ++i)
    if (float(init[i]) != 3.0f) throw std::runtime_error("add_custom gave a wrong sum");
  state.SetLabel(gpu ? "cora, 8 blocks of 256" : "cora, 8 blocks, inputs first-touched by the calling thread");
}

/// The reduce row's launch shape: a block a worker (64 threads) on the CPU device; 1024 blocks
/// of 256 threads on a GPU.
cora::launch_config reduce_shape(bool gpu, unsigned units) {
  return gpu ? cora::launch_config{.grid = 1024, .block = 256} : cora::launch_config{.grid = units, .block = 64};
}

void raw_cpu_reduce(benchmark::State& state) {
  const std::size_t n = extra_elements(false);
  page_buffer a(n * 4);
  auto* in = reinterpret_cast<std::uint32_t*>(a.p);
  for (std::size_t i = 0; i < n; ++i) in[i] = 1;
  std::atomic<std::uint64_t> total{0};
  thread_team team(all_threads());
  for (auto _ : state) {
    const auto t0 = clk::now();
    for (int r = 0; r < reps(); ++r) {
      total = 0;
      on_threads(team, n, [in, &total](std::size_t lo, std::size_t hi) {
        std::uint64_t sum = 0;
        for (std::size_t i = lo; i < hi; ++i) sum += in[i];
        total.fetch_add(sum);
      });
    }
    report(state, 4.0 * static_cast<double>(n) * reps(), cb::seconds_since(t0));
  }
  if (total != n) throw std::runtime_error("the raw sum is wrong");
  state.SetLabel("plain threads, input first-touched by the calling thread");
}

#if defined(CORA_HAS_CUDA)
void raw_gpu_reduce(benchmark::State& state, std::size_t ordinal) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  auto& a = r.api();
  CUstream s = r.make_stream();
  const std::size_t n = extra_elements(true);
  const auto shape = reduce_shape(true, 0);
  CUdeviceptr in = r.alloc(n * 4), out = r.alloc(shape.grid.x * 8);
  cb::check(a.cuMemsetD8Async(in, 0, n * 4, s), "cuMemsetD8Async");
  std::uint64_t count = n;
  auto p = cb::params(in, count, out);
  auto launch = [&] {
    cb::check(a.cuLaunchKernel(r.function("reduce_u32"), shape.grid.x, 1, 1, shape.block.x, 1, 1, 0, s, p.data(), nullptr),
              "cuLaunchKernel");
  };
  launch();
  cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
  for (auto _ : state) {
    const auto t0 = clk::now();
    for (int i = 0; i < reps(); ++i) launch();
    cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
    report(state, 4.0 * static_cast<double>(n) * reps(), cb::seconds_since(t0));
  }
  for (CUdeviceptr d : {in, out}) a.cuMemFree(d);
  a.cuStreamDestroy(s);
  state.SetLabel("raw driver");
}
#endif

void cora_reduce(benchmark::State& state, std::size_t index) {
  auto& dev = cb::shared_runtime(cora::completion_policy::hybrid).device(index);
  const bool gpu = dev.backend() == cora::backend_kind::cuda;
  auto s = dev.make_stream();
  const std::size_t n = extra_elements(gpu);
  auto k = cb::test_kernels(cora::completion_policy::hybrid, index).kernel("reduce_u32");
  auto in = dev.alloc<std::uint32_t>(n);
  if (gpu) {
    std::vector<std::uint32_t> ones(n, 1);
    s.copy(in.data(), ones.data(), n * 4).wait();
  } else {
    for (std::size_t i = 0; i < n; ++i) in.data()[i] = 1;
  }
  const auto cfg = reduce_shape(gpu, dev.properties().compute_units);
  auto out = dev.alloc<std::uint64_t>(cfg.grid.x);
  auto launch = [&] { return s.launch(k, cfg, in.data(), std::uint64_t{n}, out.data()); };
  launch().wait();
  for (auto _ : state) {
    const auto t0 = clk::now();
    cora::pending<void> last;
    for (int r = 0; r < reps(); ++r) last = launch();
    last.wait();
    report(state, 4.0 * static_cast<double>(n) * reps(), cb::seconds_since(t0));
  }
  std::vector<std::uint64_t> sums(cfg.grid.x);
  s.copy(sums.data(), out.data(), sums.size() * 8).wait();
  std::uint64_t total = 0;
  for (auto v : sums) total += v;
  if (total != n) throw std::runtime_error("reduce_u32 gave a wrong sum");
  state.SetLabel(gpu ? "cora, 1024 blocks of 256" : "cora, a block of 64 a worker, input first-touched by the calling thread");
}

/// `one_buffer` (add only, information): x, y and z laid out as cora's side lays them out, one
/// after the other in one allocation, instead of three allocations.
void raw_cpu(benchmark::State& state, what w, bool one_buffer = false) {
  const std::size_t bytes = w == what::add ? add_elements(false) * sizeof(float) : copy_bytes(false);
  const std::size_t n = bytes / sizeof(float);
  page_buffer a(one_buffer ? 3 * bytes : bytes), b(one_buffer ? 4096 : bytes), c(one_buffer ? 4096 : bytes);
  float* const x = a.p;
  float* const y = one_buffer ? a.p + n : b.p;
  float* const z = one_buffer ? a.p + 2 * n : c.p;
  first_touch(x, y, z, n);
  thread_team team(all_threads());
  for (auto _ : state) {
    const auto t0 = clk::now();
    for (int r = 0; r < reps(); ++r) {
      if (w == what::add)
        on_threads(team, n, [=](std::size_t lo, std::size_t hi) {
          for (std::size_t i = lo; i < hi; ++i) z[i] = x[i] + y[i];
        });
      else
        on_threads(team, bytes, [=](std::size_t lo, std::size_t hi) {
          std::memcpy(reinterpret_cast<std::byte*>(z) + lo, reinterpret_cast<const std::byte*>(x) + lo, hi - lo);
        });
      benchmark::DoNotOptimize(z);
    }
    report(state, static_cast<double>(bytes) * reps() * (w == what::add ? 3 : 1), cb::seconds_since(t0));
  }
  if (w == what::add) check_sum(z, n);
  state.SetLabel(one_buffer ? "plain threads, x, y and z in one allocation as on cora's side (information)"
                            : "plain threads, inputs first-touched by the calling thread");
}

#if defined(CORA_HAS_CUDA)
void raw_gpu(benchmark::State& state, std::size_t ordinal, what w) {
  auto& r = cb::raw_test_kernels(ordinal);
  r.bind();
  auto& a = r.api();
  CUstream s = r.make_stream();
  if (w == what::add) {
    const std::size_t n = add_elements(true);
    CUdeviceptr x = r.alloc(n * 4), y = r.alloc(n * 4), z = r.alloc(n * 4);
    std::uint64_t count = n;
    auto p = cb::params(x, y, z, count);
    const auto grid = static_cast<unsigned>((n + 255) / 256);
    cb::check(a.cuLaunchKernel(r.function("add_f32"), grid, 1, 1, 256, 1, 1, 0, s, p.data(), nullptr), "cuLaunchKernel");
    cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
    for (auto _ : state) {
      const auto t0 = clk::now();
      for (int i = 0; i < reps(); ++i)
        cb::check(a.cuLaunchKernel(r.function("add_f32"), grid, 1, 1, 256, 1, 1, 0, s, p.data(), nullptr), "cuLaunchKernel");
      cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
      report(state, 12.0 * static_cast<double>(n) * reps(), cb::seconds_since(t0));
    }
    for (CUdeviceptr d : {x, y, z}) a.cuMemFree(d);
  } else {
    const std::size_t bytes = copy_bytes(true);
    void* host = r.host_alloc(bytes);
    std::memset(host, 1, bytes);
    CUdeviceptr dev = r.alloc(bytes);
    const auto h = reinterpret_cast<CUdeviceptr>(host);
    auto copy = [&] {
      cb::check(w == what::h2d ? a.cuMemcpyAsync(dev, h, bytes, s) : a.cuMemcpyAsync(h, dev, bytes, s), "cuMemcpyAsync");
    };
    copy();
    cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
    for (auto _ : state) {
      const auto t0 = clk::now();
      for (int i = 0; i < reps(); ++i) copy();
      cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
      report(state, static_cast<double>(bytes) * reps(), cb::seconds_since(t0));
    }
    a.cuMemFree(dev);
    a.cuMemFreeHost(host);
  }
  a.cuStreamDestroy(s);
  state.SetLabel("raw driver");
}
#endif

cora::task<void> enqueue_and_await(cora::stream& s, what w, void* dst, const void* src, std::size_t bytes,
                                   const cora::kernel* add, const cora::launch_config* cfg, float* x,
                                   float* y, float* z, std::uint64_t n) {
  cora::pending<void> last;
  for (int i = 0; i < reps(); ++i)
    last = w == what::add ? s.launch(*add, *cfg, x, y, z, n) : s.copy(dst, src, bytes);
  co_await last;
}

/// `three_buffers` (add on the CPU device, information): x, y and z in three allocations, as
/// on the raw side, instead of one.
void cora_bw(benchmark::State& state, std::size_t index, what w, bool three_buffers = false) {
  const auto policy = cora::completion_policy::hybrid;
  auto& dev = cb::shared_runtime(policy).device(index);
  const bool gpu = dev.backend() == cora::backend_kind::cuda;
  auto s = dev.make_stream();
  if (w == what::add) {
    const std::size_t n = add_elements(gpu);
    auto add = cb::test_kernels(policy, index).kernel("add_f32");
    auto buf = dev.alloc<float>(three_buffers ? n : 3 * n);
    auto buf_y = dev.alloc<float>(three_buffers ? n : 1), buf_z = dev.alloc<float>(three_buffers ? n : 1);
    float* const x = buf.data();
    float* const y = three_buffers ? buf_y.data() : x + n;
    float* const z = three_buffers ? buf_z.data() : x + 2 * n;
    // The CPU device's memory is the process's: touched like the raw side's. On a GPU the
    // inputs are filled on the device.
    if (!gpu) {
      first_touch(x, y, z, n);
    } else {
      std::vector<float> init(n);
      std::fill(init.begin(), init.end(), 1.0f);
      s.copy(x, init.data(), n * sizeof(float)).wait();
      std::fill(init.begin(), init.end(), 2.0f);
      s.copy(y, init.data(), n * sizeof(float)).wait();
    }
    cora::launch_config cfg;
    cfg.grid = gpu ? static_cast<std::uint32_t>((n + 255) / 256) : dev.properties().compute_units;
    cfg.block = gpu ? 256u : 1u;
    s.launch(add, cfg, x, y, z, std::uint64_t{n}).wait();
    for (auto _ : state) {
      const auto t0 = clk::now();
      cora::sync_wait(enqueue_and_await(s, w, nullptr, nullptr, 0, &add, &cfg, x, y, z, n));
      report(state, 12.0 * static_cast<double>(n) * reps(), cb::seconds_since(t0));
    }
    std::vector<float> out(n);
    s.copy(out.data(), z, n * sizeof(float)).wait();
    check_sum(out.data(), n);
    state.SetLabel(gpu ? "cora" : three_buffers ? "cora, x, y and z in three allocations as on the raw side (information)"
                                                : "cora, inputs first-touched by the calling thread");
    return;
  } else {
    const std::size_t bytes = copy_bytes(gpu);
    auto host = dev.alloc_host<std::byte>(bytes);
    std::memset(host.data(), 1, bytes);
    auto d = dev.alloc<std::byte>(bytes);
    void* dst = w == what::h2d ? static_cast<void*>(d.data()) : static_cast<void*>(host.data());
    const void* src = w == what::h2d ? static_cast<const void*>(host.data()) : static_cast<const void*>(d.data());
    s.copy(dst, src, bytes).wait();
    for (auto _ : state) {
      const auto t0 = clk::now();
      cora::sync_wait(enqueue_and_await(s, w, dst, src, bytes, nullptr, nullptr, nullptr, nullptr, nullptr, 0));
      report(state, static_cast<double>(bytes) * reps(), cb::seconds_since(t0));
    }
  }
  state.SetLabel("cora");
}

const bool registered = cb::at_start([] {
  for (const auto& d : cb::devices()) {
    for (auto [w, label] : {std::pair{what::h2d, "copy_h2d"}, std::pair{what::d2h, "copy_d2h"}, std::pair{what::add, "add_f32"}}) {
      const std::string base = "bandwidth/" + d.tag + "/" + label + "/";
#if defined(CORA_HAS_CUDA)
      if (d.backend == cora::backend_kind::cuda)
        benchmark::RegisterBenchmark((base + "raw").c_str(), [o = d.ordinal, w = w](benchmark::State& st) { cb::guarded(st, [&] { raw_gpu(st, o, w); }); })
            ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
#endif
      if (d.backend == cora::backend_kind::cpu)
        benchmark::RegisterBenchmark((base + "raw").c_str(), [w = w](benchmark::State& st) { cb::guarded(st, [&] { raw_cpu(st, w); }); })
            ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
      if (d.backend == cora::backend_kind::cpu && w == what::add)
        benchmark::RegisterBenchmark((base + "raw_one_buffer").c_str(), [](benchmark::State& st) { cb::guarded(st, [&] { raw_cpu(st, what::add, true); }); })
            ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + "cora").c_str(), [i = d.index, w = w](benchmark::State& st) { cb::guarded(st, [&] { cora_bw(st, i, w); }); })
          ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
      if (d.backend == cora::backend_kind::cpu && w == what::add)
        benchmark::RegisterBenchmark((base + "cora_three_buffers").c_str(), [i = d.index](benchmark::State& st) { cb::guarded(st, [&] { cora_bw(st, i, what::add, true); }); })
            ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
    }
    const std::string tiling = "bandwidth/" + d.tag + "/add_custom_tiling/";
    const std::string reduce = "bandwidth/" + d.tag + "/reduce_u32/";
    if (d.backend == cora::backend_kind::cpu) {
      benchmark::RegisterBenchmark((tiling + "raw").c_str(), [](benchmark::State& st) { cb::guarded(st, [&] { raw_cpu_tiling(st); }); })
          ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((reduce + "raw").c_str(), [](benchmark::State& st) { cb::guarded(st, [&] { raw_cpu_reduce(st); }); })
          ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
    }
#if defined(CORA_HAS_CUDA)
    if (d.backend == cora::backend_kind::cuda)
      benchmark::RegisterBenchmark((reduce + "raw").c_str(), [o = d.ordinal](benchmark::State& st) { cb::guarded(st, [&] { raw_gpu_reduce(st, o); }); })
          ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
#endif
    benchmark::RegisterBenchmark((tiling + "cora").c_str(), [i = d.index](benchmark::State& st) { cb::guarded(st, [&] { cora_tiling(st, i); }); })
        ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((reduce + "cora").c_str(), [i = d.index](benchmark::State& st) { cb::guarded(st, [&] { cora_reduce(st, i); }); })
        ->UseManualTime()->Repetitions(3)->Iterations(1)->Unit(benchmark::kMillisecond);
  }
});

}  // namespace
