// Shared pieces of cora's benchmarks: latency percentiles as counters, the devices to run on,
// sizes from the environment, CPU time, and a main() that prints each cora result as a ratio
// against the raw baseline measured in the same run.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cora/binary.hpp>
#include <cora/runtime.hpp>

namespace cora::bench {

/// Collects per-operation latencies and reports p50/p99 (microseconds) as counters.
class latencies {
 public:
  explicit latencies(std::size_t expected = 1 << 16) { samples_.reserve(expected); }
  void add(std::chrono::steady_clock::duration d) {
    samples_.push_back(std::chrono::duration<double, std::micro>(d).count());
  }
  void add_us(double us) { samples_.push_back(us); }
  std::size_t size() const noexcept { return samples_.size(); }
  /// The q-quantile in microseconds (0 when empty).
  double at(double q) {
    if (samples_.empty()) return 0;
    std::sort(samples_.begin(), samples_.end());
    return samples_[static_cast<std::size_t>(q * static_cast<double>(samples_.size() - 1))];
  }
  void report(benchmark::State& state, const std::string& prefix = "") {
    if (samples_.empty()) return;
    state.counters[prefix + "p50_us"] = at(0.50);
    state.counters[prefix + "p99_us"] = at(0.99);
  }

 private:
  std::vector<double> samples_;
};

/// Registers a pair "<group>/<raw name>" and "<group>/<cora name>" whose p50 ratio main() prints.
void compare(const std::string& cora_benchmark, const std::string& raw_benchmark,
             const std::string& counter = "p50_us", bool higher_is_better = false);

/// Runs `fn` in main() after benchmark::Initialize, before the benchmarks run: the place to
/// register benchmarks per device. Returns true (for use in a static initializer).
bool at_start(std::function<void()> fn);

/// A device the benchmarks run on: runtime device `index`, named `tag` ("cuda0", "cpu0").
struct bench_device {
  std::size_t index = 0;
  std::string tag;
  backend_kind backend{};
  std::size_t ordinal = 0;  ///< index among the devices of its backend (the CUDA ordinal)
};

/// Every device present (GPUs first, then the CPU device), minus those CORA_BENCH_DEVICES
/// leaves out (a comma list of tags or backends: "cpu", "cuda0").
const std::vector<bench_device>& devices();

/// A runtime over the same devices, with completion policy `p` (environment ignored).
runtime_options options_for(completion_policy p);

/// Runs `fn` and turns an exception into a skipped benchmark with its message, so one failing
/// benchmark neither ends the program nor spoils the JSON output of the others.
template <class F>
void guarded(benchmark::State& state, F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// Runs fn(i) for i in [0, n) on n threads and joins them; rethrows the first exception one of
/// them threw.
template <class F>
void on_threads(int n, F fn) {
  std::exception_ptr first;
  std::mutex m;
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

/// Registers `name` running f(state, args...) once (the function runs its own loop and sets
/// its counters), timed in real time, reported in milliseconds.
template <class F, class... A>
benchmark::internal::Benchmark* register_once(const std::string& name, F f, A... args) {
  return benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { guarded(s, [&] { f(s, args...); }); })
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

/// A runtime with completion policy `p`, made on first use and kept until release_shared()
/// (making one per benchmark would cost a context set-up each time).
runtime& shared_runtime(completion_policy p);

/// test_kernels.corabin loaded on device `index` of shared_runtime(p).
const binary& test_kernels(completion_policy p, std::size_t index);

/// Destroys the shared runtimes (main() calls it after the benchmarks).
void release_shared();

/// Integer / floating setting from the environment, `fallback` when unset or empty.
long env_long(const char* name, long fallback);
double env_double(const char* name, double fallback);

/// The folder with the built kernel images: CORA_TEST_KERNELS_DIR, else the build's own.
std::string kernels_dir();

/// CPU seconds (user + system) of the whole process so far (getrusage).
double process_cpu_seconds();

/// Seconds since `t0` on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace cora::bench
