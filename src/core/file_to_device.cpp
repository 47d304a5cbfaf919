#include "core/file_to_device.hpp"

#include <fcntl.h>

#include <algorithm>
#include <asio/error.hpp>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/host_memory_probe.hpp"
#include "core/state.hpp"
#include "io/file_reader.hpp"
#include "io/io_queue.hpp"

namespace cora::detail::io {

namespace {

std::error_code sys_error(int err) { return {err, std::system_category()}; }

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

/// One read_file in flight. It is its own completion source: the pending the caller holds
/// refers to it, and a cancelled wait reaches it through request_cancel().
///
/// Threads: open and read completions arrive on the I/O queue's thread, copy completions on
/// the engine thread (or whichever thread polls the stream), cancellation on any thread; all
/// state is guarded by `mutex_`. Lock order: this op's mutex, then the stream's or the queue's.
class file_read_op final : public async_state<std::size_t> {
 public:
  file_read_op(io_queue& q, stream_state& s, std::byte* dst, std::filesystem::path path,
               std::uint64_t offset, std::size_t bytes, const read_options& options)
      : q_(q),
        stream_(intrusive_ptr<stream_state>::share(&s)),
        device_(s.device),
        dst_(dst),
        path_(std::move(path)),
        offset_(offset),
        bytes_(bytes),
        options_(options),
        direct_(options.direct) {}

  ~file_read_op() override = default;

  void start() {
    std::unique_lock lock(mutex_);
    self_ = intrusive_ptr<file_read_op>::share(this);
    open_locked();
  }

  bool request_cancel(std::uint64_t) noexcept override {
    auto keep = intrusive_ptr<file_read_op>::share(this);
    std::unique_lock lock(mutex_);
    if (finished_) return false;
    fail_locked(asio::error::operation_aborted, {});
    settle(lock);
    return true;
  }

 private:
  enum class slot_state { idle, reading, ready, copying };

  struct slot;
  // Wait node of one slot's copy: completes on the thread that detects the copy's end.
  struct copy_wait : wait_node {
    file_read_op* op = nullptr;
    slot* owner = nullptr;
  };
  struct slot {
    staging_buffer buf;
    std::byte* host = nullptr;  // buf.host
    int reg = -1;               // fixed-buffer index for reads on q_, or -1
    slot_state st = slot_state::idle;
    std::size_t chunk = 0;  // chunk index being read or copied
    std::size_t got = 0;    // bytes of the chunk read so far
    std::size_t copy_bytes = 0;
    std::uint64_t request = 0;
    op_handle copy;
    copy_wait wait;
  };

  // --- opening --------------------------------------------------------------------------------

  void open_locked() {
    int flags = O_RDONLY | O_CLOEXEC;
    if (direct_) flags |= O_DIRECT;
    opening_ = true;
    open_request_ = q_.open(path_.string(), flags, [op = self_](int res) { op->on_open(res); });
  }

  void on_open(int res) {
    std::unique_lock lock(mutex_);
    opening_ = false;
    if (stopping_) {
      if (res >= 0) q_.close(res);
      return settle(lock);
    }
    if (res == -EINVAL && direct_) {  // the file system refuses O_DIRECT
      direct_ = false;
      open_locked();
      return;
    }
    if (res < 0) {
      fail_locked(sys_error(-res), "cannot open '" + path_.string() + "': " + std::strerror(-res));
      return settle(lock);
    }
    fd_ = res;
    std::error_code ec;
    std::string message;
    const std::uint64_t size = regular_file_size(fd_, path_, ec, message);
    if (ec) {
      fail_locked(ec, std::move(message));
      return settle(lock);
    }
    if (offset_ > size || bytes_ > size - offset_) {
      fail_locked(make_error_code(errc::out_of_range),
                  "cannot read " + std::to_string(bytes_) + " bytes at offset " +
                      std::to_string(offset_) + " of '" + path_.string() + "': the file has " +
                      std::to_string(size) + " bytes");
      return settle(lock);
    }
    plan();
    if (chunks_ > 0 && slots_.empty() && !make_slots(ec, message)) {
      fail_locked(ec, std::move(message));
      return settle(lock);
    }
    pump_locked();
    settle(lock);
  }

