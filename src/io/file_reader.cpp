#include "io/file_reader.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "io/io_queue.hpp"

namespace cora::detail {

namespace {

std::error_code sys_error(int err) { return {err, std::system_category()}; }

std::string describe(const char* what, const std::filesystem::path& path, int err) {
  return std::string(what) + " '" + path.string() + "': " + std::strerror(err);
}

std::string short_read(const std::filesystem::path& path, std::size_t got, std::size_t want) {
  return "short read of '" + path.string() + "': " + std::to_string(got) + " of " +
         std::to_string(want) + " bytes (the file shrank while being read)";
}

}  // namespace

std::size_t regular_file_size(int fd, const std::filesystem::path& path, std::error_code& ec,
                              std::string& message, file_identity* identity) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ec = sys_error(errno);
    message = describe("cannot stat", path, errno);
    return 0;
  }
  if (!S_ISREG(st.st_mode)) {
    const int err = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    ec = sys_error(err);
    message = S_ISDIR(st.st_mode) ? describe("cannot read", path, err)
                                  : "cannot read '" + path.string() + "': not a regular file";
    return 0;
  }
  if (identity) {
    auto ns = [](const timespec& t) { return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; };
    *identity = {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                 static_cast<std::uint64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim)};
  }
  return static_cast<std::size_t>(st.st_size);
}

namespace {

/// One whole-file read in flight; owned by the callbacks that continue it.
struct whole_read : std::enable_shared_from_this<whole_read> {
  whole_read(io::io_queue& queue, std::filesystem::path p, file_callback cb)
      : q(queue), path(std::move(p)), done(std::move(cb)) {}

  io::io_queue& q;
  std::filesystem::path path;
  file_callback done;
  int fd = -1;
  std::vector<std::byte> bytes;
  std::size_t got = 0;

  void start() {
    q.open(path.string(), O_RDONLY | O_CLOEXEC,
           [self = shared_from_this()](int res) { self->on_open(res); });
  }

  void on_open(int res) {
    if (res < 0) return finish(sys_error(-res), describe("cannot open", path, -res));
    fd = res;
    std::error_code ec;
    std::string message;
    const std::size_t size = regular_file_size(fd, path, ec, message);
    if (ec) return finish(ec, std::move(message));
    try {
      bytes.resize(size);
    } catch (const std::bad_alloc&) {
      return finish(std::make_error_code(std::errc::not_enough_memory),
                    "cannot read '" + path.string() + "': " + std::to_string(size) +
                        " bytes do not fit in memory");
    }
    next();
  }

  void next() {
    if (got == bytes.size()) return finish({}, {});
    q.read(fd, bytes.data() + got, bytes.size() - got, got, -1,
           [self = shared_from_this()](int res) { self->on_read(res); });
  }

  void on_read(int res) {
    if (res == -EINTR || res == -EAGAIN) return next();
    if (res < 0) return finish(sys_error(-res), describe("cannot read", path, -res));
    if (res == 0)
      return finish(std::make_error_code(std::errc::io_error), short_read(path, got, bytes.size()));
    got += static_cast<std::size_t>(res);
    next();
  }

  void finish(std::error_code ec, std::string message) {
    if (fd >= 0) q.close(fd);
    fd = -1;
    if (ec) bytes.clear();
    done(ec, std::move(message), std::move(bytes));
  }
};

}  // namespace

