// Load on the kernel server (examples/kernel_server) against a thread-per-connection baseline
// that blocks in synchronize, both in this process, on the same device, driven by the same
// Asio client: C connections in a closed loop (or at a target rate), requests/s, p50/p99/p99.9
// latency and errors.
//
// Environment (all optional):
//   CORA_SERVER_LOAD_CONNECTIONS  comma-separated connection counts      (64,1024)
//   CORA_SERVER_LOAD_SECONDS      measured seconds per run, after 0.5 s of warm-up   (3)
//   CORA_SERVER_LOAD_RATE         target requests/s over all connections; 0 = closed loop  (0)
//   CORA_SERVER_LOAD_OP           add | saxpy                            (add)
//   CORA_SERVER_LOAD_ELEMENTS     fp32 elements per vector               (1024)
//   CORA_SERVER_LOAD_ROUNDS       saxpy rounds                           (64)
//   CORA_SERVER_LOAD_STREAMS      device streams of either server; 0 = two per worker of
//                                 the cora server, its default           (0)
//   CORA_SERVER_LOAD_THREADS      client threads, and worker threads of the cora server
//                                 (hardware threads)
//   CORA_SERVER_LOAD_SERVER_THREADS  worker threads of the cora server alone (as THREADS)
//   CORA_SERVER_LOAD_BATCH_WINDOW_US  cora_batching's batch window; 0 = close batches when
//                                 the device has room                    (0)
//   CORA_SERVER_LOAD_BATCH_LAUNCHES   cora_batching's launches per worker before requests
//                                 gather                                 (2)
//   CORA_SERVER_LOAD_TARGET       host:port: load that server only (no local servers)
#include <asio/connect.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cora/cora.hpp>

#include "bench_support.hpp"
#include "protocol.hpp"
#include "server.hpp"

