// Reading whole files (kernel binaries) without blocking the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace cora::detail {

/// Called with the file's bytes, or with an error and a message that names the path.
using file_callback =
    std::function<void(std::error_code ec, std::string message, std::vector<std::byte> bytes)>;

/// Reads all of `path` through the process's I/O queue (io_uring, or the blocking fallback);
/// returns at once. `done` runs on the queue's thread: it must hand long work elsewhere.
/// Errors: the open's errno (not found, permission denied...), EISDIR for a directory, EINVAL
/// for other non-regular files, std::errc::io_error for a short read (the file shrank).
void read_whole_file(const std::filesystem::path& path, file_callback done);

/// What tells one state of a file from another: the file (device, inode), its size and its
/// modification and change times (nanoseconds since the epoch).
struct file_identity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size = 0;
  std::int64_t modified_ns = 0;
  std::int64_t changed_ns = 0;
  friend bool operator==(const file_identity&, const file_identity&) = default;
};

/// The size of the open file `fd`, checked to be a regular file (EISDIR for a directory,
/// EINVAL for other kinds); sets `ec` and a message naming `path` otherwise. `identity`, if
/// given, receives the file's identity.
std::size_t regular_file_size(int fd, const std::filesystem::path& path, std::error_code& ec,
                              std::string& message, file_identity* identity = nullptr);

/// A regular file open for reads of chosen parts through the process's I/O queue, so that a
/// loader reads what it needs of a large file (a container's metadata and one image), not all
/// of it. Closed (without waiting) when the last reference goes.
class file_parts : public std::enable_shared_from_this<file_parts> {
 public:
  using open_callback =
      std::function<void(std::error_code ec, std::string message, std::shared_ptr<file_parts> file)>;
  using read_callback = std::function<void(std::error_code ec, std::string message)>;

  /// Opens `path`; returns at once. `done` runs on the queue's thread, with the file or with
  /// read_whole_file's errors.
  static void open(const std::filesystem::path& path, open_callback done);
  /// Opens `path` on the calling thread where that cannot wait: the path resolves from the
  /// kernel's caches alone (openat2 with RESOLVE_CACHED) and names a regular file. Null
  /// otherwise, errors included (open() then reports them). Such a file is closed on the thread
  /// that drops it last (a close of a file only read does not wait), not through the queue.
  static std::shared_ptr<file_parts> open_cached(const std::filesystem::path& path) noexcept;

  /// The file's size when it was opened.
  std::uint64_t size() const noexcept { return identity_.size; }
  /// The file's identity when it was opened.
  const file_identity& identity() const noexcept { return identity_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Reads all of [offset, offset + len) into `buf` (which must stay valid until `done`);
  /// returns at once. `done` runs on the queue's thread; std::errc::io_error for a short read.
  /// A part of at most `here_up_to` bytes whose pages are all in the page cache is read on the
  /// calling thread instead (preadv2 with RWF_NOWAIT), and `done` runs there before read
  /// returns.
  void read(std::uint64_t offset, std::size_t len, std::byte* buf, read_callback done,
            std::size_t here_up_to = 0);

  ~file_parts();
  file_parts(const file_parts&) = delete;
  file_parts& operator=(const file_parts&) = delete;

 private:
  file_parts(std::filesystem::path path, int fd, const file_identity& identity, bool opened_here)
      : path_(std::move(path)), fd_(fd), identity_(identity), opened_here_(opened_here) {}
  std::filesystem::path path_;
  int fd_;
  file_identity identity_;
  bool opened_here_;  // by open_cached: closed where the last reference goes, as it was opened
};

/// Reads all of `path` on the calling thread (blocking), with the same errors.
std::vector<std::byte> read_whole_file_sync(const std::filesystem::path& path, std::error_code& ec,
                                            std::string& message);

}  // namespace cora::detail