std::vector<std::byte> read_whole_file_sync(const std::filesystem::path& path, std::error_code& ec,
                                            std::string& message) {
  ec.clear();
  // O_NONBLOCK: a FIFO without a writer must not block the caller (it is refused below).
  int fd = ::open(path.c_str(), io::nonblocking_open_flags(O_RDONLY | O_CLOEXEC));
  fd = io::finish_nonblocking_open(fd < 0 ? -errno : fd);
  if (fd < 0) {
    const int err = -fd;
    ec = sys_error(err);
    message = describe("cannot open", path, err);
    return {};
  }
  std::vector<std::byte> out(regular_file_size(fd, path, ec, message));
  std::size_t done = 0;
  while (!ec && done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ec = sys_error(errno);
      message = describe("cannot read", path, errno);
    } else if (n == 0) {
      ec = std::make_error_code(std::errc::io_error);
      message = short_read(path, done, out.size());
    } else {
      done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  if (ec) out.clear();
  return out;
}

void read_whole_file(const std::filesystem::path& path, file_callback done) {
  std::make_shared<whole_read>(io::default_queue(), path, std::move(done))->start();
}

void file_parts::open(const std::filesystem::path& path, open_callback done) {
  auto& q = io::default_queue();
  q.open(path.string(), O_RDONLY | O_CLOEXEC, [&q, path, done = std::move(done)](int res) {
    if (res < 0) return done(sys_error(-res), describe("cannot open", path, -res), nullptr);
    std::error_code ec;
    std::string message;
    file_identity id;
    regular_file_size(res, path, ec, message, &id);
    if (ec) {
      q.close(res);
      return done(ec, std::move(message), nullptr);
    }
    done({}, {}, std::shared_ptr<file_parts>(new file_parts(path, res, id, false)));
  });
}

std::shared_ptr<file_parts> file_parts::open_cached(const std::filesystem::path& path) noexcept {
  // Kernels before 5.12 reject RESOLVE_CACHED (EINVAL), before 5.6 openat2 itself (ENOSYS):
  // open() then opens every file.
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return nullptr;
  open_how how{};
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;  // a FIFO opens without waiting
  how.resolve = RESOLVE_CACHED;
  const long r = ::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof how);
  if (r < 0) {
    if (errno == ENOSYS || errno == EINVAL || errno == E2BIG)
      unsupported.store(true, std::memory_order_relaxed);
    return nullptr;
  }
  const int fd = static_cast<int>(r);
  try {
    std::error_code ec;
    std::string message;
    file_identity id;
    regular_file_size(fd, path, ec, message, &id);
    if (!ec) return std::shared_ptr<file_parts>(new file_parts(path, fd, id, true));
  } catch (...) {
    // Out of memory: open() reports it.
  }
  ::close(fd);
  return nullptr;
}

namespace {

// Reads what the page cache holds of [offset, offset + len) without waiting; returns how much.
std::size_t read_without_waiting(int fd, std::uint64_t offset, std::size_t len, std::byte* buf) noexcept {
  std::size_t got = 0;
  while (got < len) {
    ::iovec v{buf + got, len - got};
    const ssize_t k = ::preadv2(fd, &v, 1, static_cast<off_t>(offset + got), RWF_NOWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;  // EAGAIN: not cached; EOPNOTSUPP: no such reads; 0: the queue reports it
    got += static_cast<std::size_t>(k);
  }
  return got;
}

/// One part read in flight: reads again after a partial read until all is there.
struct part_read : std::enable_shared_from_this<part_read> {
  std::shared_ptr<file_parts> keep;  // the file stays open until the read is done
  int fd;
  std::uint64_t offset;
  std::byte* buf;
  std::size_t len;
  std::size_t got = 0;
  file_parts::read_callback done;

  void next() {
    if (got == len) return done({}, {});
    io::default_queue().read(fd, buf + got, std::min(len - got, io::max_read_bytes), offset + got, -1,
                             [self = shared_from_this()](int res) { self->on_read(res); });
  }
  void on_read(int res) {
    if (res == -EINTR || res == -EAGAIN) return next();
    if (res < 0) return done(sys_error(-res), describe("cannot read", keep->path(), -res));
    if (res == 0)
      return done(std::make_error_code(std::errc::io_error), short_read(keep->path(), got, len));
    got += static_cast<std::size_t>(res);
    next();
  }
};

}  // namespace

void file_parts::read(std::uint64_t offset, std::size_t len, std::byte* buf, read_callback done,
                      std::size_t here_up_to) {
  std::size_t got = 0;
  if (len <= here_up_to) {
    got = read_without_waiting(fd_, offset, len, buf);
    if (got == len) return done({}, {});
  }
  auto r = std::make_shared<part_read>();
  r->got = got;  // the queue reads the rest
  r->keep = shared_from_this();  // the file stays open while its read is in flight
  r->fd = fd_;
  r->offset = offset;
  r->buf = buf;
  r->len = len;
  r->done = std::move(done);
  r->next();
}

file_parts::~file_parts() {
  if (fd_ < 0) return;
  if (opened_here_)
    ::close(fd_);
  else
    io::default_queue().close(fd_);
}

}  // namespace cora::detail
