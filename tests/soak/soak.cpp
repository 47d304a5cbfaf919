// The soak: coroutines doing random mixes of copies, launches, event waits, cancellations,
// kernel traps, injected copy faults (CPU device) and binary loads/unloads on S streams for D
// seconds. Every op's result is checked and counted; at the end it prints ops done, errors
// expected and seen, lost completions (waits that never completed) and peak RSS, and exits
// non-zero if any result was wrong or any completion was lost. Run it under the ASan build for
// LeakSanitizer's verdict on leaks (scripts/sanitize does).
//
//   soak [--streams S] [--seconds D] [--threads T] [--seed N] [--kernels DIR] [--no-faults]
//        [--no-loads]
#include <sys/resource.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cpu/cpu_device.hpp"
#include "core/state.hpp"
#include "cora/cora.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using cora::errc;
constexpr auto as_tuple = asio::experimental::as_tuple(asio::use_awaitable);

struct counters {
  std::atomic<long> ops{0};              // ops whose results were checked
  std::atomic<long> waits_started{0};    // waits begun (every co_await of a device op)
  std::atomic<long> waits_completed{0};  // waits that completed, with whatever result
  std::atomic<long> expected_errors{0};  // errors the op was meant to produce (trap, unload)
  std::atomic<long> seen_errors{0};      // of those, errors that came with the right code
  std::atomic<long> cancelled{0};        // waits ended by cancellation before their op
  std::atomic<long> injected{0};         // copy faults injected into the device
  std::atomic<long> injected_seen{0};    // copy faults reported by a synchronize
  std::atomic<long> wrong{0};            // wrong data or an unexpected error
  std::atomic<long> copy_fault_pending{0};
  std::atomic<int> workers_running{0};
};

struct config {
  unsigned streams = 4;
  double seconds = 10;
  unsigned threads = 2;
  unsigned seed = 1;
  std::string kernels;
  bool faults = true;
  bool loads = true;
};

class worker {
 public:
  worker(cora::device& dev, const cora::binary& bin, const config& cfg, counters& c, unsigned id)
      : dev_(dev), bin_(bin), cfg_(cfg), c_(c), rng_(cfg.seed * 7919u + id),
        s_(dev.make_stream()), peer_(dev.make_stream()), ev_(dev.make_event()),
        d_(dev.alloc<std::uint32_t>(n)), d2_(dev.alloc<std::uint32_t>(n)),
        h_(dev.alloc_host<std::uint32_t>(n)), src_(dev.alloc_host<std::uint32_t>(n)),
        flag_(dev.alloc<std::uint32_t>(4)) {}

  asio::awaitable<void> run(clock_type::time_point end) {
    while (clock_type::now() < end) {
      const unsigned pick = rng_() % 100;
      if (pick < 30) co_await copy_round_trip();
      else if (pick < 55) co_await launch_and_check();
      else if (pick < 70) co_await event_chain();
      else if (pick < 85) co_await cancel_slow();
      else if (pick < 90 && cfg_.loads) co_await load_unload();
      else if (pick < 95 && cfg_.faults) co_await trap();
      else if (cfg_.faults && cpu_) co_await inject_copy_fault();
      else co_await copy_round_trip();
    }
    // Leave the streams idle and clean.
    co_await sync(s_);
    co_await sync(peer_);
  }

  void set_cpu(cora::backend::cpu::cpu_device* cpu) { cpu_ = cpu; }

 private:
  static constexpr std::size_t n = 4096;

  // Awaits a pending op, counting the wait.
  template <class T>
  asio::awaitable<std::error_code> wait(cora::pending<T> p) {
    c_.waits_started.fetch_add(1, std::memory_order_relaxed);
    auto result = co_await p.async_wait(as_tuple);
    c_.waits_completed.fetch_add(1, std::memory_order_relaxed);
    co_return std::get<0>(result);
  }

  void bad(const char* what, std::error_code ec = {}) {
    c_.wrong.fetch_add(1);
    std::fprintf(stderr, "soak: %s%s%s\n", what, ec ? ": " : "", ec ? ec.message().c_str() : "");
  }

