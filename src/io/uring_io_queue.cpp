#include "io/uring_io_queue.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace cora::detail::io {

namespace {

constexpr unsigned ring_entries = 256;
constexpr unsigned fixed_slots = 64;

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

std::unique_ptr<uring_io_queue> uring_io_queue::create(std::string& why) {
  std::unique_ptr<uring_io_queue> q(new uring_io_queue());
  if (const int r = io_uring_queue_init(ring_entries, &q->ring_, 0); r < 0) {
    why = "io_uring_queue_init failed: " + errno_text(-r);
    return nullptr;
  }
  q->entries_ = ring_entries;
  // Opened rings on kernels before 5.6 lack the probe and the opcodes used here.
  io_uring_probe* probe = io_uring_get_probe_ring(&q->ring_);
  bool complete = probe != nullptr;
  if (probe) {
    for (int op : {IORING_OP_READ, IORING_OP_OPENAT, IORING_OP_CLOSE, IORING_OP_ASYNC_CANCEL,
                   IORING_OP_READ_FIXED})
      complete = complete && io_uring_opcode_supported(probe, op);
    io_uring_free_probe(probe);
  }
  if (!complete) {
    io_uring_queue_exit(&q->ring_);
    why = "the kernel's io_uring lacks read, openat, close or cancel (Linux 5.6 or later needed)";
    return nullptr;
  }
  q->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (q->wake_fd_ < 0) {
    why = "eventfd failed: " + errno_text(errno);
    io_uring_queue_exit(&q->ring_);
    return nullptr;
  }
  // A sparse table lets staging buffers be registered and dropped one at a time (Linux 5.19).
  if (io_uring_register_buffers_sparse(&q->ring_, fixed_slots) == 0) {
    q->slot_count_ = fixed_slots;
    for (int i = static_cast<int>(fixed_slots) - 1; i >= 0; --i) q->free_slots_.push_back(i);
  }
  q->arm_wakeup();
  io_uring_submit(&q->ring_);
  q->thread_ = std::thread([p = q.get()] { p->run(); });
  q->thread_id_ = q->thread_.get_id();
  return q;
}

uring_io_queue::~uring_io_queue() {
  if (thread_.joinable()) {
    post([this] { stop_ = true; });
    thread_.join();
  }
  if (entries_) io_uring_queue_exit(&ring_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

std::string uring_io_queue::detail() const {
  std::string d = std::to_string(entries_) + " entries, ";
  d += slot_count_ ? "fixed buffers" : "no fixed buffers (kernel before 5.19)";
  return d;
}

void uring_io_queue::post(std::function<void()> fn) {
  if (on_io_thread()) {
    fn();
    return;
  }
  {
    std::lock_guard lock(post_mutex_);
    posted_.push_back(std::move(fn));
  }
  if (!wake_pending_.exchange(true, std::memory_order_acq_rel)) {
    const std::uint64_t one = 1;
    // Cannot fail short of a counter overflow, which the ring's read prevents.
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }
}

io_uring_sqe* uring_io_queue::next_sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (!sqe) {
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

void uring_io_queue::arm_wakeup() {
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_read(sqe, wake_fd_, &wake_count_, sizeof(wake_count_), 0);
  io_uring_sqe_set_data64(sqe, wake_id);
}

std::uint64_t uring_io_queue::open(std::string path, int flags, io_callback done) {
  const std::uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  post([this, id, path = std::move(path), flags, done = std::move(done)]() mutable {
    auto& r = live_[id];
    // O_NONBLOCK: an open of a FIFO without a writer would hold the request (and the load
    // waiting for it) forever.
    r.done = [done = std::move(done)](int res) { done(finish_nonblocking_open(res)); };
    r.path = std::move(path);
    io_uring_sqe* sqe = next_sqe();
    io_uring_prep_openat(sqe, AT_FDCWD, r.path.c_str(), nonblocking_open_flags(flags), 0);
    io_uring_sqe_set_data64(sqe, id);
  });
  return id;
}

std::uint64_t uring_io_queue::read(int fd, void* buf, std::size_t len, std::uint64_t offset,
                                   int buf_index, io_callback done) {
  const std::uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  post([this, id, fd, buf, len, offset, buf_index, done = std::move(done)]() mutable {
    live_[id].done = std::move(done);
    io_uring_sqe* sqe = next_sqe();
    const auto n = static_cast<unsigned>(std::min(len, max_read_bytes));
    if (buf_index >= 0)
      io_uring_prep_read_fixed(sqe, fd, buf, n, offset, buf_index);
    else
      io_uring_prep_read(sqe, fd, buf, n, offset);
    io_uring_sqe_set_data64(sqe, id);
  });
  return id;
}

void uring_io_queue::cancel(std::uint64_t id) noexcept {
  try {
    // Posted after the request's own submission, so a live id is always in flight; a finished
    // one is no longer in live_, and ids are never reused.
    post([this, id] {
      if (!live_.count(id)) return;
      io_uring_sqe* sqe = next_sqe();
      io_uring_prep_cancel64(sqe, id, 0);
      io_uring_sqe_set_data64(sqe, ignore_id);
    });
  } catch (...) {
    // Out of memory: the request simply runs to its end.
  }
}

void uring_io_queue::close(int fd) noexcept {
  try {
    post([this, fd] {
      io_uring_sqe* sqe = next_sqe();
      io_uring_prep_close(sqe, fd);
      io_uring_sqe_set_data64(sqe, ignore_id);
    });
  } catch (...) {
    ::close(fd);
  }
}

int uring_io_queue::register_buffer(void* p, std::size_t len) noexcept {
  int slot;
  {
    std::lock_guard lock(slot_mutex_);
    if (free_slots_.empty()) return -1;
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  iovec iov{p, len};
  __u64 tag = 0;
  // Fails with ENOMEM past RLIMIT_MEMLOCK (unprivileged users): reads then go unregistered.
  if (io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(slot), &iov, &tag, 1) != 1) {
    std::lock_guard lock(slot_mutex_);
    free_slots_.push_back(slot);
    return -1;
  }
  return slot;
}

void uring_io_queue::unregister_buffer(int index) noexcept {
  if (index < 0) return;
  iovec iov{nullptr, 0};
  __u64 tag = 0;
  io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(index), &iov, &tag, 1);
  std::lock_guard lock(slot_mutex_);
  free_slots_.push_back(index);
}

void uring_io_queue::run() {
  std::vector<std::pair<std::uint64_t, int>> done;
  std::vector<std::function<void()>> tasks;
  while (!stop_) {
    const int r = io_uring_submit_and_wait(&ring_, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      // Nothing sensible is left to do with a broken ring; keep reaping what completes.
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) < 0) continue;
    }
    io_uring_cqe* cqe;
    unsigned head;
    unsigned n = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      done.emplace_back(io_uring_cqe_get_data64(cqe), cqe->res);
      ++n;
    }
    io_uring_cq_advance(&ring_, n);
    for (auto [id, res] : done) {
      if (id == ignore_id) continue;
      if (id == wake_id) {
        wake_pending_.store(false, std::memory_order_release);
        arm_wakeup();
        {
          std::lock_guard lock(post_mutex_);
          tasks.swap(posted_);
        }
        for (auto& t : tasks) t();
        tasks.clear();
        continue;
      }
      auto it = live_.find(id);
      if (it == live_.end()) continue;
      io_callback cb = std::move(it->second.done);
      live_.erase(it);
      cb(res);
    }
    done.clear();
  }
}

}  // namespace cora::detail::io
