// The device list, environment settings and CPU time of bench_support.hpp.
#include "bench_support.hpp"

#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

namespace cora::bench {

namespace {

bool wanted(const bench_device& d, const char* filter) {
  if (!filter || !*filter) return true;
  std::stringstream in(filter);
  std::string item;
  const char* backend = d.backend == backend_kind::cuda ? "cuda" : "cpu";
  while (std::getline(in, item, ','))
    if (item == d.tag || item == backend) return true;
  return false;
}

struct shared_state {
  std::map<completion_policy, std::unique_ptr<runtime>> runtimes;
  std::map<std::pair<completion_policy, std::size_t>, binary> binaries;
};

shared_state& shared() {
  static shared_state s;
  return s;
}

}  // namespace

runtime& shared_runtime(completion_policy p) {
  auto& r = shared().runtimes[p];
  if (!r) r = std::make_unique<runtime>(options_for(p));
  return *r;
}

const binary& test_kernels(completion_policy p, std::size_t index) {
  auto [it, fresh] = shared().binaries.try_emplace({p, index});
  if (fresh)
    it->second = shared_runtime(p).device(index).load_binary(std::filesystem::path(kernels_dir()) / "test_kernels.corabin").wait();
  return it->second;
}

void release_shared() {
  shared().binaries.clear();
  shared().runtimes.clear();
}

runtime_options options_for(completion_policy p) {
  runtime_options o;
  o.use_environment = false;
  o.completion = p;
  if (const char* units = std::getenv("CORA_CPU_UNITS"); units && *units)
    o.cpu_compute_units = static_cast<unsigned>(std::atoi(units));
  return o;
}

const std::vector<bench_device>& devices() {
  static const std::vector<bench_device> list = [] {
    std::vector<bench_device> out;
    runtime rt(options_for(completion_policy::hybrid));
    std::size_t cuda = 0, cpu = 0;
    for (std::size_t i = 0; i < rt.device_count(); ++i) {
      bench_device d;
      d.index = i;
      d.backend = rt.device(i).backend();
      d.ordinal = d.backend == backend_kind::cuda ? cuda++ : cpu++;
      d.tag = (d.backend == backend_kind::cuda ? "cuda" : "cpu") + std::to_string(d.ordinal);
      if (wanted(d, std::getenv("CORA_BENCH_DEVICES"))) out.push_back(d);
    }
    return out;
  }();
  return list;
}

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtod(v, nullptr) : fallback;
}

std::string kernels_dir() {
  const char* v = std::getenv("CORA_TEST_KERNELS_DIR");
  return v && *v ? v : CORA_BENCH_KERNELS_DIR;
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

}  // namespace cora::bench