  /// Splits the file span into chunks. Direct reads widen the span to aligned boundaries; the
  /// bytes outside [offset, offset + bytes) are read but never copied.
  void plan() {
    const std::uint64_t align = direct_ ? direct_alignment : 1;
    end_ = offset_ + bytes_;
    span_begin_ = offset_ / align * align;
    const std::uint64_t span_end = round_up(end_, align);
    chunk_ = static_cast<std::size_t>(
        round_up(std::clamp<std::uint64_t>(options_.chunk_bytes, align, max_read_bytes / 2), align));
    chunks_ = bytes_ == 0 ? 0 : static_cast<std::size_t>((span_end - span_begin_ + chunk_ - 1) / chunk_);
    span_end_ = span_end;
    next_read_ = next_copy_ = done_chunks_ = 0;
  }

  bool make_slots(std::error_code& ec, std::string& message) {
    const std::size_t n = std::min<std::size_t>(options_.depth, chunks_);
    // A small read needs no more than its span.
    const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_, span_end_ - span_begin_));
    for (std::size_t i = 0; i < n; ++i) {
      auto s = std::make_unique<slot>();
      // Registered only for direct reads, where the saved per-read page pinning matters.
      s->buf = take_staging(*device_, size, direct_ ? &q_ : nullptr, ec);
      if (ec) {
        message = "cannot allocate " + std::to_string(n) + " staging buffers of " +
                  std::to_string(size) + " bytes for reading '" + path_.string() + "'";
        return false;
      }
      s->host = s->buf.host;
      s->reg = s->buf.queue == &q_ ? s->buf.reg : -1;
      s->wait.op = this;
      s->wait.owner = s.get();
      s->wait.on_complete = &on_copy_complete;
      slots_.push_back(std::move(s));
    }
    return true;
  }

  // --- reading --------------------------------------------------------------------------------

  std::uint64_t chunk_begin(std::size_t c) const { return span_begin_ + std::uint64_t{c} * chunk_; }
  std::size_t chunk_len(std::size_t c) const {
    return static_cast<std::size_t>(std::min<std::uint64_t>(chunk_, span_end_ - chunk_begin(c)));
  }
  /// The bytes of chunk `c` that must be read: up to the end of the requested range.
  std::size_t chunk_need(std::size_t c) const {
    return static_cast<std::size_t>(std::min<std::uint64_t>(chunk_begin(c) + chunk_len(c), end_) -
                                    chunk_begin(c));
  }

  /// Starts reads into idle slots. Until a direct read has succeeded, one read at a time, so
  /// that an EINVAL (no O_DIRECT here) is met before any data is copied.
  void pump_locked() {
    if (stopping_ || fd_ < 0) return;
    for (auto& s : slots_) {
      if (next_read_ >= chunks_) return;
      if (direct_ && !direct_confirmed_ && reads_in_flight_ > 0) return;
      if (s->st != slot_state::idle) continue;
      s->st = slot_state::reading;
      s->chunk = next_read_++;
      s->got = 0;
      submit_read_locked(*s);
    }
  }

  void submit_read_locked(slot& s) {
    ++reads_in_flight_;
    const std::uint64_t at = chunk_begin(s.chunk) + s.got;
    s.request = q_.read(fd_, s.host + s.got, chunk_len(s.chunk) - s.got, at, s.reg,
                        [op = self_, sp = &s](int res) { op->on_read(*sp, res); });
  }

  void on_read(slot& s, int res) {
    std::unique_lock lock(mutex_);
    --reads_in_flight_;
    if (stopping_) {
      s.st = slot_state::idle;
      return settle(lock);
    }
    if (res == -EINVAL && direct_ && !direct_confirmed_) {
      // O_DIRECT opened but reads are refused (alignment): reopen buffered and start over.
      s.st = slot_state::idle;
      q_.close(fd_);
      fd_ = -1;
      direct_ = false;
      plan();
      open_locked();
      return;
    }
    if (res == -EINTR || res == -EAGAIN) {
      submit_read_locked(s);
      return;
    }
    if (res < 0) {
      fail_locked(sys_error(-res), "cannot read '" + path_.string() + "' at offset " +
                                       std::to_string(chunk_begin(s.chunk) + s.got) + ": " +
                                       std::strerror(-res));
      s.st = slot_state::idle;
      return settle(lock);
    }
    if (direct_) direct_confirmed_ = true;
    s.got += static_cast<std::size_t>(res);
    const std::uint64_t pos = chunk_begin(s.chunk) + s.got;
    if (s.got < chunk_need(s.chunk)) {
      // A read that ends early hit the end of the file (or, with O_DIRECT, an unaligned end
      // that the next read could not continue from): the file shrank after it was opened.
      if (res == 0 || (direct_ && pos % direct_alignment != 0)) {
        fail_locked(std::make_error_code(std::errc::io_error),
                    "'" + path_.string() + "' shrank while being read: it ends at byte " +
                        std::to_string(pos) + ", before the end of the requested range at byte " +
                        std::to_string(end_));
        s.st = slot_state::idle;
        return settle(lock);
      }
      submit_read_locked(s);
      return;
    }
    s.st = slot_state::ready;
    enqueue_copies_locked();
    pump_locked();
    settle(lock);
  }

