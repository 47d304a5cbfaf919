// cora-roundtrip: the round trip of an empty kernel launch awaited through cora, beside the
// raw CUDA driver doing the same, in one process (so the ratios hold whatever the machine).
//
//   raw event:    cuLaunchKernel + cuEventRecord, then a busy cuEventQuery loop
//   raw counter:  cuLaunchKernel + cuStreamWriteValue32 into host-mapped memory, busy load
//   raw callback: cuLaunchKernel + cuLaunchHostFunc setting a flag, busy load
//   raw sync:     cuLaunchKernel + cuStreamSynchronize
//   cora:         `co_await s.launch(empty)` in a task on sync_wait's io_context (its own
//                 thread polls), for each marker kind (auto, the default, event, counter)
//                 and completion policy; and `.wait()`
//   alternately:  the raw event round trip and cora's `co_await` (spin, hybrid) taken in
//                 turn in one loop, the pairs the goals read
//
// Prints p50/p99 in microseconds and, with --json, writes them to a file.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <cora/cora.hpp>

#include "backend/cuda/cuda_driver.hpp"
#include "core/binary_format.hpp"
#include "io/file_reader.hpp"

namespace {

namespace cuda = cora::backend::cuda;
using clock_type = std::chrono::steady_clock;

struct result {
  std::string name;
  double p50 = 0, p99 = 0, mean = 0;
};

result summarize(std::string name, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  result r{std::move(name)};
  if (us.empty()) return r;
  r.p50 = us[us.size() / 2];
  r.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  double sum = 0;
  for (double v : us) sum += v;
  r.mean = sum / static_cast<double>(us.size());
  return r;
}

double since_us(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "cora-roundtrip: %s\n", what.c_str());
  std::exit(1);
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) die(std::string(what) + ": " + cuda::describe(r));
}

