#include "server.hpp"

#include <asio/bind_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>
#include <algorithm>
#include <atomic>
#include <coroutine>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "protocol.hpp"

namespace kernel_server {
namespace {

namespace proto = protocol;
using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;

// Awaits an Asio operation in a cora::task and yields its error code as a value, so that the
// common failures (a peer going away, a cancelled wait) are not exceptions.
constexpr asio::experimental::as_tuple_t<cora::use_task_t> try_task{};

// ---------------------------------------------------------------------------------------------
// Streams and buffers

/// The buffers one launch needs: one device and one pinned allocation, each laid out as x, y,
/// then the result (add's; saxpy updates y in place), so that a launch costs the pools two
/// allocations. A launch owns them until its device work has completed, so its host buffer is
/// never written while the device may still read it.
struct buffers {
  cora::device_buffer<float> dev;
  cora::host_buffer<float> host;
  cora::device_buffer<std::uint32_t> flag;  // written by the sleep kernel
  std::size_t capacity = 0;                 // elements per vector

  // Once per launch, for its `n` elements per vector: x, y and the result are packed at n.
  void allocate(cora::device& d, std::size_t n) {
    dev = d.alloc<float>(3 * n);
    host = d.alloc_host<float>(3 * n);
    capacity = n;
  }
  float* x() const noexcept { return dev.data(); }
  float* y() const noexcept { return dev.data() + capacity; }
  float* out() const noexcept { return dev.data() + 2 * capacity; }
  float* host_in() const noexcept { return host.data(); }  // x then y
  float* host_out() const noexcept { return host.data() + 2 * capacity; }
};

/// The device streams. A stream is not held while its work runs: each launch is enqueued on
/// the least busy stream the worker may use. With at least as many streams as workers, each
/// worker has streams of its own (worker w: streams w, w + workers, ...): no two workers
/// enqueue on one stream, so none waits for another's driver call under a stream's submission
/// lock, the cost that dominated when 16 workers shared 8 streams. Two or more per worker (the
/// default is two) also keep a long kernel from holding up the worker's next launches. With
/// fewer streams than workers, workers share them round-robin.
class stream_set {
 public:
  struct lane {
    cora::stream stream;
    std::atomic<unsigned> in_flight{0};
  };

  stream_set(cora::device& dev, unsigned streams, unsigned workers)
      : workers_(std::max(1u, workers)) {
    for (unsigned i = 0; i < std::max(1u, streams); ++i) {
      lanes_.push_back(std::make_unique<lane>());
      lanes_.back()->stream = dev.make_stream();
    }
  }

  /// The least busy stream of worker `w`, the first on a tie; counts a launch on it until
  /// done().
  lane& pick(std::size_t w) noexcept {
    const std::size_t n = lanes_.size();
    lane* best = lanes_[w % n].get();
    unsigned least = best->in_flight.load(std::memory_order_relaxed);
    if (n >= workers_) {
      for (std::size_t i = w + workers_; i < n && least; i += workers_) {
        lane* l = lanes_[i].get();
        const unsigned load = l->in_flight.load(std::memory_order_relaxed);
        if (load < least) {
          best = l;
          least = load;
        }
      }
    }
    best->in_flight.fetch_add(1, std::memory_order_relaxed);
    return *best;
  }
  static void done(lane& l) noexcept { l.in_flight.fetch_sub(1, std::memory_order_relaxed); }

 private:
  std::size_t workers_;
  std::vector<std::unique_ptr<lane>> lanes_;
};

// ---------------------------------------------------------------------------------------------
// Requests

/// One request's device work: inputs in the connection's payload, output into its reply.
struct job {
  proto::op op = proto::op::add;
  float a = 0;
  std::uint32_t rounds = 0;
  std::uint64_t sleep_us = 0;
  const std::byte* x = nullptr;
  const std::byte* y = nullptr;
  std::size_t n = 0;
  std::byte* out = nullptr;
  clock::time_point deadline;
  proto::status result = proto::status::ok;
};

/// Requests that may share a launch: same op and same parameters.
struct batch_key {
  proto::op op;
  std::uint32_t a_bits;
  std::uint32_t rounds;
  auto operator<=>(const batch_key&) const = default;
};

batch_key key_of(const job& j) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &j.a, 4);
  return {j.op, bits, j.rounds};
}