namespace {

namespace proto = kernel_server::protocol;
using tcp = asio::ip::tcp;
using clk = std::chrono::steady_clock;

// --- options -----------------------------------------------------------------------------------

std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct load_options {
  std::vector<std::size_t> connections;
  double seconds = 3;
  double warmup = 0.5;
  double rate = 0;  // requests/s over all connections; 0 = closed loop
  proto::op op = proto::op::add;
  std::size_t elements = 1024;
  std::uint32_t rounds = 64;
  unsigned streams = 0;
  unsigned threads = 0;
  unsigned server_threads = 0;
  unsigned batch_window_us = 0;
  unsigned batch_launches = 2;
  std::string target;

  static const load_options& get() {
    static const load_options o = [] {
      load_options l;
      std::stringstream list(env("CORA_SERVER_LOAD_CONNECTIONS", "64,1024"));
      for (std::string item; std::getline(list, item, ',');)
        l.connections.push_back(std::stoul(item));
      l.seconds = std::stod(env("CORA_SERVER_LOAD_SECONDS", "3"));
      l.rate = std::stod(env("CORA_SERVER_LOAD_RATE", "0"));
      l.op = env("CORA_SERVER_LOAD_OP", "add") == "saxpy" ? proto::op::saxpy : proto::op::add;
      l.elements = std::stoul(env("CORA_SERVER_LOAD_ELEMENTS", "1024"));
      l.rounds = static_cast<std::uint32_t>(std::stoul(env("CORA_SERVER_LOAD_ROUNDS", "64")));
      l.streams = static_cast<unsigned>(std::stoul(env("CORA_SERVER_LOAD_STREAMS", "0")));
      l.threads = static_cast<unsigned>(std::stoul(env("CORA_SERVER_LOAD_THREADS", "0")));
      if (!l.threads) l.threads = std::max(1u, std::thread::hardware_concurrency());
      l.server_threads =
          static_cast<unsigned>(std::stoul(env("CORA_SERVER_LOAD_SERVER_THREADS", "0")));
      if (!l.server_threads) l.server_threads = l.threads;
      if (!l.streams) l.streams = 2 * l.server_threads;
      l.batch_window_us =
          static_cast<unsigned>(std::stoul(env("CORA_SERVER_LOAD_BATCH_WINDOW_US", "0")));
      l.batch_launches =
          static_cast<unsigned>(std::stoul(env("CORA_SERVER_LOAD_BATCH_LAUNCHES", "2")));
      l.target = env("CORA_SERVER_LOAD_TARGET", "");
      return l;
    }();
    return o;
  }
};

// Each connection is a socket on both sides of loopback.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// --- the load generator ------------------------------------------------------------------------

struct load_result {
  std::uint64_t requests = 0;  // completed with status ok inside the measured window
  std::uint64_t errors = 0;    // non-ok replies, failed connects, lost connections
  double seconds = 0;
  std::vector<double> latencies_us;
};

std::vector<std::byte> make_request(const load_options& o, std::uint32_t id) {
  std::vector<float> x(o.elements), y(o.elements);
  for (std::size_t i = 0; i < o.elements; ++i) {
    x[i] = static_cast<float>(i % 1000) * 0.5f;
    y[i] = 1.0f;
  }
  if (o.op == proto::op::saxpy) return proto::make_saxpy_request(id, 0.5f, o.rounds, x, y);
  return proto::make_add_request(id, x, y);
}

struct connection_stats {
  std::uint64_t requests = 0, errors = 0;
  std::vector<double> latencies_us;
};

// One client connection: send, await the reply, repeat. In rate mode requests follow a fixed
// schedule and latency counts from the scheduled time, so a stalled server is not hidden by
// the client waiting for it (no coordinated omission).
asio::awaitable<void> client_loop(tcp::endpoint ep, const load_options& o, std::size_t index,
                                  clk::time_point start, clk::time_point measure_from,
                                  clk::time_point end, connection_stats& st) {
  constexpr auto tuple = asio::experimental::as_tuple(asio::use_awaitable);
  auto ex = co_await asio::this_coro::executor;
  tcp::socket sock(ex);
  auto [cec] = co_await sock.async_connect(ep, tuple);
  if (cec) {
    ++st.errors;
    co_return;
  }
  sock.set_option(tcp::no_delay(true));
  auto request = make_request(o, static_cast<std::uint32_t>(index));
  std::vector<std::byte> reply(proto::reply_header_size + 4 * o.elements);
  asio::steady_timer pacing(ex);
  // Each connection sends rate / connections requests per second.
  const auto interval =
      o.rate > 0 ? std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(
                       static_cast<double>(o.connections.front()) / o.rate))
                 : clk::duration::zero();
  // Spread the connections' schedules evenly over one interval: no bursts.
  const auto connections = static_cast<long>(o.connections.front());
  auto next = start + interval * static_cast<long>(index) / connections;
  std::uint32_t id = 0;
  for (;;) {
    auto t0 = clk::now();
    if (o.rate > 0) {
      if (next > t0) {
        pacing.expires_at(next);
        co_await pacing.async_wait(tuple);
      }
      t0 = next;
      next += interval;
    }
    if (t0 >= end) break;
    std::memcpy(request.data() + 8, &++id, 4);
    auto [wec, wn] = co_await asio::async_write(sock, asio::buffer(request), tuple);
    if (wec) {
      ++st.errors;
      co_return;
    }
    // The whole reply, usually in one read: the header, then what its length says is left.
    std::size_t have = 0;
    auto read_until = [&](std::size_t want) -> asio::awaitable<bool> {
      while (have < want) {
        auto [rec, rn] = co_await sock.async_read_some(
            asio::buffer(reply.data() + have, reply.size() - have), tuple);
        if (rec) co_return false;
        have += rn;
      }
      co_return true;
    };
    if (!co_await read_until(proto::reply_header_size)) {
      ++st.errors;
      co_return;
    }
    const auto h = proto::decode_reply(std::span<const std::byte, proto::reply_header_size>(
        reply.data(), proto::reply_header_size));
    if (h.length > reply.size() - proto::reply_header_size ||
        !co_await read_until(proto::reply_header_size + h.length)) {
      ++st.errors;
      co_return;
    }
    const auto t1 = clk::now();
    if (t0 < measure_from) continue;
    if (h.status != static_cast<std::uint8_t>(proto::status::ok) || h.id != id) {
      ++st.errors;
      continue;
    }
    ++st.requests;
    st.latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::error_code ignored;
  sock.shutdown(tcp::socket::shutdown_both, ignored);
}

// The connections are spread over one io_context per client thread, as the cora server
// spreads them over its workers: no lock or strand is shared between connections.
load_result run_load(const tcp::endpoint& ep, const load_options& base, std::size_t connections) {
  load_options o = base;
  o.connections = {connections};
  std::vector<std::unique_ptr<asio::io_context>> ios;
  for (unsigned t = 0; t < std::max<std::size_t>(1, std::min<std::size_t>(o.threads, connections));
       ++t)
    ios.push_back(std::make_unique<asio::io_context>(1));
  std::vector<connection_stats> stats(connections);
  const auto start = clk::now();
  const auto measure_from =
      start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.warmup));
  const auto end = measure_from + std::chrono::duration_cast<clk::duration>(
                                      std::chrono::duration<double>(o.seconds));
  for (std::size_t i = 0; i < connections; ++i)
    asio::co_spawn(*ios[i % ios.size()], client_loop(ep, o, i, start, measure_from, end, stats[i]),
                   asio::detached);
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < ios.size(); ++t) threads.emplace_back([&io = *ios[t]] { io.run(); });
  ios.front()->run();
  for (auto& t : threads) t.join();
  load_result r;
  r.seconds = o.seconds;
  for (auto& s : stats) {
    r.requests += s.requests;
    r.errors += s.errors;
    r.latencies_us.insert(r.latencies_us.end(), s.latencies_us.begin(), s.latencies_us.end());
  }
  return r;
}