  // An error that is not the op's own: an injected copy fault that landed on this worker's
  // streams (reported by the synchronize of its stream), or a real failure.
  asio::awaitable<bool> ok_or_injected(std::error_code ec, const char* what) {
    if (!ec) co_return true;
    if (ec == errc::copy_fault) {
      co_await sync(s_);
      co_await sync(peer_);
    } else {
      bad(what, ec);
    }
    co_return false;
  }

  // Synchronizes a stream; a copy fault it reports is counted as seen.
  asio::awaitable<void> sync(cora::stream& s) {
    const std::error_code ec = co_await wait(s.synchronize());
    if (ec == errc::copy_fault) {
      c_.injected_seen.fetch_add(1);
      c_.copy_fault_pending.fetch_sub(1);
    } else if (ec) {
      bad("synchronize", ec);
    }
  }

  asio::awaitable<void> copy_round_trip() {
    const std::uint32_t v = static_cast<std::uint32_t>(rng_());
    const std::size_t count = 1 + rng_() % n;
    // Pinned memory is read when the copy runs: the source stays untouched until then.
    for (std::size_t i = 0; i < count; ++i) src_[i] = v + static_cast<std::uint32_t>(i);
    for (std::size_t i = 0; i < count; ++i) h_[i] = 0;
    (void)s_.copy(d_.data(), src_.data(), count * 4);
    const auto ec = co_await wait(s_.copy(h_.data(), d_.data(), count * 4));
    if (!co_await ok_or_injected(ec, "copy")) co_return;
    for (std::size_t i = 0; i < count; ++i)
      if (h_[i] != v + static_cast<std::uint32_t>(i)) co_return bad("copy: wrong data");
    c_.ops.fetch_add(2);
  }

  asio::awaitable<void> launch_and_check() {
    const std::uint32_t grid = 1 + rng_() % 8;
    (void)s_.launch(bin_.kernel("iota_u32"), {.grid = grid}, d_, std::uint64_t{n});
    const auto ec = co_await wait(s_.copy(h_, d_));
    if (!co_await ok_or_injected(ec, "launch")) co_return;
    for (std::size_t i = 0; i < n; i += 97)
      if (h_[i] != i) co_return bad("launch: wrong data");
    c_.ops.fetch_add(2);
  }

  // A fill on the peer stream ordered after a fill on the main stream by an event.
  asio::awaitable<void> event_chain() {
    const std::uint8_t v = static_cast<std::uint8_t>(rng_());
    (void)s_.fill(d2_, v);
    auto recorded = s_.record(ev_);
    (void)peer_.wait(ev_);
    (void)peer_.copy(d_, d2_);
    const auto ec = co_await wait(peer_.copy(h_, d_));
    // A fault of the fill is the main stream's: the peer only sees stale data.
    const auto rec = co_await wait(std::move(recorded));
    if (!co_await ok_or_injected(rec, "event record")) co_return;
    if (!co_await ok_or_injected(ec, "event chain")) co_return;
    if (h_[0] != 0x01010101u * v || h_[n - 1] != 0x01010101u * v)
      co_return bad("event chain: wrong data");
    c_.ops.fetch_add(5);
  }

  // A wait cancelled by a timer while a slow kernel runs: it ends at once with
  // operation_aborted (or with success if the kernel won); the kernel still completes.
  asio::awaitable<void> cancel_slow() {
    auto ex = co_await asio::this_coro::executor;
    auto sig = std::make_shared<asio::cancellation_signal>();
    auto p = s_.launch(bin_.kernel("slow"), {}, std::uint64_t{rng_() % 400}, flag_);
    asio::steady_timer t(ex, std::chrono::microseconds(rng_() % 300));
    t.async_wait([sig](std::error_code ec) {
      if (!ec) sig->emit(asio::cancellation_type::terminal);
    });
    c_.waits_started.fetch_add(1, std::memory_order_relaxed);
    auto [ec] = co_await p.async_wait(asio::bind_cancellation_slot(sig->slot(), as_tuple));
    c_.waits_completed.fetch_add(1, std::memory_order_relaxed);
    t.cancel();
    if (ec == asio::error::operation_aborted) {
      c_.cancelled.fetch_add(1);
      ec = co_await wait(s_.synchronize());  // the kernel ran on
      if (ec == errc::copy_fault) {
        c_.injected_seen.fetch_add(1);
        c_.copy_fault_pending.fetch_sub(1);
        co_return;
      }
    }
    if (!co_await ok_or_injected(ec, "cancelled launch")) co_return;
    c_.ops.fetch_add(1);
  }