  // --- copying --------------------------------------------------------------------------------

  /// Enqueues the copies of ready chunks in file order, so that the device receives a growing
  /// prefix of the range (what a cancellation leaves behind is that prefix).
  void enqueue_copies_locked() {
    while (!stopping_ && next_copy_ < chunks_) {
      auto it = std::find_if(slots_.begin(), slots_.end(), [&](const auto& s) {
        return s->st == slot_state::ready && s->chunk == next_copy_;
      });
      if (it == slots_.end()) return;
      slot& s = **it;
      const std::uint64_t begin = chunk_begin(s.chunk);
      const std::uint64_t lo = std::max(begin, offset_);
      const std::uint64_t hi = std::min(begin + chunk_len(s.chunk), end_);
      std::byte* src = s.host + (lo - begin);
      std::byte* dst = dst_ + (lo - offset_);
      const auto n = static_cast<std::size_t>(hi - lo);
      auto& st = *stream_;
      s.copy = st.enqueue([&](std::uint64_t seq, std::error_code&, std::string&) {
        st.backend->copy(seq, dst, src, n, false);
      });
      s.copy.observe();  // its failure is reported through this op
      s.copy_bytes = n;
      s.st = slot_state::copying;
      ++copies_in_flight_;
      ++next_copy_;
      if (!s.copy.source()->arm(s.wait, s.copy.seq(), nullptr)) copy_done_locked(s, s.wait.ec);
    }
  }

  static void on_copy_complete(wait_node& n, bool) noexcept {
    auto& w = static_cast<copy_wait&>(n);
    w.op->on_copy(*w.owner, n.ec);
  }

  void on_copy(slot& s, std::error_code ec) noexcept {
    auto keep = intrusive_ptr<file_read_op>::share(this);
    std::unique_lock lock(mutex_);
    copy_done_locked(s, ec);
    enqueue_copies_locked();
    pump_locked();
    settle(lock);
  }

  void copy_done_locked(slot& s, std::error_code ec) noexcept {
    --copies_in_flight_;
    if (ec) {
      std::string m = s.copy.source() ? s.copy.source()->message(s.copy.seq()) : std::string();
      fail_locked(ec, "copying '" + path_.string() + "' to the device failed" +
                          (m.empty() ? std::string() : ": " + m));
    } else {
      copied_ += s.copy_bytes;
      ++done_chunks_;
    }
    s.copy = {};
    s.st = slot_state::idle;  // only now may the staging buffer take the next chunk
  }

  // --- ending ---------------------------------------------------------------------------------

  /// Records the first failure and stops: in-flight reads are cancelled, in-flight copies run
  /// to their end (their staging buffers are busy until then).
  void fail_locked(std::error_code ec, std::string message) noexcept {
    if (!error_) {
      error_ = ec;
      try {
        message_ = std::move(message);
      } catch (...) {
      }
    }
    if (stopping_) return;
    stopping_ = true;
    if (opening_) q_.cancel(open_request_);
    for (auto& s : slots_)
      if (s->st == slot_state::reading) q_.cancel(s->request);
  }

