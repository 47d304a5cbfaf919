#include "server.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/write.hpp>
#include <algorithm>
#include <atomic>
#include <coroutine>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
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

// Keeps an executor's context running while a coroutine is parked with it.
asio::any_io_executor tracked(const asio::any_io_executor& ex) {
  return asio::prefer(ex, asio::execution::outstanding_work.tracked);
}

// Hands a parked coroutine back to its executor. The executor is moved out first: once
// posted, the coroutine may run (and free the object holding it) on another thread.
void resume_on(asio::any_io_executor& ex, std::coroutine_handle<> h) {
  asio::any_io_executor target = std::move(ex);
  asio::post(target, [h] { h.resume(); });
}

// ---------------------------------------------------------------------------------------------
// Streams and their buffers

/// A stream with the buffers one launch needs. Reused only once all its work has completed, so
/// its host buffers are never written while the device may still read them.
struct slot {
  cora::stream stream;
  cora::device_buffer<float> in;   // x then y
  cora::device_buffer<float> out;  // add's result (saxpy updates y in place)
  cora::host_buffer<float> host_in, host_out;
  cora::device_buffer<std::uint32_t> flag;  // written by the sleep kernel
  std::size_t capacity = 0;                 // elements per vector

  void reserve(cora::device& dev, std::size_t n) {
    if (n <= capacity) return;
    const std::size_t cap = std::max({n, capacity * 2, std::size_t{4096}});
    in = dev.alloc<float>(2 * cap);
    out = dev.alloc<float>(cap);
    host_in = dev.alloc_host<float>(2 * cap);
    host_out = dev.alloc_host<float>(cap);
    capacity = cap;
  }
};

/// A fixed set of slots; coroutines wait in FIFO order when all are taken.
class stream_pool {
 public:
  stream_pool(cora::device& dev, unsigned n) {
    for (unsigned i = 0; i < std::max(1u, n); ++i) {
      auto s = std::make_unique<slot>();
      s->stream = dev.make_stream();
      s->flag = dev.alloc<std::uint32_t>(1);
      free_.push_back(s.get());
      slots_.push_back(std::move(s));
    }
  }

  struct waiter {
    std::coroutine_handle<> handle;
    asio::any_io_executor executor;
    slot* got = nullptr;
  };

  /// `slot* s = co_await pool.acquire();` in a cora::task; resumes on the task's executor.
  struct acquire_awaiter {
    stream_pool& pool;
    waiter w;
    bool await_ready() const noexcept { return false; }
    template <class P>
    bool await_suspend(std::coroutine_handle<P> h) {
      std::lock_guard lock(pool.mutex_);
      if (!pool.free_.empty()) {
        w.got = pool.free_.back();
        pool.free_.pop_back();
        return false;
      }
      w.handle = h;
      w.executor = tracked(h.promise().executor());
      pool.waiters_.push_back(&w);
      return true;
    }
    slot* await_resume() const noexcept { return w.got; }
  };
  acquire_awaiter acquire() noexcept { return {*this, {}}; }

  void release(slot* s) noexcept {
    waiter* w = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (waiters_.empty()) {
        free_.push_back(s);  // LIFO: the most recently used stream is the warmest
        return;
      }
      w = waiters_.front();
      waiters_.pop_front();
      w->got = s;
    }
    resume_on(w->executor, w->handle);
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<slot>> slots_;
  std::vector<slot*> free_;
  std::deque<waiter*> waiters_;
};

/// Returns a slot to its pool at scope exit unless the slot was retired (handed to a callback
/// that returns it when the device is done with it).
class lease {
 public:
  lease(stream_pool& p, slot* s) noexcept : pool_(p), s_(s) {}
  lease(const lease&) = delete;
  lease& operator=(const lease&) = delete;
  ~lease() {
    if (s_) pool_.release(s_);
  }
  slot* get() const noexcept { return s_; }
  slot* retire() noexcept { return std::exchange(s_, nullptr); }

 private:
  stream_pool& pool_;
  slot* s_;
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

/// A request parked in a batch until the batch's launch has completed.
struct batch_entry {
  job* j = nullptr;
  std::coroutine_handle<> handle;
  asio::any_io_executor executor;
};

struct connection {
  explicit connection(tcp::socket s) : socket(std::move(s)), watchdog(socket.get_executor()) {}

  std::size_t buffered() const noexcept { return end - begin; }

