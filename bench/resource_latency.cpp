// Resource calls while the device is busy: how long each call keeps its thread while a kernel
// runs on another stream. For every sample a kernel is launched that spins until released (or
// for CORA_BENCH_SPIN_US, default 2000 us), the call is timed on the launching thread, then
// the kernel is released and awaited outside the timing. A call that waits for the device
// takes about the kernel's whole time; one that does not takes microseconds.
//
// cora: device.alloc (4 MiB) and its drop, alloc_host (64 KiB) and its drop, make_stream and
// the stream's destruction, an event made and destroyed, the drop of the last handle of an
// unused binary, the load_binary call itself (it completes later), a 4 KiB copy that brings
// its own buffers (allocate, copy there and back, drop: the calls; the copies are awaited
// outside the timing), and for information the same with its await timed (the copies' round
// trip through the device, so the wait policy's wake-up counts).
// raw (GPU, same run, same kernel running): cuMemAlloc, cuMemFree, cuMemAllocAsync and
// cuMemFreeAsync on a stream of its own, cuMemHostAlloc, cuMemFreeHost, cuStreamCreate,
// cuStreamDestroy. raw (CPU device): malloc and free of the same sizes.
//
// Each figure starts with one untimed round (the same calls, the kernel running), so that a
// first call's one-time costs do not count as a wait.
// Goal (bench/goals.py, GPU): every cora call <= 50 us at p99 while the kernel runs.
// Settings: CORA_BENCH_RESOURCE_SAMPLES (samples per figure, default 200), CORA_BENCH_SPIN_US,
// CORA_BENCH_RESOURCE_SLOW_US (print every sample slower than this to stderr, with its index:
// where a figure's outliers fall; 0, the default, prints none).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cora/cora.hpp>

#include "bench_support.hpp"
#if defined(CORA_HAS_CUDA)
#include "raw_cuda.hpp"
#endif

