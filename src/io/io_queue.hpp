// The queue that file I/O is submitted to: io_uring where the kernel allows it, a thread doing
// blocking calls otherwise. Callers never block on it; results come back through callbacks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace cora::detail::io {

/// The result of a request: a byte count or a file descriptor (>= 0), or -errno.
using io_callback = std::function<void(int res)>;

/// An asynchronous file I/O queue. Every function may be called from any thread. Callbacks run
/// on the queue's own thread, one at a time, never inside the call that submitted them; they
/// must be short (submit more work, enqueue copies) and must not block.
class io_queue {
 public:
  virtual ~io_queue() = default;

  /// "io_uring" or "blocking".
  virtual std::string_view name() const noexcept = 0;

  /// Opens `path` with `flags` (O_RDONLY, O_DIRECT...); the callback gets the descriptor.
  /// Returns the request's id, for cancel(). The open never waits for a FIFO's writer or a
  /// device: it is made with O_NONBLOCK, which is cleared again for a regular file (other
  /// kinds keep it; callers refuse them after their fstat).
  virtual std::uint64_t open(std::string path, int flags, io_callback done) = 0;
  /// Reads up to `len` bytes at `offset` into `buf`. `buf_index` is the buffer's index from
  /// register_buffer() when the whole of [buf, buf + len) lies in it, or -1.
  virtual std::uint64_t read(int fd, void* buf, std::size_t len, std::uint64_t offset,
                             int buf_index, io_callback done) = 0;
  /// Asks request `id` to stop early. Its callback still runs: with -ECANCELED if it stopped,
  /// with its result if it had already finished. Unknown or finished ids are ignored.
  virtual void cancel(std::uint64_t id) noexcept = 0;
  /// Closes `fd` without waiting for it.
  virtual void close(int fd) noexcept = 0;

  /// Registers a buffer for reads without per-request page pinning (io_uring fixed buffers).
  /// Returns its index, or -1 when the queue has none to offer (reads then work unregistered).
  virtual int register_buffer(void* p, std::size_t len) noexcept;
  virtual void unregister_buffer(int index) noexcept;
};

/// Opens with O_NONBLOCK added to `flags` (what open() passes on).
int nonblocking_open_flags(int flags) noexcept;
/// Completes an open made with nonblocking_open_flags(): for a regular file, clears
/// O_NONBLOCK again; returns `res` (a descriptor or -errno), or -errno if fcntl fails.
int finish_nonblocking_open(int res) noexcept;

/// The process's queue: io_uring unless it is unavailable (old kernel, seccomp) or
/// CORA_IO_BACKEND=blocking asks for the fallback. Started on first use, never destroyed (work
/// may still be in flight while the process exits).
io_queue& default_queue();
/// The blocking fallback queue (read_options::force_blocking).
io_queue& fallback_queue();

/// Upper bound of one read request (io_uring results are 32-bit).
inline constexpr std::size_t max_read_bytes = std::size_t{1} << 30;

}  // namespace cora::detail::io