  /// Completes the op once nothing is in flight: releases the staging buffers and the file,
  /// then (outside the lock) fires the waiters.
  void settle(std::unique_lock<std::mutex>& lock) noexcept {
    const bool all_done = !stopping_ && !opening_ && fd_ >= 0 && done_chunks_ == chunks_;
    const bool stopped = stopping_ && !opening_ && reads_in_flight_ == 0 && copies_in_flight_ == 0;
    if (finished_ || !(all_done || stopped)) return;
    finished_ = true;
    if (fd_ >= 0) q_.close(fd_);
    fd_ = -1;
    for (auto& s : slots_) give_back_staging(*device_, s->buf);
    slots_.clear();
    std::error_code ec = error_;
    std::string message = std::move(message_);
    if (ec == asio::error::operation_aborted)
      message = "reading '" + path_.string() + "' was cancelled after " + std::to_string(copied_) +
                " of " + std::to_string(bytes_) + " bytes reached the device (the destination's first " +
                std::to_string(copied_) + " bytes hold them; the rest is untouched)";
    else if (ec)
      message += " (" + std::to_string(copied_) + " of " + std::to_string(bytes_) +
                 " bytes had reached the device)";
    if (!ec) set_value(copied_);
    // Every caller holds a reference of its own, so dropping self_ here never destroys this.
    self_.reset();
    lock.unlock();
    try {
      complete(ec, std::move(message));
    } catch (...) {
    }
  }

  io_queue& q_;
  intrusive_ptr<stream_state> stream_;
  std::shared_ptr<device_state> device_;
  std::byte* const dst_;
  const std::filesystem::path path_;
  const std::uint64_t offset_;
  const std::size_t bytes_;
  const read_options options_;

  std::mutex mutex_;
  intrusive_ptr<file_read_op> self_;  // alive until completion, whoever holds the pending
  bool direct_;
  bool direct_confirmed_ = false;
  bool opening_ = false;
  std::uint64_t open_request_ = 0;
  int fd_ = -1;
  std::uint64_t end_ = 0, span_begin_ = 0, span_end_ = 0;
  std::size_t chunk_ = 0, chunks_ = 0;
  std::size_t next_read_ = 0, next_copy_ = 0, done_chunks_ = 0;
  std::size_t reads_in_flight_ = 0, copies_in_flight_ = 0;
  std::size_t copied_ = 0;
  std::vector<std::unique_ptr<slot>> slots_;
  bool stopping_ = false;
  bool finished_ = false;
  std::error_code error_;
  std::string message_;
};

pending<std::size_t> failed(std::error_code ec, std::string message, stream_state* s) {
  auto st = make_intrusive<async_state<std::size_t>>();
  if (s) st->set_sticky_target(intrusive_ptr<completion_source>::share(s));
  st->complete(ec, std::move(message));
  return pending<std::size_t>(op_handle(intrusive_ptr<completion_source>(std::move(st)), 0));
}

}  // namespace

pending<std::size_t> read_file_to_device(stream_state& s, void* dst,
                                         const std::filesystem::path& path, std::uint64_t offset,
                                         std::size_t bytes, const read_options& options) {
  if (options.chunk_bytes == 0 || options.depth == 0)
    return failed(make_error_code(errc::invalid_argument),
                  "read_options needs a chunk size and a depth of at least 1", &s);
  if (offset > ~std::uint64_t{0} - bytes)
    return failed(make_error_code(errc::out_of_range), "offset + bytes overflows", &s);
  if (s.device->shut_down.load(std::memory_order_acquire))
    return failed(make_error_code(errc::runtime_shut_down), "the runtime was shut down", &s);
  if (bytes > 0) {
    std::error_code ec;
    const memory_region r = s.device->classify(dst, bytes, ec);
    if (ec) return failed(ec, "read_file destination: " + last_error_message(), &s);
    if (r.k == memory_region::kind::pageable_host &&
        !host_range_mapped(dst, bytes, s.device->properties.backend == backend_kind::cpu))
      return failed(make_error_code(errc::invalid_pointer),
                    "read_file destination is neither an allocation nor mapped host memory", &s);
    if (r.k == memory_region::kind::device &&
        r.device->properties.backend != s.device->properties.backend)
      return failed(make_error_code(errc::wrong_device),
                    "read_file destination is memory of " + r.device->properties.name +
                        ", which this stream's device cannot reach",
                    &s);
  }
  io_queue& q = options.force_blocking ? fallback_queue() : default_queue();
  auto op = make_intrusive<file_read_op>(q, s, static_cast<std::byte*>(dst), path, offset, bytes,
                                         options);
  op->set_sticky_target(intrusive_ptr<completion_source>::share(&s));
  op->start();
  return pending<std::size_t>(op_handle(intrusive_ptr<completion_source>(std::move(op)), 0));
}

}  // namespace cora::detail::io