  asio::awaitable<void> load_unload() {
    c_.waits_started.fetch_add(1, std::memory_order_relaxed);
    auto loading = dev_.load_binary(cfg_.kernels + "/test_kernels.corabin");
    auto [ec, b] = co_await loading.async_wait(as_tuple);
    c_.waits_completed.fetch_add(1, std::memory_order_relaxed);
    if (ec) co_return bad("load", ec);
    auto k = b.kernel("iota_u32");
    (void)s_.launch(k, {.grid = 2}, d_, std::uint64_t{n});
    b.unload();  // the launch in flight keeps the code alive
    const auto lec = co_await wait(s_.copy(h_, d_));
    if (!co_await ok_or_injected(lec, "launch of an unloaded binary")) co_return;
    if (h_[n - 1] != n - 1) co_return bad("load: wrong data");
    c_.expected_errors.fetch_add(2);
    std::error_code uec;
    (void)b.kernel("iota_u32", uec);
    if (uec == errc::binary_unloaded) c_.seen_errors.fetch_add(1);
    else bad("kernel lookup after unload", uec);
    b.unload(uec);
    if (uec == errc::already_unloaded) c_.seen_errors.fetch_add(1);
    else bad("second unload", uec);
    c_.ops.fetch_add(3);
  }

  asio::awaitable<void> trap() {
    c_.expected_errors.fetch_add(2);
    auto ec = co_await wait(s_.launch(bin_.kernel("trap"), {}, flag_));
    if (ec == errc::kernel_fault) c_.seen_errors.fetch_add(1);
    else if (!co_await ok_or_injected(ec, "trap")) co_return;
    ec = co_await wait(s_.synchronize());
    if (ec == errc::kernel_fault) c_.seen_errors.fetch_add(1);
    else bad("synchronize after a trap", ec);
    c_.ops.fetch_add(1);
  }

  // One copy fault at a time is injected, so each synchronize reports exactly one.
  asio::awaitable<void> inject_copy_fault() {
    long none = 0;
    if (c_.copy_fault_pending.compare_exchange_strong(none, 1)) {
      c_.injected.fetch_add(1);
      cpu_->faults().copy_faults.fetch_add(1);
    }
    co_await copy_round_trip();
  }

  cora::device& dev_;
  const cora::binary& bin_;
  const config& cfg_;
  counters& c_;
  std::mt19937 rng_;
  cora::backend::cpu::cpu_device* cpu_ = nullptr;
  cora::stream s_, peer_;
  cora::event ev_;
  cora::device_buffer<std::uint32_t> d_, d2_;
  cora::host_buffer<std::uint32_t> h_, src_;
  cora::device_buffer<std::uint32_t> flag_;
};