// The raw driver on device 0's primary context, with the `empty` kernel of a fatbin.
class raw_driver {
 public:
  raw_driver(const cuda::driver_api& api, const std::vector<std::byte>& fatbin) : api_(api) {
    check(api_.cuInit(0), "cuInit");
    check(api_.cuDeviceGet(&dev_, 0), "cuDeviceGet");
    check(api_.cuDevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
    check(api_.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    check(api_.cuModuleLoadDataEx(&module_, fatbin.data(), 0, nullptr, nullptr), "cuModuleLoadDataEx");
    unsigned count = 0;
    check(api_.cuModuleGetFunctionCount(&count, module_), "cuModuleGetFunctionCount");
    std::vector<CUfunction> fs(count);
    check(api_.cuModuleEnumerateFunctions(fs.data(), count, module_), "cuModuleEnumerateFunctions");
    for (CUfunction f : fs) {
      const char* name = nullptr;
      if (api_.cuFuncGetName(&name, f) == CUDA_SUCCESS && std::string(name) == "empty") empty_ = f;
    }
    if (!empty_) die("no kernel 'empty' in the image");
    check(api_.cuStreamCreateWithPriority(&stream_, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreate");
    check(api_.cuEventCreate(&event_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    void* p = nullptr;
    check(api_.cuMemHostAlloc(&p, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc");
    slot_ = static_cast<std::uint32_t*>(p);
    check(api_.cuMemHostGetDevicePointer(&device_slot_, p, 0), "cuMemHostGetDevicePointer");
  }
  ~raw_driver() {
    api_.cuCtxSetCurrent(ctx_);
    api_.cuStreamSynchronize(stream_);
    api_.cuEventDestroy(event_);
    api_.cuStreamDestroy(stream_);
    api_.cuMemFreeHost(slot_);
    api_.cuModuleUnload(module_);
    api_.cuDevicePrimaryCtxRelease(dev_);
  }

  void launch() { check(api_.cuLaunchKernel(empty_, 1, 1, 1, 1, 1, 1, 0, stream_, nullptr, nullptr), "cuLaunchKernel"); }

  /// One launch + event record + busy cuEventQuery, in microseconds.
  double event_roundtrip() {
    const auto t0 = clock_type::now();
    launch();
    check(api_.cuEventRecord(event_, stream_), "cuEventRecord");
    CUresult r;
    while ((r = api_.cuEventQuery(event_)) == CUDA_ERROR_NOT_READY) {
    }
    check(r, "cuEventQuery");
    return since_us(t0);
  }

  std::vector<double> event_roundtrips(int n) {
    std::vector<double> out;
    for (int i = 0; i < n; ++i) out.push_back(event_roundtrip());
    return out;
  }

  std::vector<double> counter_roundtrips(int n) {
    std::vector<double> out;
    for (int i = 0; i < n; ++i) {
      const auto t0 = clock_type::now();
      launch();
      const auto want = ++seq_;
      check(api_.cuStreamWriteValue32(stream_, device_slot_, want, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32");
      while (__atomic_load_n(slot_, __ATOMIC_ACQUIRE) != want) {
      }
      out.push_back(since_us(t0));
    }
    return out;
  }

  std::vector<double> callback_roundtrips(int n) {
    std::vector<double> out;
    std::atomic<int> flag{0};
    for (int i = 0; i < n; ++i) {
      flag.store(0, std::memory_order_relaxed);
      const auto t0 = clock_type::now();
      launch();
      check(api_.cuLaunchHostFunc(
                stream_, [](void* f) { static_cast<std::atomic<int>*>(f)->store(1, std::memory_order_release); },
                &flag),
            "cuLaunchHostFunc");
      while (flag.load(std::memory_order_acquire) == 0) {
      }
      out.push_back(since_us(t0));
    }
    return out;
  }

  std::vector<double> sync_roundtrips(int n) {
    std::vector<double> out;
    for (int i = 0; i < n; ++i) {
      const auto t0 = clock_type::now();
      launch();
      check(api_.cuStreamSynchronize(stream_), "cuStreamSynchronize");
      out.push_back(since_us(t0));
    }
    return out;
  }

  /// Host time of back-to-back launches, per launch.
  double launch_cost_us(int n) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < n; ++i) launch();
    const double us = since_us(t0) / n;
    check(api_.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    return us;
  }

 private:
  const cuda::driver_api& api_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction empty_ = nullptr;
  CUstream stream_ = nullptr;
  CUevent event_ = nullptr;
  std::uint32_t* slot_ = nullptr;
  CUdeviceptr device_slot_ = 0;
  std::uint32_t seq_ = 0;
};

struct cora_results {
  std::vector<double> awaited, blocking;
  double launch_cost_us = 0;
};

/// cora on CUDA device 0 with one completion policy and marker kind: the binary's `empty`
/// kernel and a stream.
struct cora_side {
  cora_side(const std::string& binary, cora::completion_policy policy, const char* marker)
      : rt(options(policy, marker)),
        bin(rt.device(0).load_binary(std::filesystem::path(binary)).wait()),
        empty(bin.kernel("empty")),
        s(rt.device(0).make_stream()) {
    ::unsetenv("CORA_CUDA_MARKER");
  }

  // The backend reads the marker kind from the environment while the runtime is made, once.
  static cora::runtime_options options(cora::completion_policy policy, const char* marker) {
    ::setenv("CORA_CUDA_MARKER", marker, 1);
    cora::runtime_options o;
    o.use_environment = false;
    o.backend = cora::backend_selection::cuda;
    o.completion = policy;
    return o;
  }

  cora::runtime rt;
  cora::binary bin;
  cora::kernel empty;
  cora::stream s;
};

cora_results cora_roundtrips(const std::string& binary, cora::completion_policy policy, const char* marker,
                             int n, int warmup) {
  cora_side c(binary, policy, marker);
  auto& empty = c.empty;
  auto& s = c.s;
  cora_results out;
  cora::sync_wait([&]() -> cora::task<void> {
    for (int i = 0; i < warmup; ++i) co_await s.launch(empty, {});
    out.awaited.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      const auto t0 = clock_type::now();
      co_await s.launch(empty, {});
      out.awaited.push_back(since_us(t0));
    }
  }());
  for (int i = 0; i < n; ++i) {
    const auto t0 = clock_type::now();
    s.launch(empty, {}).wait();
    out.blocking.push_back(since_us(t0));
  }
  const auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) (void)(void)s.launch(empty, {});
  out.launch_cost_us = since_us(t0) / n;
  s.synchronize().wait();
  return out;
}

// The raw event round trip and cora's `co_await` (auto markers) alternately on one thread, raw
// first in even rounds: both meet the same machine, where phases run one after the other drift
// apart by more than the goals' margin (the thread's core and clock, the driver's state).
std::pair<std::vector<double>, std::vector<double>> paired_roundtrips(raw_driver& raw, const std::string& binary,
                                                                      cora::completion_policy policy, int n,
                                                                      int warmup) {
  cora_side c(binary, policy, "auto");
  auto& empty = c.empty;
  auto& s = c.s;
  std::pair<std::vector<double>, std::vector<double>> out;
  out.first.reserve(static_cast<std::size_t>(n));
  out.second.reserve(static_cast<std::size_t>(n));
  cora::sync_wait([&]() -> cora::task<void> {
    for (int i = 0; i < warmup; ++i) {
      (void)raw.event_roundtrip();
      co_await s.launch(empty, {});
    }
    for (int i = 0; i < n; ++i) {
      if (i % 2 == 0) out.first.push_back(raw.event_roundtrip());
      const auto t0 = clock_type::now();
      co_await s.launch(empty, {});
      out.second.push_back(since_us(t0));
      if (i % 2 != 0) out.first.push_back(raw.event_roundtrip());
    }
  }());
  s.synchronize().wait();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Round trip of an empty launch awaited through cora, beside the raw CUDA driver"};
  std::string binary;
  std::string json;
  int n = 4000, warmup = 500;
  app.add_option("--kernels", binary, "test_kernels.corabin (holds the kernel 'empty')")->required();
  app.add_option("-n,--iterations", n, "Round trips per measurement");
  app.add_option("--json", json, "Also write the results to this file");
  CLI11_PARSE(app, argc, argv);

  std::string reason;
  const cuda::driver_api* api = cuda::driver(reason);
  if (!api) die(reason);
  std::error_code ec;
  std::string message;
  const auto bytes = cora::detail::read_whole_file_sync(binary, ec, message);
  if (ec) die(message);
  const auto container = cora::detail::parse_corabin(bytes, ec, message);
  if (ec) die(message);
  std::vector<std::byte> fatbin;
  for (const auto& img : container.images)
    if (img.kind == cora::detail::binary_kind::cuda_fatbin) fatbin.assign(img.bytes.begin(), img.bytes.end());
  if (fatbin.empty()) die("no fatbin in " + binary);

  std::vector<result> results;
  double raw_launch = 0;
  std::vector<std::pair<std::string, double>> launch_costs;
  {
    raw_driver raw(*api, fatbin);
    raw.event_roundtrips(warmup);
    results.push_back(summarize("raw launch + event record + busy cuEventQuery", raw.event_roundtrips(n)));
    results.push_back(summarize("raw launch + cuStreamWriteValue32 + busy load", raw.counter_roundtrips(n)));
    results.push_back(summarize("raw launch + cuLaunchHostFunc + busy flag", raw.callback_roundtrips(n)));
    results.push_back(summarize("raw launch + cuStreamSynchronize", raw.sync_roundtrips(n)));
    raw_launch = raw.launch_cost_us(20000);
  }
  struct config {
    cora::completion_policy policy;
    const char* marker;
  };
  for (const config c : {config{cora::completion_policy::spin, "auto"}, config{cora::completion_policy::spin, "event"},
                         config{cora::completion_policy::spin, "counter"}, config{cora::completion_policy::hybrid, "auto"},
                         config{cora::completion_policy::hybrid, "event"}, config{cora::completion_policy::hybrid, "counter"},
                         config{cora::completion_policy::callback, "event"}}) {
    const std::string label = std::string(cora::to_string(c.policy)) +
                              (c.policy == cora::completion_policy::callback ? "" : std::string(", ") + c.marker + " markers");
    const auto r = cora_roundtrips(binary, c.policy, c.marker, n, warmup);
    results.push_back(summarize("cora co_await launch (" + label + ")", r.awaited));
    results.push_back(summarize("cora launch().wait() (" + label + ")", r.blocking));
    launch_costs.emplace_back(label, r.launch_cost_us);
  }
  {
    raw_driver raw(*api, fatbin);
    results.push_back(summarize("raw launch + event record + busy cuEventQuery (again)", raw.event_roundtrips(n)));
    for (auto policy : {cora::completion_policy::spin, cora::completion_policy::hybrid}) {
      const std::string p = cora::to_string(policy);
      auto [raw_us, cora_us] = paired_roundtrips(raw, binary, policy, n, warmup);
      results.push_back(summarize("raw launch + event record + busy cuEventQuery (alternately, " + p + ")", raw_us));
      results.push_back(summarize("cora co_await launch (" + p + ", auto markers, alternately)", cora_us));
    }
  }

  const double base = results[0].p50;
  std::printf("%-64s %9s %9s %9s %7s\n", "empty-kernel round trip (us)", "p50", "p99", "mean", "p50/raw");
  for (const auto& r : results)
    std::printf("%-64s %9.2f %9.2f %9.2f %7.2f\n", r.name.c_str(), r.p50, r.p99, r.mean, r.p50 / base);
  std::printf("\nhost cost per launch, back to back (us): raw cuLaunchKernel %.2f", raw_launch);
  for (const auto& [label, us] : launch_costs) std::printf("; cora (%s) %.2f", label.c_str(), us);
  std::printf("\n");

  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\n  \"iterations\": " << n << ",\n  \"raw_launch_us\": " << raw_launch << ",\n  \"roundtrips\": [\n";
    for (std::size_t i = 0; i < results.size(); ++i)
      f << "    {\"name\": \"" << results[i].name << "\", \"p50_us\": " << results[i].p50
        << ", \"p99_us\": " << results[i].p99 << ", \"mean_us\": " << results[i].mean << "}"
        << (i + 1 < results.size() ? "," : "") << "\n";
    f << "  ],\n  \"launch_cost_us\": [\n";
    for (std::size_t i = 0; i < launch_costs.size(); ++i)
      f << "    {\"config\": \"" << launch_costs[i].first << "\", \"us\": " << launch_costs[i].second << "}"
        << (i + 1 < launch_costs.size() ? "," : "") << "\n";
    f << "  ]\n}\n";
  }
  return 0;
}