/// Counters of one worker, written by its thread only (no cache line shared between threads
/// on the request path), summed by server::stats().
struct alignas(64) counters {
  std::atomic<std::uint64_t> accepted{0}, rejected{0}, open{0}, requests{0}, in_flight{0}, ok{0},
      bad_requests{0}, timeouts{0}, device_errors{0}, batches{0}, batched{0};
};

void bump(std::atomic<std::uint64_t>& n, std::int64_t by = 1) noexcept {
  n.fetch_add(static_cast<std::uint64_t>(by), std::memory_order_relaxed);
}

struct connection;

/// A request of a launch: alive while its connection still waits for this very request
/// (its deadline may have answered it already).
struct member {
  std::shared_ptr<connection> c;
  std::uint64_t ticket = 0;
  std::size_t offset = 0;  // elements before this request's in the packed vectors
};

/// Requests of one kind gathered for one launch.
struct open_batch {
  std::vector<member> members;
  std::size_t elements = 0;
  std::uint64_t id = 0;
  std::unique_ptr<asio::steady_timer> timer;  // with a batch window only
};

/// One io_context run by one thread. A connection lives on one worker for its whole life, so
/// its state needs no lock and no strand; launches and batches are per worker too.
struct worker {
  explicit worker(std::size_t i) : index(i) {}
  std::size_t index;
  asio::io_context ctx{1};
  // Keeps run() going until stop(), also while the worker has no connection.
  asio::executor_work_guard<asio::io_context::executor_type> keep_running{ctx.get_executor()};
  std::thread thread;
  counters stats;
  std::map<batch_key, open_batch> open;  // batches still taking requests
  std::uint64_t batch_ids = 0;
  unsigned launches = 0;  // launches of this worker on the device
  bool flush_posted = false;
};

struct connection : std::enable_shared_from_this<connection> {
  connection(tcp::socket s, worker& wk)
      : socket(std::move(s)), watchdog(socket.get_executor()), w(wk) {}

  std::size_t buffered() const noexcept { return end - begin; }
  bool parked_for(std::uint64_t t) const noexcept { return parked && ticket == t; }

  tcp::socket socket;
  // One timer per connection enforces the I/O deadline and the request deadline. It is
  // re-armed only when a deadline moves earlier than its expiry, not once per request.
  asio::steady_timer watchdog;
  worker& w;
  clock::time_point io_deadline = clock::time_point::max();
  bool idle = false;     // waiting for a request's first byte: stop() may close it at once
  bool closing = false;  // finish the current request, then close
  // The request waiting for the device: resumed once, by its launch's completion or by its
  // deadline, whichever comes first.
  job current;
  std::coroutine_handle<> parked;
  std::uint64_t ticket = 0;
  std::vector<std::byte> in = std::vector<std::byte>(64 * 1024);  // read-ahead buffer
  std::size_t begin = 0, end = 0;
  std::vector<std::byte> payload;  // the current request's payload
  std::vector<std::byte> reply;    // reply header and payload
};