void report(benchmark::State& state, load_result& r) {
  auto& lat = r.latencies_us;
  std::sort(lat.begin(), lat.end());
  auto at = [&](double q) {
    return lat.empty() ? 0.0
                       : lat[static_cast<std::size_t>(q * static_cast<double>(lat.size() - 1))];
  };
  state.counters["req_per_s"] = static_cast<double>(r.requests) / r.seconds;
  state.counters["p50_us"] = at(0.50);
  state.counters["p99_us"] = at(0.99);
  state.counters["p999_us"] = at(0.999);
  state.counters["errors"] = static_cast<double>(r.errors);
  state.SetIterationTime(r.seconds);
}

// --- the baseline: a thread per connection, blocking in synchronize ------------------------------

class baseline_server {
 public:
  baseline_server(cora::device& dev, const std::filesystem::path& kernels, unsigned streams)
      : dev_(dev), acceptor_(io_, tcp::endpoint(asio::ip::address_v4::loopback(), 0)) {
    bin_ = dev.load_binary(kernels).wait();
    k_add_ = bin_.kernel("add_f32");
    k_saxpy_ = bin_.kernel("saxpy_rounds");
    for (unsigned i = 0; i < streams; ++i) {
      auto s = std::make_unique<slot>();
      s->stream = dev.make_stream();
      free_.push_back(s.get());
      slots_.push_back(std::move(s));
    }
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~baseline_server() { stop(); }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

  void stop() {
    if (stopping_.exchange(true)) return;
    {  // wakes the blocking accept
      tcp::socket s(io_);
      std::error_code ec;
      s.connect(tcp::endpoint(asio::ip::address_v4::loopback(), port()), ec);
    }
    accept_thread_.join();
    {
      std::lock_guard lock(conns_mutex_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);  // wakes blocking reads
    }
    for (auto& t : threads_) t.join();
  }

 private:
  struct slot {
    cora::stream stream;
    cora::device_buffer<float> in, out;
    cora::host_buffer<float> host_in, host_out;
    std::size_t capacity = 0;
  };

  void accept_loop() {
    while (!stopping_) {
      tcp::socket s(io_);
      std::error_code ec;
      acceptor_.accept(s, ec);
      if (stopping_) break;
      if (ec) continue;
      s.set_option(tcp::no_delay(true), ec);
      std::lock_guard lock(conns_mutex_);
      fds_.push_back(s.native_handle());
      threads_.emplace_back(
          [this, sock = std::make_shared<tcp::socket>(std::move(s))] { serve(*sock); });
    }
  }

  void serve(tcp::socket& s) {
    std::array<std::byte, proto::request_header_size> hb;
    std::vector<std::byte> payload, reply;
    for (;;) {
      std::error_code ec;
      asio::read(s, asio::buffer(hb), ec);
      if (ec) break;
      const auto h = proto::decode_request(hb);
      if (h.magic != proto::magic || h.version != proto::version || h.length > (16u << 20)) break;
      payload.resize(h.length);
      asio::read(s, asio::buffer(payload), ec);
      if (ec) break;
      const proto::status st = execute(h, payload, reply);
      if (st != proto::status::ok) reply.resize(proto::reply_header_size);
      proto::reply_header rh;
      rh.status = static_cast<std::uint8_t>(st);
      rh.id = h.id;
      rh.length = static_cast<std::uint32_t>(reply.size() - proto::reply_header_size);
      const auto rb = proto::encode(rh);
      std::memcpy(reply.data(), rb.data(), rb.size());
      asio::write(s, asio::buffer(reply), ec);
      if (ec) break;
    }
    std::error_code ignored;
    s.shutdown(tcp::socket::shutdown_both, ignored);
    std::lock_guard lock(conns_mutex_);
    fds_.erase(std::find(fds_.begin(), fds_.end(), s.native_handle()));
  }

  proto::status execute(const proto::request_header& h, const std::vector<std::byte>& payload,
                        std::vector<std::byte>& reply) {
    const std::byte* p = payload.data();
    std::size_t n = 0;
    float a = 0;
    std::uint32_t rounds = 0;
    if (h.op == static_cast<std::uint8_t>(proto::op::add)) {
      if (h.length == 0 || h.length % 8) return proto::status::bad_request;
      n = h.length / 8;
    } else if (h.op == static_cast<std::uint8_t>(proto::op::saxpy)) {
      if (h.length <= 8 || (h.length - 8) % 8) return proto::status::bad_request;
      std::memcpy(&a, p, 4);
      std::memcpy(&rounds, p + 4, 4);
      p += 8;
      n = (h.length - 8) / 8;
    } else {
      return proto::status::unknown_op;
    }
    slot* s = acquire();
    if (s->capacity < n) {
      s->in = dev_.alloc<float>(2 * n);
      s->out = dev_.alloc<float>(n);
      s->host_in = dev_.alloc_host<float>(2 * n);
      s->host_out = dev_.alloc_host<float>(n);
      s->capacity = n;
    }
    std::memcpy(s->host_in.data(), p, 8 * n);
    float* x = s->in.data();
    float* y = x + n;
    (void)s->stream.copy(x, s->host_in.data(), 8 * n);
    cora::launch_config cfg;
    if (dev_.backend() == cora::backend_kind::cuda) {
      cfg.block = 256;
      cfg.grid = static_cast<std::uint32_t>(
          std::min<std::size_t>((n + 255) / 256, 8u * dev_.properties().compute_units));
    } else {
      cfg.grid = static_cast<std::uint32_t>(
          std::clamp<std::size_t>(n / 16384, 1, dev_.properties().compute_units));
    }
    if (h.op == static_cast<std::uint8_t>(proto::op::add)) {
      (void)s->stream.launch(k_add_, cfg, x, y, s->out.data(), std::uint64_t{n});
      (void)s->stream.copy(s->host_out.data(), s->out.data(), 4 * n);
    } else {
      (void)s->stream.launch(k_saxpy_, cfg, a, x, y, std::uint64_t{n}, rounds);
      (void)s->stream.copy(s->host_out.data(), y, 4 * n);
    }
    std::error_code ec;
    s->stream.synchronize().wait(ec);  // this thread sleeps until the device is done
    if (!ec) {
      reply.resize(proto::reply_header_size + 4 * n);
      std::memcpy(reply.data() + proto::reply_header_size, s->host_out.data(), 4 * n);
    }
    release(s);
    return ec ? proto::status::device_error : proto::status::ok;
  }

  slot* acquire() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    slot* s = free_.back();
    free_.pop_back();
    return s;
  }
  void release(slot* s) {
    {
      std::lock_guard lock(mutex_);
      free_.push_back(s);
    }
    cv_.notify_one();
  }