  tcp::socket socket;
  asio::steady_timer watchdog;  // closes the socket past io_deadline
  clock::time_point io_deadline = clock::time_point::max();
  bool idle = false;     // waiting for a request's first byte: stop() may close it at once
  bool closing = false;  // finish the current request, then close
  std::vector<std::byte> in = std::vector<std::byte>(64 * 1024);  // read-ahead buffer
  std::size_t begin = 0, end = 0;
  std::vector<std::byte> payload;  // the current request's payload
  std::vector<std::byte> reply;    // reply header and payload
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct server::impl {
  impl(cora::device& d, server_options o)
      : dev(d),
        opts(std::move(o)),
        pool(d, opts.streams),
        accept_strand(asio::make_strand(ctx)),
        batch_strand(asio::make_strand(ctx)),
        acceptor(accept_strand) {
    bin = dev.load_binary(opts.kernels).wait();
    k_add = bin.kernel("add_f32");
    k_saxpy = bin.kernel("saxpy_rounds");
    k_slow = bin.kernel("slow");
    const tcp::endpoint ep(asio::ip::make_address(opts.address), opts.port);
    acceptor.open(ep.protocol());
    acceptor.set_option(tcp::acceptor::reuse_address(true));
    acceptor.bind(ep);
    acceptor.listen(asio::socket_base::max_listen_connections);
    cora::spawn(accept_strand, accept_loop(), [](std::exception_ptr) {});
  }

  // --- accepting -------------------------------------------------------------------------------

  cora::task<void> accept_loop() {
    asio::steady_timer backoff(accept_strand);
    while (!stopping.load()) {
      tcp::socket sock(asio::make_strand(ctx));  // each connection runs on its own strand
      auto [ec] = co_await acceptor.async_accept(sock, try_task);
      if (stopping.load() || !acceptor.is_open()) break;
      if (ec) {
        // Out of descriptors, say: wait a little instead of spinning on the error.
        backoff.expires_after(std::chrono::milliseconds(10));
        co_await backoff.async_wait(try_task);
        continue;
      }
      std::error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      ++accepted;
      auto c = std::make_shared<connection>(std::move(sock));
      if (!admit(c)) {
        ++rejected;
        reject(c->socket);
        continue;
      }
      cora::spawn(c->socket.get_executor(), serve(c), [](std::exception_ptr) {});
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

  // --- connection deadlines ----------------------------------------------------------------------

  // One timer per connection; moving the deadline later costs nothing, moving it earlier
  // re-arms the timer.
  void watch(std::shared_ptr<connection> c) {
    c->watchdog.expires_at(c->io_deadline);
    c->watchdog.async_wait([this, c](std::error_code) {
      if (!c->socket.is_open()) return;
      if (c->io_deadline <= clock::now()) {
        std::error_code ignored;
        c->socket.close(ignored);  // fails the pending read or write
        return;
      }
      watch(c);
    });
  }

  static void set_io_deadline(connection& c, clock::time_point t) {
    c.io_deadline = t;
    if (t < c.watchdog.expiry()) c.watchdog.expires_at(t);  // the handler re-arms
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
    ++open_count;
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
    --open_count;
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
    count(st);
    auto [ec, n] = co_await asio::async_write(c.socket, asio::buffer(c.reply), try_task);
    co_return !ec;
  }

  cora::task<bool> send_status(connection& c, proto::status st, std::uint32_t id) {
    c.reply.clear();
    set_io_deadline(c, clock::now() + opts.io_timeout);
    co_return co_await send(c, st, id);
  }

  void count(proto::status st) noexcept {
    ++requests;
    switch (st) {
      case proto::status::ok: ++ok_count; break;
      case proto::status::timeout: ++timeouts; break;
      case proto::status::device_error: ++device_errors; break;
      default: ++bad_requests; break;
    }
  }

  // Validates a request, runs it (alone or in a batch) and leaves its result in c.reply.
  cora::task<proto::status> execute(connection& c, const proto::request_header& h,
                                    clock::time_point received) {
    if (h.flags != 0) co_return proto::status::bad_request;
    job j;
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
    ++in_flight;
    struct uncount {
      std::atomic<std::uint64_t>& n;
      ~uncount() { --n; }
    } guard{in_flight};
    if (opts.batching && j.op != proto::op::sleep) {
      co_await join_batch{*this, {&j, {}, {}}};
    } else {
      job* one[] = {&j};
      co_await run_jobs(one);
    }
    co_return j.result;
  }

  // --- the device pipeline -------------------------------------------------------------------

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

  // Runs jobs of one kind as one launch on one stream: copy in, launch, copy out, await with
  // the earliest deadline. Sets every job's result.
  cora::task<void> run_jobs(std::span<job* const> jobs) {
    auto set_all = [&](proto::status s) {
      for (job* j : jobs) j->result = s;
    };
    const job& first = *jobs.front();
    std::size_t total = 0;
    auto deadline = clock::time_point::max();
    for (const job* j : jobs) {
      total += j->n;
      deadline = std::min(deadline, j->deadline);
    }

    lease held(pool, co_await pool.acquire());
    slot& s = *held.get();
    if (clock::now() >= deadline) {  // waited too long for a stream
      set_all(proto::status::timeout);
      co_return;
    }
    cora::pending<void> done;
    bool failed = false;
    try {
      if (first.op == proto::op::sleep) {
        done = s.stream.launch(k_slow, {}, first.sleep_us, s.flag);
      } else {
        s.reserve(dev, total);
        // Pack every job's x, then every job's y: one copy in, one launch, one copy out.
        std::byte* hx = reinterpret_cast<std::byte*>(s.host_in.data());
        std::byte* hy = hx + 4 * total;
        for (const job* j : jobs) {
          std::memcpy(hx, j->x, 4 * j->n);
          std::memcpy(hy, j->y, 4 * j->n);
          hx += 4 * j->n;
          hy += 4 * j->n;
        }
        float* x = s.in.data();
        float* y = x + total;
        s.stream.copy(x, s.host_in.data(), 2 * total * sizeof(float));
        const auto cfg = config_for(total);
        const auto n = static_cast<std::uint64_t>(total);
        if (first.op == proto::op::add) {
          s.stream.launch(k_add, cfg, x, y, s.out.data(), n);
          done = s.stream.copy(s.host_out.data(), s.out.data(), total * sizeof(float));
        } else {
          s.stream.launch(k_saxpy, cfg, first.a, x, y, n, first.rounds);
          done = s.stream.copy(s.host_out.data(), y, total * sizeof(float));
        }
      }
    } catch (const cora::error&) {
      failed = true;  // out of device memory, say
    }

    std::error_code ec;
    if (!failed) ec = co_await wait_until(done, deadline);
    if (ec == asio::error::operation_aborted) {
      // The deadline passed. The device work runs on and still uses this slot: hand the slot
      // back only when the work has completed (the callback holds the context's work, so a
      // graceful stop waits for it).
      set_all(proto::status::timeout);
      slot* retired = held.retire();
      auto ex = co_await cora::this_executor();
      done.async_wait(asio::bind_executor(ex, [this, retired, ex](std::error_code e) {
        if (!e) {
          pool.release(retired);
          return;
        }
        retired->stream.synchronize().async_wait(
            asio::bind_executor(ex, [this, retired](std::error_code) { pool.release(retired); }));
      }));
      co_return;
    }
    if (failed || ec) {
      set_all(proto::status::device_error);
      // synchronize() reports and clears the stream's fault, so the slot is clean for reuse.
      auto [sync_ec] = co_await s.stream.synchronize().async_wait(try_task);
      (void)sync_ec;
      co_return;
    }
    const std::byte* out = reinterpret_cast<const std::byte*>(s.host_out.data());
    for (job* j : jobs) {
      if (j->n) std::memcpy(j->out, out, 4 * j->n);  // a sleep has no output (and no buffer)
      out += 4 * j->n;
      j->result = proto::status::ok;
    }
  }

  // Awaits `p` until `deadline`: a timer on this task's executor cancels the wait (not the
  // device work) through an Asio cancellation slot.
  cora::task<std::error_code> wait_until(cora::pending<void>& p, clock::time_point deadline) {
    auto ex = co_await cora::this_executor();
    // Shared with the timer's handler, which may run after this coroutine has moved on.
    auto signal = std::make_shared<asio::cancellation_signal>();
    asio::steady_timer timer(ex, deadline);
    timer.async_wait([signal](std::error_code ec) {
      if (!ec) signal->emit(asio::cancellation_type::terminal);
    });
    const std::error_code ec = co_await cancellable_wait{p, signal->slot(), {}};
    timer.cancel();
    co_return ec;
  }

  /// `co_await cancellable_wait{p, slot}` in a cora::task: p.async_wait with a cancellation
  /// slot, resumed on the task's executor. (Asio 1.22's bind_cancellation_slot cannot wrap
  /// cora::use_task: its binder needs the token's async_result to name a return_type.)
  struct cancellable_wait {
    cora::pending<void>& p;
    asio::cancellation_slot slot;
    std::error_code ec;
    bool await_ready() const noexcept { return false; }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
      // The handler never runs inside async_wait, so resuming from it is safe.
      p.async_wait(asio::bind_cancellation_slot(
          slot, asio::bind_executor(h.promise().executor(), [this, h](std::error_code e) {
            ec = e;
            h.resume();
          })));
    }
    std::error_code await_resume() const noexcept { return ec; }
  };

  // --- batching --------------------------------------------------------------------------------

  struct open_batch {
    std::vector<batch_entry*> entries;
    std::size_t elements = 0;
    std::uint64_t id = 0;
    std::unique_ptr<asio::steady_timer> timer;
  };

  /// `co_await join_batch{...}`: parks the request in the open batch of its kind; resumes on
  /// the request's executor once the batch's launch has completed.
  struct join_batch {
    impl& self;
    batch_entry entry;
    bool await_ready() const noexcept { return false; }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
      entry.handle = h;
      entry.executor = tracked(h.promise().executor());
      asio::post(self.batch_strand, [s = &self, e = &entry] { s->add_to_batch(e); });
    }
    void await_resume() const noexcept {}
  };

  // On batch_strand.
  void add_to_batch(batch_entry* e) {
    const batch_key key = key_of(*e->j);
    auto it = batches.find(key);
    if (it != batches.end() && it->second.elements + e->j->n > opts.batch_max_elements) flush(it);
    auto& b = batches[key];
    b.entries.push_back(e);
    b.elements += e->j->n;
    if (b.entries.size() == 1) {
      b.id = ++batch_ids;
      b.timer = std::make_unique<asio::steady_timer>(batch_strand, opts.batch_window);
      b.timer->async_wait([this, key, id = b.id](std::error_code ec) {
        if (ec) return;
        auto found = batches.find(key);
        if (found != batches.end() && found->second.id == id) flush(found);
      });
    }
    if (b.elements >= opts.batch_max_elements) flush(batches.find(key));
  }

  // On batch_strand: closes a batch and runs it on a strand of its own, so batches overlap.
  void flush(std::map<batch_key, open_batch>::iterator it) {
    std::vector<batch_entry*> entries = std::move(it->second.entries);
    batches.erase(it);  // destroys the timer; its handler sees operation_aborted
    if (entries.size() > 1) {
      ++batch_count;
      batched += entries.size();
    }
    cora::spawn(asio::make_strand(ctx), run_batch(std::move(entries)), [](std::exception_ptr) {});
  }

  cora::task<void> run_batch(std::vector<batch_entry*> entries) {
    std::vector<job*> jobs;
    jobs.reserve(entries.size());
    for (auto* e : entries) jobs.push_back(e->j);
    try {
      co_await run_jobs(jobs);
    } catch (const std::exception&) {
      for (job* j : jobs) j->result = proto::status::device_error;
    }
    for (auto* e : entries) resume_on(e->executor, e->handle);
  }

  // --- stopping --------------------------------------------------------------------------------

  void stop() noexcept {
    if (stopping.exchange(true)) return;
    try {
      asio::post(accept_strand, [this] {
        std::error_code ignored;
        acceptor.close(ignored);
      });
      std::lock_guard lock(conns_mutex);
      for (auto& [key, w] : conns) {
        auto c = w.lock();
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
  }

  cora::device& dev;
  server_options opts;
  cora::binary bin;
  cora::kernel k_add, k_saxpy, k_slow;
  stream_pool pool;
  asio::io_context ctx;
  asio::strand<asio::io_context::executor_type> accept_strand, batch_strand;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};

  std::mutex conns_mutex;
  std::unordered_map<const connection*, std::weak_ptr<connection>> conns;

  std::map<batch_key, open_batch> batches;  // on batch_strand
  std::uint64_t batch_ids = 0;

  std::atomic<std::uint64_t> accepted{0}, rejected{0}, open_count{0}, requests{0}, in_flight{0},
      ok_count{0}, bad_requests{0}, timeouts{0}, device_errors{0}, batch_count{0}, batched{0};
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
  return impl_->acceptor.local_endpoint(ec).port();
}

asio::ip::tcp::endpoint server::endpoint() const {
  return {asio::ip::make_address(impl_->opts.address), port()};
}

asio::io_context& server::context() noexcept { return impl_->ctx; }

void server::start() {
  if (!impl_->threads.empty()) return;
  unsigned n = impl_->opts.threads ? impl_->opts.threads : std::thread::hardware_concurrency();
  for (unsigned i = 0; i < std::max(1u, n); ++i)
    impl_->threads.emplace_back([this] { impl_->ctx.run(); });
}

void server::stop() noexcept { impl_->stop(); }

void server::join() {
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
  impl_->threads.clear();
}

server_stats server::stats() const noexcept {
  const impl& i = *impl_;
  server_stats s;
  s.connections_accepted = i.accepted.load();
  s.connections_rejected = i.rejected.load();
  s.connections_open = i.open_count.load();
  s.requests = i.requests.load();
  s.in_flight = i.in_flight.load();
  s.ok = i.ok_count.load();
  s.bad_requests = i.bad_requests.load();
  s.timeouts = i.timeouts.load();
  s.device_errors = i.device_errors.load();
  s.batches = i.batch_count.load();
  s.batched_requests = i.batched.load();
  return s;
}

}  // namespace kernel_server