/// A launch on the device: its requests and its buffers, until the work has completed.
struct launch {
  worker* w = nullptr;
  stream_set::lane* lane = nullptr;
  std::vector<member> members;
  std::unique_ptr<buffers> buf;
  bool failed = false;  // enqueuing failed; `done` is the stream's synchronize
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct server::impl {
  impl(cora::device& d, server_options o)
      : dev(d),
        opts(std::move(o)),
        streams(d, opts.streams ? opts.streams : 2 * worker_count(opts), worker_count(opts)) {
    opts.batch_launches = std::max(1u, opts.batch_launches);  // 0 would never close a batch
    for (unsigned i = 0; i < worker_count(opts); ++i) workers.push_back(std::make_unique<worker>(i));
    acceptor.emplace(workers.front()->ctx);
    bin = dev.load_binary(opts.kernels).wait();
    k_add = bin.kernel("add_f32");
    k_saxpy = bin.kernel("saxpy_rounds");
    k_slow = bin.kernel("slow");
    const tcp::endpoint ep(asio::ip::make_address(opts.address), opts.port);
    acceptor->open(ep.protocol());
    acceptor->set_option(tcp::acceptor::reuse_address(true));
    acceptor->bind(ep);
    acceptor->listen(asio::socket_base::max_listen_connections);
    cora::spawn(workers.front()->ctx.get_executor(), accept_loop(), [](std::exception_ptr) {});
  }

  static unsigned worker_count(const server_options& o) noexcept {
    return std::max(1u, o.threads ? o.threads : std::thread::hardware_concurrency());
  }

  ~impl() {
    // The accept loop on the first worker holds a socket of another worker's context: tear
    // the contexts down in order, the first one first.
    acceptor.reset();
    for (auto& w : workers) w.reset();
  }

  // --- accepting -------------------------------------------------------------------------------

  cora::task<void> accept_loop() {
    worker& home = *workers.front();
    asio::steady_timer backoff(home.ctx);
    std::size_t next = 0;
    while (!stopping.load()) {
      worker& target = *workers[next++ % workers.size()];  // connections spread round the workers
      tcp::socket sock(target.ctx);
      auto [ec] = co_await acceptor->async_accept(sock, try_task);
      if (stopping.load() || !acceptor->is_open()) break;
      if (ec) {
        // Out of descriptors, say: wait a little instead of spinning on the error.
        backoff.expires_after(std::chrono::milliseconds(10));
        co_await backoff.async_wait(try_task);
        continue;
      }
      std::error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      bump(home.stats.accepted);
      auto c = std::make_shared<connection>(std::move(sock), target);
      if (!admit(c)) {
        bump(home.stats.rejected);
        reject(c->socket);
        continue;
      }
      cora::spawn(target.ctx.get_executor(), serve(c), [](std::exception_ptr) {});
    }
  }

  // Registers a connection unless the server is full or stopping.
  bool admit(const std::shared_ptr<connection>& c) {
    std::lock_guard lock(conns_mutex);
    if (stopping.load() || conns.size() >= opts.max_connections) return false;
    conns.emplace(c.get(), c);
    return true;
  }

  void forget(const connection* c) noexcept {
    std::lock_guard lock(conns_mutex);
    conns.erase(c);
  }

  // A busy reply, then close. 16 bytes always fit an empty send buffer, so a non-blocking
  // write never stalls the accept loop.
  static void reject(tcp::socket& s) noexcept {
    std::error_code ec;
    proto::reply_header h;
    h.status = static_cast<std::uint8_t>(proto::status::busy);
    const auto b = proto::encode(h);
    s.non_blocking(true, ec);
    asio::write(s, asio::buffer(b), ec);
    s.shutdown(tcp::socket::shutdown_both, ec);
    s.close(ec);
  }

  // --- deadlines ---------------------------------------------------------------------------------

  // The connection's watchdog: closes the socket past io_deadline, answers a parked request
  // with timeout past its deadline, and re-arms for whichever deadline comes next. Stops once
  // the socket is closed and no request is parked.
  void watch(std::shared_ptr<connection> c) {
    const auto now = clock::now();
    if (c->socket.is_open() && c->io_deadline <= now) {
      std::error_code ignored;
      c->socket.close(ignored);  // fails the pending read or write
    }
    if (c->parked && c->current.deadline <= now) {
      // The device work is left to finish: its launch skips this request when it completes.
      c->current.result = proto::status::timeout;
      std::exchange(c->parked, {}).resume();
    }
    auto next = clock::time_point::max();
    if (c->socket.is_open()) next = c->io_deadline;
    if (c->parked) next = std::min(next, c->current.deadline);
    if (next == clock::time_point::max()) return;
    c->watchdog.expires_at(next);
    c->watchdog.async_wait([this, c](std::error_code) mutable { watch(std::move(c)); });
  }

  // Brings the watchdog forward when `t` comes before its expiry (the handler re-arms).
  static void wake_by(connection& c, clock::time_point t) {
    if (t < c.watchdog.expiry()) c.watchdog.expires_at(t);
  }

  static void set_io_deadline(connection& c, clock::time_point t) {
    c.io_deadline = t;
    wake_by(c, t);
  }

  // --- reading -----------------------------------------------------------------------------------

  // Makes `n` bytes (at most the read-ahead size) available at c.in[c.begin]; false on end of
  // stream, error or timeout.
  cora::task<bool> fill(connection& c, std::size_t n) {
    if (c.buffered() >= n) co_return true;
    if (c.begin > 0) {
      std::memmove(c.in.data(), c.in.data() + c.begin, c.buffered());
      c.end -= c.begin;
      c.begin = 0;
    }
    while (c.end < n) {
      auto [ec, got] = co_await c.socket.async_read_some(
          asio::buffer(c.in.data() + c.end, c.in.size() - c.end), try_task);
      if (ec) co_return false;
      c.end += got;
      if (c.idle) {  // a request has begun: the rest of it must come within io_timeout
        c.idle = false;
        set_io_deadline(c, clock::now() + opts.io_timeout);
      }
    }
    co_return true;
  }

  // Reads a payload of `len` bytes into c.payload. The buffer grows with the bytes that have
  // arrived, not with the length the header claims, so a stalled client costs little memory.
  cora::task<bool> read_payload(connection& c, std::size_t len) {
    const std::size_t have = std::min(c.buffered(), len);
    c.payload.resize(have);
    if (have) std::memcpy(c.payload.data(), c.in.data() + c.begin, have);
    c.begin += have;
    std::size_t done = have;
    while (done < len) {
      const std::size_t want = std::min(len - done, std::max<std::size_t>(64 * 1024, done));
      c.payload.resize(done + want);
      auto [ec, got] = co_await asio::async_read(
          c.socket, asio::buffer(c.payload.data() + done, want), try_task);
      if (ec) co_return false;
      done += got;
    }
    co_return true;
  }

  // --- serving -----------------------------------------------------------------------------------

  cora::task<void> serve(std::shared_ptr<connection> c) {
    counters& st = c->w.stats;
    bump(st.open);
    c->io_deadline = clock::now() + opts.idle_timeout;
    watch(c);
    try {
      co_await serve_requests(*c);
    } catch (const std::exception&) {
      // Out of memory, say: this connection ends, the server goes on.
    }
    std::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    c->watchdog.cancel();
    forget(c.get());
    bump(st.open, -1);
  }

  cora::task<void> serve_requests(connection& c) {
    for (;;) {
      if (c.closing || stopping.load()) co_return;
      c.idle = c.buffered() == 0;
      set_io_deadline(c, clock::now() + opts.idle_timeout);
      if (!co_await fill(c, proto::request_header_size)) co_return;
      c.idle = false;
      const auto received = clock::now();
      const proto::request_header h =
          proto::decode_request(std::span<const std::byte, proto::request_header_size>(
              c.in.data() + c.begin, proto::request_header_size));
      c.begin += proto::request_header_size;
      // Framing errors: what follows cannot be trusted, so reply and close.
      if (h.magic != proto::magic || h.version != proto::version) {
        co_await send_status(c, proto::status::bad_request, 0);
        co_return;
      }
      if (h.length > opts.max_request_bytes) {
        co_await send_status(c, proto::status::too_large, h.id);
        co_return;
      }
      set_io_deadline(c, clock::now() + opts.io_timeout);
      if (!co_await read_payload(c, h.length)) co_return;  // truncated: the peer left or stalled
      const proto::status st = co_await execute(c, h, received);
      set_io_deadline(c, clock::now() + opts.io_timeout);
      if (!co_await send(c, st, h.id)) co_return;
      // A large request leaves large buffers behind; do not keep them per idle connection.
      if (c.payload.capacity() > (1u << 20)) c.payload = {};
      if (c.reply.capacity() > (1u << 20)) c.reply = {};
    }
  }

  // Sends c.reply (its payload already in place after the header) with status `st`.
  cora::task<bool> send(connection& c, proto::status st, std::uint32_t id) {
    if (st != proto::status::ok || c.reply.size() < proto::reply_header_size)
      c.reply.resize(proto::reply_header_size);
    proto::reply_header rh;
    rh.status = static_cast<std::uint8_t>(st);
    rh.id = id;
    rh.length = static_cast<std::uint32_t>(c.reply.size() - proto::reply_header_size);
    const auto hb = proto::encode(rh);
    std::memcpy(c.reply.data(), hb.data(), hb.size());
    count(c.w.stats, st);
    auto [ec, n] = co_await asio::async_write(c.socket, asio::buffer(c.reply), try_task);
    co_return !ec;
  }

  cora::task<bool> send_status(connection& c, proto::status st, std::uint32_t id) {
    c.reply.clear();
    set_io_deadline(c, clock::now() + opts.io_timeout);
    co_return co_await send(c, st, id);
  }

  static void count(counters& n, proto::status st) noexcept {
    bump(n.requests);
    switch (st) {
      case proto::status::ok: bump(n.ok); break;
      case proto::status::timeout: bump(n.timeouts); break;
      case proto::status::device_error: bump(n.device_errors); break;
      default: bump(n.bad_requests); break;
    }
  }

  // Validates a request, runs it (alone or in a batch) and leaves its result in c.reply.
  cora::task<proto::status> execute(connection& c, const proto::request_header& h,
                                    clock::time_point received) {
    if (h.flags != 0) co_return proto::status::bad_request;
    job& j = c.current;
    j = job{};
    auto limit = opts.deadline;
    if (h.deadline_ms)
      limit = std::min<std::chrono::milliseconds>(limit, std::chrono::milliseconds(h.deadline_ms));
    j.deadline = received + limit;
    const std::byte* p = c.payload.data();
    const std::size_t len = h.length;
    switch (static_cast<proto::op>(h.op)) {
      case proto::op::add:
        if (len == 0 || len % 8) co_return proto::status::bad_request;
        j.op = proto::op::add;
        j.n = len / 8;
        j.x = p;
        j.y = p + 4 * j.n;
        break;
      case proto::op::saxpy:
        if (len <= proto::saxpy_params_size || (len - proto::saxpy_params_size) % 8)
          co_return proto::status::bad_request;
        j.op = proto::op::saxpy;
        std::memcpy(&j.a, p, 4);
        std::memcpy(&j.rounds, p + 4, 4);
        if (j.rounds > opts.max_rounds) co_return proto::status::bad_request;
        j.n = (len - proto::saxpy_params_size) / 8;
        j.x = p + proto::saxpy_params_size;
        j.y = j.x + 4 * j.n;
        break;
      case proto::op::sleep:
        if (!opts.enable_sleep) co_return proto::status::unknown_op;
        if (len != 8) co_return proto::status::bad_request;
        j.op = proto::op::sleep;
        std::memcpy(&j.sleep_us, p, 8);
        if (j.sleep_us > opts.max_sleep_us) co_return proto::status::bad_request;
        break;
      default: co_return proto::status::unknown_op;
    }
    c.reply.resize(proto::reply_header_size + 4 * j.n);
    j.out = c.reply.data() + proto::reply_header_size;
    counters& st = c.w.stats;
    bump(st.in_flight);
    struct uncount {
      std::atomic<std::uint64_t>& n;
      ~uncount() { bump(n, -1); }
    } guard{st.in_flight};
    wake_by(c, j.deadline);
    co_await park{*this, c};
    co_return j.result;
  }

  /// `co_await park{...}`: hands the connection's current request to its worker's launches
  /// and waits until the launch has completed or the request's deadline has passed.
  struct park {
    impl& self;
    connection& c;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
      c.parked = h;
      ++c.ticket;
      try {
        self.submit(c);
      } catch (...) {
        c.parked = {};  // resumed by the exception: nothing may resume it again
        throw;
      }
    }
    void await_resume() const noexcept {}
  };