  cora::device& dev_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  cora::binary bin_;
  cora::kernel k_add_, k_saxpy_;
  std::vector<std::unique_ptr<slot>> slots_;
  std::vector<slot*> free_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::mutex conns_mutex_;
  std::vector<int> fds_;  // open connections, shut down by stop()
  std::vector<std::thread> threads_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
};

// --- benchmarks ----------------------------------------------------------------------------------

// CORA_TEST_KERNELS_DIR first: a build copied to another machine is not where it was built.
std::string kernels_path() { return cora::bench::kernels_dir() + "/test_kernels.corabin"; }

void cora_server(benchmark::State& state, std::size_t connections, bool batching) {
  raise_fd_limit();
  const auto& o = load_options::get();
  cora::runtime rt;
  auto& dev = rt.default_device();
  kernel_server::server_options so;
  so.threads = o.server_threads;
  so.streams = o.streams;
  so.max_connections = connections + 16;
  so.batching = batching;
  so.batch_window = std::chrono::microseconds(o.batch_window_us);
  so.batch_launches = o.batch_launches;
  so.kernels = kernels_path();
  kernel_server::server srv(dev, so);
  srv.start();
  load_result r;
  for (auto _ : state) r = run_load(srv.endpoint(), o, connections);
  srv.stop();
  srv.join();
  report(state, r);
  const auto st = srv.stats();
  if (batching && st.batches)
    state.counters["req_per_launch"] =
        static_cast<double>(st.batched_requests) / static_cast<double>(st.batches);
  state.SetLabel(dev.name());
}