long peak_rss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  CLI::App app{"cora soak: random device work on many streams, every result checked"};
  app.add_option("--streams", cfg.streams, "coroutines, each with a stream and a peer stream");
  app.add_option("--seconds", cfg.seconds, "how long to run");
  app.add_option("--threads", cfg.threads, "threads running the io_context");
  app.add_option("--seed", cfg.seed, "random seed");
  app.add_option("--kernels", cfg.kernels, "folder of test_kernels.corabin");
  bool no_faults = false;
  app.add_flag("--no-faults", no_faults,
               "no traps or injected faults (a GPU context would not survive them)");
  bool no_loads = false;
  app.add_flag("--no-loads", no_loads,
               "no binary loads and unloads (clang 14 TSan fails on memfd descriptors)");
  CLI11_PARSE(app, argc, argv);
  cfg.faults = !no_faults;
  cfg.loads = !no_loads;
  if (cfg.kernels.empty()) {
    const char* dir = std::getenv("CORA_TEST_KERNELS_DIR");
    cfg.kernels = dir && *dir ? dir : CORA_SOAK_KERNELS_DIR;
  }

  counters c;
  long lost = 0;
  std::string backend;
  {
    cora::runtime rt;  // CORA_BACKEND chooses the device
    cora::device& dev = rt.default_device();
    backend = dev.backend() == cora::backend_kind::cuda ? "cuda" : "cpu";
    auto* cpu = dynamic_cast<cora::backend::cpu::cpu_device*>(dev.state()->backend.get());
    if (!cpu && cfg.faults) {
      std::fprintf(stderr, "soak: faults are injected on the CPU device only: use --no-faults\n");
      return 2;
    }
    cora::binary bin = dev.load_binary(cfg.kernels + "/test_kernels.corabin").wait();
    std::vector<std::unique_ptr<worker>> workers;
    for (unsigned i = 0; i < cfg.streams; ++i) {
      workers.push_back(std::make_unique<worker>(dev, bin, cfg, c, i));
      workers.back()->set_cpu(cpu);
    }
    asio::io_context ctx;
    const auto start = clock_type::now();
    const auto end = start + std::chrono::duration_cast<clock_type::duration>(
                                 std::chrono::duration<double>(cfg.seconds));
    for (auto& w : workers) {
      c.workers_running.fetch_add(1);
      asio::co_spawn(asio::make_strand(ctx), w->run(end), [&c](std::exception_ptr e) {
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            std::fprintf(stderr, "soak: worker failed: %s\n", x.what());
          }
          c.wrong.fetch_add(1);
        }
        c.workers_running.fetch_sub(1);
      });
    }
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < cfg.threads; ++i) threads.emplace_back([&] { ctx.run(); });
    // Every wait must complete: a worker still waiting a minute after the end has lost one.
    while (c.workers_running.load() > 0 && clock_type::now() < end + 60s)
      std::this_thread::sleep_for(50ms);
    lost = c.waits_started.load() - c.waits_completed.load();
    if (c.workers_running.load() > 0) {
      std::printf("soak: %d workers still waiting 60 s after the end: lost completions %ld\n",
                  c.workers_running.load(), lost);
      std::fflush(stdout);
      std::_Exit(1);  // cannot unwind past waits that never complete
    }
    for (auto& t : threads) t.join();
    workers.clear();
    const double secs = std::chrono::duration<double>(clock_type::now() - start).count();
    const long remaining = cpu ? static_cast<long>(cpu->faults().copy_faults.load()) : 0;
    std::printf(
        "soak: backend=%s streams=%u threads=%u seconds=%.0f ops=%ld ops_per_s=%.0f waits=%ld "
        "cancelled=%ld errors_expected=%ld errors_seen=%ld copy_faults_injected=%ld "
        "copy_faults_seen=%ld copy_faults_unused=%ld wrong=%ld lost=%ld peak_rss_mib=%.1f\n",
        backend.c_str(), cfg.streams, cfg.threads, secs, c.ops.load(), c.ops.load() / secs,
        c.waits_completed.load(), c.cancelled.load(), c.expected_errors.load(),
        c.seen_errors.load(), c.injected.load(), c.injected_seen.load(), remaining,
        c.wrong.load(), lost, peak_rss_kib() / 1024.0);
    if (c.injected.load() != c.injected_seen.load() + remaining) {
      std::printf("soak: injected copy faults not all reported\n");
      c.wrong.fetch_add(1);
    }
  }
  const bool ok =
      c.wrong.load() == 0 && lost == 0 && c.expected_errors.load() == c.seen_errors.load();
  std::printf("soak: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