  // --- launches --------------------------------------------------------------------------------

  cora::launch_config config_for(std::size_t n) const {
    const auto& props = dev.properties();
    const std::uint64_t units = std::max(1u, props.compute_units);
    if (props.backend == cora::backend_kind::cuda) {
      const std::uint64_t blocks = (n + 255) / 256;
      return {.grid = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(blocks, 1, units * 8)),
              .block = 256};
    }
    // On the CPU device a block is a thread: split only vectors big enough to pay for it.
    const std::uint64_t blocks = n / 16384;
    return {.grid = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(blocks, 1, units))};
  }

  // On the connection's worker: launches the request at once, or adds it to its kind's batch.
  void submit(connection& c) {
    worker& w = c.w;
    member m{c.shared_from_this(), c.ticket, 0};
    if (!opts.batching || c.current.op == proto::op::sleep) {
      std::vector<member> one;
      one.push_back(std::move(m));
      start_launch(w, std::move(one));
      return;
    }
    const batch_key key = key_of(c.current);
    const std::size_t n = c.current.n;
    auto it = w.open.find(key);
    if (it != w.open.end() && it->second.elements + n > opts.batch_max_elements) flush(w, it);
    auto& b = w.open[key];
    b.members.push_back(std::move(m));
    b.elements += n;
    if (b.elements >= opts.batch_max_elements) {
      flush(w, w.open.find(key));
      return;
    }
    if (opts.batch_window.count() > 0) {
      if (b.members.size() == 1) {
        b.id = ++w.batch_ids;
        b.timer = std::make_unique<asio::steady_timer>(w.ctx, opts.batch_window);
        b.timer->async_wait([this, &w, key, id = b.id](std::error_code ec) {
          if (ec) return;
          auto found = w.open.find(key);
          if (found != w.open.end() && found->second.id == id) flush(w, found);
        });
      }
      return;
    }
    // No window: batches close when the device has room. The flush is posted, so requests
    // that arrived in the same turn of the event loop join this batch first.
    if (!w.flush_posted && w.launches < opts.batch_launches) {
      w.flush_posted = true;
      asio::post(w.ctx, [this, &w] {
        w.flush_posted = false;
        flush_ready(w);
      });
    }
  }

  // Launches open batches while the worker has fewer than batch_launches on the device.
  void flush_ready(worker& w) {
    while (!w.open.empty() && w.launches < opts.batch_launches) flush(w, w.open.begin());
  }

  void flush(worker& w, std::map<batch_key, open_batch>::iterator it) {
    std::vector<member> members = std::move(it->second.members);
    w.open.erase(it);  // destroys a window timer; its handler sees operation_aborted
    start_launch(w, std::move(members));
  }

  // Each launch allocates its buffers from the device's pools and drops them when it is done:
  // allocating never waits for the device, and a drop is a stream-ordered free, so the server
  // keeps no spare lists of its own.
  static std::unique_ptr<buffers> take_buffers(worker&) { return std::make_unique<buffers>(); }
  static void give_back(worker&, std::unique_ptr<buffers> b) { b.reset(); }

  // Packs the live members' vectors (one copy in, one launch, one copy out) and enqueues them
  // on the least busy stream; complete() runs on the worker when the work is done.
  void start_launch(worker& w, std::vector<member> members) {
    std::erase_if(members, [](const member& m) { return !m.c->parked_for(m.ticket); });
    if (members.empty()) return;
    auto l = std::make_unique<launch>();
    l->w = &w;
    l->members = std::move(members);
    const job& first = l->members.front().c->current;
    std::size_t total = 0;
    for (member& m : l->members) {
      m.offset = total;
      total += m.c->current.n;
    }
    if (l->members.size() > 1) {
      bump(w.stats.batches);
      bump(w.stats.batched, static_cast<std::int64_t>(l->members.size()));
    }
    l->buf = take_buffers(w);
    buffers& b = *l->buf;
    l->lane = &streams.pick(w.index);
    cora::stream& s = l->lane->stream;
    cora::pending<void> done;
    try {
      if (first.op == proto::op::sleep) {
        if (!b.flag) b.flag = dev.alloc<std::uint32_t>(1);
        done = s.launch(k_slow, {}, first.sleep_us, b.flag);
      } else {
        b.allocate(dev, total);
        std::byte* hx = reinterpret_cast<std::byte*>(b.host_in());
        std::byte* hy = hx + 4 * total;
        for (const member& m : l->members) {
          const job& j = m.c->current;
          std::memcpy(hx, j.x, 4 * j.n);
          std::memcpy(hy, j.y, 4 * j.n);
          hx += 4 * j.n;
          hy += 4 * j.n;
        }
        float* x = b.x();
        float* y = b.y();
        (void)s.copy(x, b.host_in(), 2 * total * sizeof(float));
        const auto cfg = config_for(total);
        const auto n = static_cast<std::uint64_t>(total);
        if (first.op == proto::op::add) {
          (void)s.launch(k_add, cfg, x, y, b.out(), n);
          done = s.copy(b.host_out(), b.out(), total * sizeof(float));
        } else {
          (void)s.launch(k_saxpy, cfg, first.a, x, y, n, first.rounds);
          done = s.copy(b.host_out(), y, total * sizeof(float));
        }
      }
    } catch (const cora::error&) {
      // Out of device memory, say. Part of the work may be enqueued: synchronize() waits for
      // it (the buffers stay owned until then) and clears the stream's fault.
      l->failed = true;
      try {
        done = s.synchronize();
      } catch (const cora::error&) {
        return;  // the device is gone: the requests' deadlines answer them
      }
    }
    ++w.launches;
    done.async_wait(asio::bind_executor(
        w.ctx.get_executor(),
        [this, l = std::move(l)](std::error_code ec) mutable { complete(std::move(l), ec); }));
  }

  // On the launch's worker: hands each live request its slice of the result and resumes it.
  void complete(std::unique_ptr<launch> l, std::error_code ec) {
    worker& w = *l->w;
    --w.launches;
    stream_set::done(*l->lane);
    const bool ok = !ec && !l->failed;
    if (ec && !l->failed) {
      // The device reported a fault: synchronize() reports and clears it, so later launches
      // on this stream start clean.
      l->lane->stream.synchronize().async_wait(
          asio::bind_executor(w.ctx.get_executor(), [](std::error_code) {}));
    }
    const float* out = l->buf->host ? l->buf->host_out() : nullptr;
    for (const member& m : l->members) {
      connection& c = *m.c;
      if (!c.parked_for(m.ticket)) continue;  // answered by its deadline
      job& j = c.current;
      if (ok && j.n) std::memcpy(j.out, out + m.offset, 4 * j.n);
      j.result = ok ? proto::status::ok : proto::status::device_error;
    }
    give_back(w, std::move(l->buf));  // first, so that the resumed requests may reuse the memory
    // On this worker's thread, each until its next wait. A resumed request parks again with a
    // new ticket, so a member is resumed only once.
    for (const member& m : l->members)
      if (m.c->parked_for(m.ticket)) std::exchange(m.c->parked, {}).resume();
    if (opts.batching && opts.batch_window.count() == 0) flush_ready(w);
  }

  // --- stopping --------------------------------------------------------------------------------

  void stop() noexcept {
    if (stopping.exchange(true)) return;
    try {
      asio::post(workers.front()->ctx, [this] {
        std::error_code ignored;
        acceptor->close(ignored);
      });
      std::lock_guard lock(conns_mutex);
      for (auto& [key, weak] : conns) {
        auto c = weak.lock();
        if (!c) continue;
        asio::post(c->socket.get_executor(), [c] {
          c->closing = true;
          if (c->idle) {  // between requests: nothing in flight to finish
            std::error_code ignored;
            c->socket.close(ignored);
          }
        });
      }
    } catch (...) {
      // Posting allocates; without memory the connections still end at their next request.
    }
    // Each worker's run() returns once its connections and device work are done.
    for (auto& w : workers) w->keep_running.reset();
  }

  cora::device& dev;
  server_options opts;
  cora::binary bin;
  cora::kernel k_add, k_saxpy, k_slow;
  stream_set streams;
  std::vector<std::unique_ptr<worker>> workers;
  std::optional<tcp::acceptor> acceptor;  // on the first worker
  std::atomic<bool> stopping{false};

  std::mutex conns_mutex;
  std::unordered_map<const connection*, std::weak_ptr<connection>> conns;
};