void baseline(benchmark::State& state, std::size_t connections) {
  raise_fd_limit();
  const auto& o = load_options::get();
  cora::runtime rt;
  auto& dev = rt.default_device();
  load_result r;
  {
    baseline_server srv(dev, kernels_path(), o.streams);
    const tcp::endpoint ep(asio::ip::address_v4::loopback(), srv.port());
    for (auto _ : state) r = run_load(ep, o, connections);
  }
  report(state, r);
  state.SetLabel(dev.name());
}

void external(benchmark::State& state, std::size_t connections) {
  raise_fd_limit();
  const auto& o = load_options::get();
  const auto colon = o.target.rfind(':');
  asio::io_context io;
  tcp::resolver res(io);
  const auto eps = res.resolve(o.target.substr(0, colon), o.target.substr(colon + 1));
  load_result r;
  for (auto _ : state) r = run_load(*eps.begin(), o, connections);
  report(state, r);
  state.SetLabel(o.target);
}

// Registered at start-up from the environment (see the top of this file).
[[maybe_unused]] const bool registered = [] {
  const auto& o = load_options::get();
  auto tune = [](benchmark::internal::Benchmark* b) {
    b->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  for (std::size_t c : o.connections) {
    const std::string suffix = "/connections:" + std::to_string(c);
    if (!o.target.empty()) {
      tune(benchmark::RegisterBenchmark(("server_load/external" + suffix).c_str(), external, c));
      continue;
    }
    tune(benchmark::RegisterBenchmark(("server_load/baseline" + suffix).c_str(), baseline, c));
    tune(
        benchmark::RegisterBenchmark(("server_load/cora" + suffix).c_str(), cora_server, c, false));
    tune(benchmark::RegisterBenchmark(("server_load/cora_batching" + suffix).c_str(), cora_server,
                                      c, true));
    // Google Benchmark appends the run settings to the names it reports.
    const std::string run = suffix + "/iterations:1/manual_time";
    cora::bench::compare("server_load/cora" + run, "server_load/baseline" + run, "req_per_s", true);
    cora::bench::compare("server_load/cora" + run, "server_load/baseline" + run, "p99_us");
    cora::bench::compare("server_load/cora_batching" + run, "server_load/baseline" + run,
                         "req_per_s", true);
    cora::bench::compare("server_load/cora_batching" + run, "server_load/baseline" + run, "p99_us");
  }
  return true;
}();

}  // namespace
