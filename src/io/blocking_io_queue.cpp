#include "io/blocking_io_queue.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace cora::detail::io {

blocking_io_queue::blocking_io_queue() : thread_([this] { run(); }) {}

blocking_io_queue::~blocking_io_queue() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

std::uint64_t blocking_io_queue::push(job j) {
  std::uint64_t id;
  {
    std::lock_guard lock(mutex_);
    id = j.id = next_id_++;
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
  return id;
}

std::uint64_t blocking_io_queue::open(std::string path, int flags, io_callback done) {
  job j;
  j.k = job::kind::open;
  j.path = std::move(path);
  j.flags = flags;
  j.done = std::move(done);
  return push(std::move(j));
}

std::uint64_t blocking_io_queue::read(int fd, void* buf, std::size_t len, std::uint64_t offset,
                                      int, io_callback done) {
  job j;
  j.k = job::kind::read;
  j.fd = fd;
  j.buf = buf;
  j.len = std::min(len, max_read_bytes);
  j.offset = offset;
  j.done = std::move(done);
  return push(std::move(j));
}

void blocking_io_queue::cancel(std::uint64_t id) noexcept {
  std::lock_guard lock(mutex_);
  const bool queued =
      std::any_of(jobs_.begin(), jobs_.end(), [id](const job& j) { return j.id == id; });
  if (!queued) return;
  try {
    cancelled_.insert(id);
  } catch (...) {
    // Out of memory: the read simply runs.
  }
}

void blocking_io_queue::close(int fd) noexcept {
  try {
    job j;
    j.k = job::kind::close;
    j.fd = fd;
    push(std::move(j));
  } catch (...) {
    ::close(fd);
  }
}

void blocking_io_queue::run() {
  for (;;) {
    job j;
    bool skip;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left
      j = std::move(jobs_.front());
      jobs_.pop_front();
      skip = cancelled_.erase(j.id) != 0;
    }
    int res = -ECANCELED;
    if (!skip) {
      switch (j.k) {
        case job::kind::open:
          // O_NONBLOCK: a FIFO without a writer must not stop this thread, and every later
          // request with it.
          res = ::open(j.path.c_str(), nonblocking_open_flags(j.flags));
          res = finish_nonblocking_open(res < 0 ? -errno : res);
          break;
        case job::kind::read: {
          ssize_t n;
          do n = ::pread(j.fd, j.buf, j.len, static_cast<off_t>(j.offset));
          while (n < 0 && errno == EINTR);
          res = n < 0 ? -errno : static_cast<int>(n);
          break;
        }
        case job::kind::close:
          ::close(j.fd);
          break;
      }
    }
    if (j.done) j.done(res);
  }
}

}  // namespace cora::detail::io