// ---------------------------------------------------------------------------------------------

server::server(cora::device& dev, server_options options)
    : impl_(std::make_unique<impl>(dev, std::move(options))) {}

server::~server() {
  stop();
  join();
}

std::uint16_t server::port() const noexcept {
  std::error_code ec;
  return impl_->acceptor->local_endpoint(ec).port();
}

asio::ip::tcp::endpoint server::endpoint() const {
  return {asio::ip::make_address(impl_->opts.address), port()};
}

asio::io_context& server::context() noexcept { return impl_->workers.front()->ctx; }

void server::start() {
  for (auto& w : impl_->workers)
    if (!w->thread.joinable()) w->thread = std::thread([&ctx = w->ctx] { ctx.run(); });
}

void server::stop() noexcept { impl_->stop(); }

void server::join() {
  for (auto& w : impl_->workers)
    if (w->thread.joinable()) w->thread.join();
}

server_stats server::stats() const noexcept {
  server_stats s;
  for (const auto& w : impl_->workers) {
    const counters& n = w->stats;
    auto get = [](const std::atomic<std::uint64_t>& v) { return v.load(std::memory_order_relaxed); };
    s.connections_accepted += get(n.accepted);
    s.connections_rejected += get(n.rejected);
    s.connections_open += get(n.open);
    s.requests += get(n.requests);
    s.in_flight += get(n.in_flight);
    s.ok += get(n.ok);
    s.bad_requests += get(n.bad_requests);
    s.timeouts += get(n.timeouts);
    s.device_errors += get(n.device_errors);
    s.batches += get(n.batches);
    s.batched_requests += get(n.batched);
  }
  return s;
}

}  // namespace kernel_server
