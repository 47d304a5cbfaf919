// A file into device memory: cora's overlapped path (stream::read_file: reads and
// host-to-device copies overlapped through pinned staging buffers) against the serial path
// (pread the whole range into pinned memory, then one copy), with each stage alone for
// reference. Page cache warm, and cold where the file's pages can be evicted.
//
// Environment: CORA_BENCH_DIR (where the file goes; default $TMPDIR or /tmp),
// CORA_BENCH_FILE_MB (default 1024). The file is removed at exit.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cora/cora.hpp"

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t serial_read_bytes = 4 * mib;  // pread size of the serial path

std::size_t file_bytes() {
  const char* mb = std::getenv("CORA_BENCH_FILE_MB");
  return (mb ? std::strtoull(mb, nullptr, 10) : 1024) * mib;
}

/// The file, the runtime and the buffers, made once for every benchmark.
struct setup {
  std::filesystem::path dir;
  std::filesystem::path file;
  std::size_t size = file_bytes();
  cora::runtime rt;
  cora::device& dev = rt.default_device();
  cora::stream stream = dev.make_stream();
  cora::device_buffer<std::byte> device = dev.alloc<std::byte>(size);
  cora::host_buffer<std::byte> pinned = dev.alloc_host<std::byte>(size);

  setup() {
    const char* base = std::getenv("CORA_BENCH_DIR");
    if (!base) base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/cora-bench-XXXXXX";
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    dir = templ;
    file = dir / "file_to_device.bin";
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    std::vector<unsigned char> block(16 * mib);
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<unsigned char>(i * 131);
    for (std::size_t at = 0; at < size; at += block.size())
      if (::pwrite(fd, block.data(), std::min(block.size(), size - at), static_cast<off_t>(at)) < 0)
        throw std::runtime_error("cannot write the benchmark file");
    ::fsync(fd);
    ::close(fd);
    // Touch the destinations once so that no run pays their first-touch faults.
    stream.fill(device, 0).wait();
    std::memset(pinned.data(), 0, size);
    // One pass of each path, so that no benchmark pays a first run's costs (the device's
    // threads, staging buffers, the kernel's first faults).
    pread_all();
    stream.copy(device, pinned).wait();
    stream.read_file(device.data(), file, 0, size).wait();
  }
  ~setup() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  /// Fraction of the file's pages in the page cache.
  double resident() const {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return -1;
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> vec((size + page - 1) / page);
    std::size_t in = 0;
    if (::mincore(map, size, vec.data()) == 0)
      for (unsigned char v : vec) in += v & 1;
    ::munmap(map, size);
    return static_cast<double>(in) / static_cast<double>(vec.size());
  }

  /// Reads the file through the page cache so that it is all resident.
  void warm() {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    std::vector<std::byte> buf(16 * mib);
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
  }

  /// Evicts the file's pages: POSIX_FADV_DONTNEED (clean pages, this file only), else
  /// /proc/sys/vm/drop_caches where it is writable. False when neither worked.
  bool evict() {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (resident() < 0.01) return true;
    if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
      std::fputs("1\n", f);
      std::fclose(f);
    }
    return resident() < 0.01;
  }

  /// Brings the cache into the state a benchmark asks for; false (with an error set) if not.
  bool prepare(benchmark::State& state, bool cold) {
    if (cold) {
      if (!evict()) {
        state.SkipWithError("cannot evict the file from the page cache here");
        return false;
      }
    } else if (resident() < 0.99) {
      warm();
    }
    return true;
  }

  /// pread of the whole file into pinned memory.
  void pread_all() {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    for (std::size_t at = 0; at < size;) {
      const ssize_t n = ::pread(fd, pinned.data() + at, std::min(serial_read_bytes, size - at),
                                static_cast<off_t>(at));
      if (n <= 0) throw std::runtime_error("pread failed");
      at += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }
};

std::unique_ptr<setup>& owner() {
  static std::unique_ptr<setup> p;
  return p;
}
setup& the_setup() {
  if (!owner()) owner() = std::make_unique<setup>();
  return *owner();
}

