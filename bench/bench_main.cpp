// main() of every cora benchmark: runs them, then prints the registered cora/raw ratios.
#include <cstdio>
#include <functional>
#include <map>

#include "bench_support.hpp"

namespace cora::bench {

namespace {

struct comparison {
  std::string cora, raw, counter;
  bool higher_is_better;
};

std::vector<comparison>& comparisons() {
  static std::vector<comparison> c;
  return c;
}

std::vector<std::function<void()>>& start_hooks() {
  static std::vector<std::function<void()>> h;
  return h;
}

class recording_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      auto& m = results[r.benchmark_name()];
      for (const auto& [name, c] : r.counters) m[name] = c.value;
      m["real_time"] = r.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, std::map<std::string, double>> results;
};

}  // namespace

void compare(const std::string& cora_benchmark, const std::string& raw_benchmark,
             const std::string& counter, bool higher_is_better) {
  comparisons().push_back({cora_benchmark, raw_benchmark, counter, higher_is_better});
}

bool at_start(std::function<void()> fn) {
  start_hooks().push_back(std::move(fn));
  return true;
}

}  // namespace cora::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (auto& hook : cora::bench::start_hooks()) hook();
  cora::bench::recording_reporter console;
  benchmark::RunSpecifiedBenchmarks(&console);
  bool header = false;
  for (const auto& c : cora::bench::comparisons()) {
    auto a = console.results.find(c.cora), b = console.results.find(c.raw);
    if (a == console.results.end() || b == console.results.end()) continue;
    auto va = a->second.find(c.counter), vb = b->second.find(c.counter);
    if (va == a->second.end() || vb == b->second.end() || vb->second == 0) continue;
    if (!header) {
      std::printf("\n%-60s %-40s %10s %10s %8s\n", "cora", "raw (same run)", "cora", "raw", "ratio");
      header = true;
    }
    std::printf("%-60s %-40s %10.3f %10.3f %7.3fx  (%s%s)\n", c.cora.c_str(), c.raw.c_str(), va->second,
                vb->second, va->second / vb->second, c.counter.c_str(),
                c.higher_is_better ? ", higher is better" : ", lower is better");
  }
  cora::bench::release_shared();
  benchmark::Shutdown();
  return 0;
}
