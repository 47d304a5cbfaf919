// Shared pieces of cora's benchmarks: latency percentiles as counters, and a main() that prints
// each cora result as a ratio against the raw baseline measured in the same run.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace cora::bench {

/// Collects per-operation latencies and reports p50/p99 (microseconds) as counters.
class latencies {
 public:
  explicit latencies(std::size_t expected = 1 << 16) { samples_.reserve(expected); }
  void add(std::chrono::steady_clock::duration d) {
    samples_.push_back(std::chrono::duration<double, std::micro>(d).count());
  }
  void report(benchmark::State& state) {
    if (samples_.empty()) return;
    std::sort(samples_.begin(), samples_.end());
    auto at = [&](double q) { return samples_[static_cast<std::size_t>(q * static_cast<double>(samples_.size() - 1))]; };
    state.counters["p50_us"] = at(0.50);
    state.counters["p99_us"] = at(0.99);
  }

 private:
  std::vector<double> samples_;
};

/// Registers a pair "<group>/<raw name>" and "<group>/<cora name>" whose p50 ratio main() prints.
void compare(const std::string& cora_benchmark, const std::string& raw_benchmark,
             const std::string& counter = "p50_us", bool higher_is_better = false);

}  // namespace cora::bench