/// Times the timed part of each iteration, for a GB/s (10^9 bytes) column.
class rate {
 public:
  void start() { t0_ = std::chrono::steady_clock::now(); }
  void stop() { seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  void report(benchmark::State& state, std::size_t bytes) const {
    if (seconds_ > 0)
      state.counters["GB/s"] = static_cast<double>(bytes) * static_cast<double>(state.iterations()) /
                               seconds_ / 1e9;
  }

 private:
  std::chrono::steady_clock::time_point t0_;
  double seconds_ = 0;
};

/// Runs the benchmark's iterations: the file made ready (cache warm or evicted) outside the
/// timing, then `body` timed; reports GB/s of the file's size.
template <class Body>
void run_timed(benchmark::State& state, setup& s, bool cold, Body body) {
  rate r;
  for (auto _ : state) {
    state.PauseTiming();
    if (!s.prepare(state, cold)) break;
    state.ResumeTiming();
    r.start();
    body();
    r.stop();
  }
  r.report(state, s.size);
}

/// cora's path: stream::read_file. Args: cold, direct, chunk MiB, depth.
void overlapped(benchmark::State& state) {
  auto& s = the_setup();
  cora::read_options o;
  const bool cold = state.range(0) != 0;
  o.direct = state.range(1) != 0;
  o.chunk_bytes = static_cast<std::size_t>(state.range(2)) * mib;
  o.depth = static_cast<unsigned>(state.range(3));
  run_timed(state, s, cold, [&] { s.stream.read_file(s.device.data(), s.file, 0, s.size, o).wait(); });
}

/// The serial path: pread everything into pinned memory, then one host-to-device copy.
void serial(benchmark::State& state) {
  auto& s = the_setup();
  run_timed(state, s, state.range(0) != 0, [&] {
    s.pread_all();
    s.stream.copy(s.device, s.pinned).wait();
  });
}

/// The file stage alone: pread into pinned memory.
void read_stage(benchmark::State& state) {
  auto& s = the_setup();
  run_timed(state, s, state.range(0) != 0, [&] { s.pread_all(); });
}

/// The copy stage alone: pinned memory to the device.
void copy_stage(benchmark::State& state) {
  auto& s = the_setup();
  rate r;
  for (auto _ : state) {
    r.start();
    s.stream.copy(s.device, s.pinned).wait();
    r.stop();
  }
  r.report(state, s.size);
}

void common(benchmark::internal::Benchmark* b) {
  b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
}

BENCHMARK(overlapped)
    ->ArgNames({"cold", "direct", "chunk_mib", "depth"})
    ->Args({0, 0, 4, 4})
    ->Args({0, 1, 4, 4})
    ->Args({0, 0, 16, 4})
    ->Args({1, 0, 4, 4})
    ->Args({1, 1, 4, 4})
    ->Args({1, 1, 16, 4})
    ->Apply(common);
BENCHMARK(serial)->ArgName("cold")->Arg(0)->Arg(1)->Apply(common);
BENCHMARK(read_stage)->ArgName("cold")->Arg(0)->Arg(1)->Apply(common);
BENCHMARK(copy_stage)->Apply(common);

/// Prints the runs as usual and remembers their times for the summary.
class summary_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    // The best repetition: on a shared machine the others mostly measure the neighbours.
    for (const auto& r : runs) {
      if (r.error_occurred || r.iterations == 0 || r.run_type != Run::RT_Iteration) continue;
      const double t = r.real_accumulated_time / static_cast<double>(r.iterations);
      auto [it, added] = seconds_.try_emplace(r.benchmark_name(), t);
      if (!added) it->second = std::min(it->second, t);
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void print_summary(std::size_t bytes) const {
    auto gbs = [&](const std::string& name) {
      auto it = seconds_.find(name);
      return it == seconds_.end() ? 0.0 : static_cast<double>(bytes) / it->second / 1e9;
    };
    std::printf("\nSummary, best repetition (%.2f GB, GB/s; ratio = overlapped / serial\n"
                "pread-then-copy; efficiency = overlapped / slower stage alone)\n",
                static_cast<double>(bytes) / 1e9);
    for (int cold = 0; cold < 2; ++cold) {
      const std::string c = std::to_string(cold);
      const double serial_rate = gbs("serial/cold:" + c + "/iterations:3/real_time");
      const double read_rate = gbs("read_stage/cold:" + c + "/iterations:3/real_time");
      const double copy_rate = gbs("copy_stage/iterations:3/real_time");
      const double slower = std::min(read_rate, copy_rate);
      std::printf("%s cache: serial %.2f, read stage %.2f, copy stage %.2f\n",
                  cold ? "cold" : "warm", serial_rate, read_rate, copy_rate);
      for (const auto& [name, sec] : seconds_) {
        if (name.rfind("overlapped/cold:" + c + "/", 0) != 0) continue;
        const double rate = gbs(name);
        std::printf("  %-55s %6.2f GB/s  ratio %.2fx  efficiency %.0f%%\n", name.c_str(), rate,
                    serial_rate > 0 ? rate / serial_rate : 0.0,
                    slower > 0 ? 100.0 * rate / slower : 0.0);
      }
    }
  }

 private:
  std::map<std::string, double> seconds_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  auto& s = the_setup();
  benchmark::AddCustomContext("device", s.dev.name());
  benchmark::AddCustomContext("io_backend", cora::io_backend_detail());
  benchmark::AddCustomContext("file", s.file.string() + " (" + std::to_string(s.size / mib) + " MiB)");
  summary_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary(s.size);
  benchmark::Shutdown();
  owner().reset();  // removes the file; the runtime goes before the statics are destroyed
  return 0;
}