namespace {

using clk = std::chrono::steady_clock;
namespace cb = cora::bench;

int samples() { return static_cast<int>(cb::env_long("CORA_BENCH_RESOURCE_SAMPLES", 200)); }
std::uint64_t spin_us() { return static_cast<std::uint64_t>(cb::env_long("CORA_BENCH_SPIN_US", 2000)); }
long slow_us() { return cb::env_long("CORA_BENCH_RESOURCE_SLOW_US", 0); }
std::string figure;  // the figure being sampled, for the slow-sample lines

/// The busy device: a kernel on a stream of its own, started before each sample.
struct busy_device {
  busy_device(cora::device& d, const cora::binary& kernels)
      : go(d.alloc_host<std::uint32_t>(1)),
        done(d.alloc_host<std::uint32_t>(1)),
        stream(d.make_stream()),
        kernel(kernels.kernel("spin_until_set")) {}
  void start() {
    __atomic_store_n(&go[0], 0u, __ATOMIC_RELEASE);
    run = stream.launch(kernel, {}, go.data(), done.data(), spin_us());
  }
  void stop() {
    __atomic_store_n(&go[0], 1u, __ATOMIC_RELEASE);
    run.wait();
  }
  cora::host_buffer<std::uint32_t> go, done;
  cora::stream stream;
  cora::kernel kernel;
  cora::pending<void> run;
};

/// Times `call(i)` for each sample while the kernel runs; `before(i)` and `after(i)` run
/// untimed (setting up what the call consumes, cleaning up what it made).
template <class Before, class Call, class After>
void sample(benchmark::State& state, busy_device& busy, Before before, Call call, After after) {
  cb::latencies lat(static_cast<std::size_t>(samples()));
  // One round untimed first: what only the first call of a kind pays once (a fresh stream's
  // first copy, an empty cache) is not what the figure is about.
  before(0);
  busy.start();
  call(0);
  busy.stop();
  after(0);
  for (auto _ : state) {
    for (int i = 0; i < samples(); ++i) {
      before(i);
      busy.start();
      const auto t0 = clk::now();
      call(i);
      const auto took = clk::now() - t0;
      lat.add(took);
      if (const long slow = slow_us(); slow > 0 && took > std::chrono::microseconds(slow))
        std::fprintf(stderr, "slow: %s sample %d: %.1f us\n", figure.c_str(), i,
                     std::chrono::duration<double, std::micro>(took).count());
      busy.stop();
      after(i);
    }
  }
  lat.report(state);
}

constexpr std::size_t device_bytes = std::size_t{4} << 20;
constexpr std::size_t host_bytes = std::size_t{64} << 10;
const auto nothing = [](int) {};

void cora_call(benchmark::State& state, std::size_t index, const std::string& what) {
  figure = what;
  auto& rt = cb::shared_runtime(cora::completion_policy::hybrid);
  auto& d = rt.device(index);
  const auto& kernels = cb::test_kernels(cora::completion_policy::hybrid, index);
  busy_device busy(d, kernels);
  const int n = samples();
  if (what == "alloc") {
    std::vector<cora::device_buffer<std::byte>> made(static_cast<std::size_t>(n));
    sample(state, busy, nothing, [&](int i) { made[i] = d.alloc<std::byte>(device_bytes); },
           [&](int i) { made[i].reset(); });
  } else if (what == "free") {
    std::vector<cora::device_buffer<std::byte>> made(static_cast<std::size_t>(n));
    sample(state, busy, [&](int i) { made[i] = d.alloc<std::byte>(device_bytes); },
           [&](int i) { made[i].reset(); }, nothing);
  } else if (what == "alloc_host") {
    std::vector<cora::host_buffer<std::byte>> made(static_cast<std::size_t>(n));
    sample(state, busy, nothing, [&](int i) { made[i] = d.alloc_host<std::byte>(host_bytes); },
           [&](int i) { made[i].reset(); });
  } else if (what == "free_host") {
    std::vector<cora::host_buffer<std::byte>> made(static_cast<std::size_t>(n));
    sample(state, busy, [&](int i) { made[i] = d.alloc_host<std::byte>(host_bytes); },
           [&](int i) { made[i].reset(); }, nothing);
  } else if (what == "make_stream") {
    std::vector<cora::stream> made(static_cast<std::size_t>(n));
    sample(state, busy, nothing, [&](int i) { made[i] = d.make_stream(); },
           [&](int i) { made[i] = cora::stream(); });
  } else if (what == "destroy_stream") {
    std::vector<cora::stream> made(static_cast<std::size_t>(n));
    sample(state, busy, [&](int i) { made[i] = d.make_stream(); },
           [&](int i) { made[i] = cora::stream(); }, nothing);
  } else if (what == "event") {
    sample(state, busy, nothing, [&](int) { auto e = d.make_event(); }, nothing);
  } else if (what == "drop_binary") {
    // Loaded before the kernel starts; the last handle dropped while it runs.
    std::vector<cora::binary> made(static_cast<std::size_t>(n));
    const auto path = cb::kernels_dir() + "/test_kernels.corabin";
    sample(state, busy, [&](int i) { made[i] = d.load_binary(path).wait(); },
           [&](int i) { made[i] = cora::binary(); }, nothing);
  } else if (what == "load_binary_call") {
    // The call only: the load completes later, off the caller's thread.
    std::vector<cora::pending<cora::binary>> made(static_cast<std::size_t>(n));
    const auto path = cb::kernels_dir() + "/test_kernels.corabin";
    sample(state, busy, nothing, [&](int i) { made[i] = d.load_binary(path); },
           [&](int i) { (void)made[i].wait(); });
  } else if (what == "copy_4k") {
    auto other = d.make_stream();
    std::vector<cora::pending<void>> made(static_cast<std::size_t>(n));
    sample(state, busy, nothing,
           [&](int i) {
             auto h = d.alloc_host<std::byte>(4096);
             auto dv = d.alloc<std::byte>(4096);
             std::memset(h.data(), 1, 4096);
             (void)other.copy(dv, h);
             made[i] = other.copy(h, dv);
           },  // the buffers' drops: the copies keep them until they have run
           [&](int i) { made[i].wait(); });
  } else if (what == "copy_4k_round_trip") {
    auto other = d.make_stream();
    sample(state, busy, nothing,
           [&](int) {
             auto h = d.alloc_host<std::byte>(4096);
             auto dv = d.alloc<std::byte>(4096);
             std::memset(h.data(), 1, 4096);
             (void)other.copy(dv, h);
             other.copy(h, dv).wait();
           },
           nothing);
  }
}

#if defined(CORA_HAS_CUDA)
void raw_gpu(benchmark::State& state, std::size_t index, std::size_t ordinal, const std::string& what) {
  figure = what;
  auto& rt = cb::shared_runtime(cora::completion_policy::hybrid);
  auto& d = rt.device(index);
  busy_device busy(d, cb::test_kernels(cora::completion_policy::hybrid, index));
  auto& raw = cb::raw_test_kernels(ordinal);
  raw.bind();
  const auto& api = raw.api();
  const int n = samples();
  std::vector<CUdeviceptr> dp(static_cast<std::size_t>(n));
  std::vector<void*> hp(static_cast<std::size_t>(n));
  std::vector<CUstream> sp(static_cast<std::size_t>(n));
  CUstream own = raw.make_stream();
  if (what == "cuMemAlloc") {
    sample(state, busy, nothing, [&](int i) { cb::check(api.cuMemAlloc(&dp[i], device_bytes), "cuMemAlloc"); },
           [&](int i) { api.cuMemFree(dp[i]); });
  } else if (what == "cuMemFree") {
    sample(state, busy, [&](int i) { cb::check(api.cuMemAlloc(&dp[i], device_bytes), "cuMemAlloc"); },
           [&](int i) { api.cuMemFree(dp[i]); }, nothing);
  } else if (what == "cuMemAllocAsync") {
    CUmemoryPool pool = nullptr;
    CUdevice dev = 0;
    cb::check(api.cuDeviceGet(&dev, static_cast<int>(ordinal)), "cuDeviceGet");
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = static_cast<int>(ordinal);
    cb::check(api.cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
    sample(state, busy, nothing,
           [&](int i) { cb::check(api.cuMemAllocFromPoolAsync(&dp[i], device_bytes, pool, own), "cuMemAllocFromPoolAsync"); },
           [&](int i) { api.cuMemFreeAsync(dp[i], own); });
    api.cuStreamSynchronize(own);
    api.cuMemPoolDestroy(pool);
  } else if (what == "cuMemFreeAsync") {
    CUmemoryPool pool = nullptr;
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = static_cast<int>(ordinal);
    cb::check(api.cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
    sample(state, busy,
           [&](int i) { cb::check(api.cuMemAllocFromPoolAsync(&dp[i], device_bytes, pool, own), "cuMemAllocFromPoolAsync"); },
           [&](int i) { api.cuMemFreeAsync(dp[i], own); }, nothing);
    api.cuStreamSynchronize(own);
    api.cuMemPoolDestroy(pool);
  } else if (what == "cuMemHostAlloc") {
    sample(state, busy, nothing, [&](int i) { hp[i] = raw.host_alloc(host_bytes); },
           [&](int i) { api.cuMemFreeHost(hp[i]); });
  } else if (what == "cuMemFreeHost") {
    sample(state, busy, [&](int i) { hp[i] = raw.host_alloc(host_bytes); },
           [&](int i) { api.cuMemFreeHost(hp[i]); }, nothing);
  } else if (what == "cuStreamCreate") {
    sample(state, busy, nothing, [&](int i) { sp[i] = raw.make_stream(); },
           [&](int i) { api.cuStreamDestroy(sp[i]); });
  } else if (what == "cuStreamDestroy") {
    sample(state, busy, [&](int i) { sp[i] = raw.make_stream(); },
           [&](int i) { api.cuStreamDestroy(sp[i]); }, nothing);
  }
  api.cuStreamDestroy(own);
}
#endif

void raw_cpu(benchmark::State& state, std::size_t index, const std::string& what) {
  figure = what;
  auto& rt = cb::shared_runtime(cora::completion_policy::hybrid);
  auto& d = rt.device(index);
  busy_device busy(d, cb::test_kernels(cora::completion_policy::hybrid, index));
  const int n = samples();
  std::vector<void*> p(static_cast<std::size_t>(n));
  const std::size_t bytes = what.find("host") != std::string::npos ? host_bytes : device_bytes;
  if (what.rfind("malloc", 0) == 0) {
    sample(state, busy, nothing, [&](int i) { p[i] = std::malloc(bytes); benchmark::DoNotOptimize(p[i]); },
           [&](int i) { std::free(p[i]); });
  } else {
    sample(state, busy, [&](int i) { p[i] = std::malloc(bytes); benchmark::DoNotOptimize(p[i]); },
           [&](int i) { std::free(p[i]); }, nothing);
  }
}

const bool registered = cb::at_start([] {
  for (const auto& d : cb::devices()) {
    const std::string base = "resource/" + d.tag + "/";
    for (const char* what : {"alloc", "free", "alloc_host", "free_host", "make_stream", "destroy_stream",
                             "event", "drop_binary", "load_binary_call", "copy_4k", "copy_4k_round_trip"})
      cb::register_once(base + what + "/cora", cora_call, d.index, std::string(what));
#if defined(CORA_HAS_CUDA)
    if (d.backend == cora::backend_kind::cuda) {
      for (const char* what : {"cuMemAlloc", "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemHostAlloc",
                               "cuMemFreeHost", "cuStreamCreate", "cuStreamDestroy"})
        cb::register_once(base + what + "/raw", raw_gpu, d.index, d.ordinal, std::string(what));
      cb::compare(base + "alloc/cora", base + "cuMemAlloc/raw", "p99_us");
      cb::compare(base + "free/cora", base + "cuMemFree/raw", "p99_us");
      cb::compare(base + "alloc_host/cora", base + "cuMemHostAlloc/raw", "p99_us");
      cb::compare(base + "free_host/cora", base + "cuMemFreeHost/raw", "p99_us");
      cb::compare(base + "make_stream/cora", base + "cuStreamCreate/raw", "p99_us");
      cb::compare(base + "destroy_stream/cora", base + "cuStreamDestroy/raw", "p99_us");
    }
#endif
    if (d.backend == cora::backend_kind::cpu) {
      for (const char* what : {"malloc", "free", "malloc_host", "free_host"})
        cb::register_once(base + what + "/raw", raw_cpu, d.index, std::string(what));
      cb::compare(base + "alloc/cora", base + "malloc/raw", "p99_us");
      cb::compare(base + "free/cora", base + "free/raw", "p99_us");
    }
  }
});

}  // namespace
