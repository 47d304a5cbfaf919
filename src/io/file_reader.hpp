// Reading whole files (kernel binaries) without blocking the caller.
#pragma once

#include <cstddef>
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

/// A regular file read on the calling thread only where that needs no wait: the path resolves
/// from the kernel's caches alone (openat2 with RESOLVE_CACHED) and reads take pages that are in
/// the page cache (preadv2 with RWF_NOWAIT). Where either would wait, or fails, open() or read()
/// returns false and the caller reads through the I/O queue instead, which reports errors.
class cached_file {
 public:
  cached_file() = default;
  ~cached_file();
  cached_file(const cached_file&) = delete;
  cached_file& operator=(const cached_file&) = delete;

  /// Opens `path` if that needs no wait and it is a regular file; false otherwise.
  bool open(const std::filesystem::path& path) noexcept;
  /// The file's size when it was opened.
  std::uint64_t size() const noexcept { return size_; }
  /// Reads all of [offset, offset + len) into `buf` if every byte of it is cached; false
  /// otherwise (also when the file shrank).
  bool read(std::uint64_t offset, std::size_t len, std::byte* buf) noexcept;

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// The size of the open file `fd`, checked to be a regular file (EISDIR for a directory,
/// EINVAL for other kinds); sets `ec` and a message naming `path` otherwise.
std::size_t regular_file_size(int fd, const std::filesystem::path& path, std::error_code& ec,
                              std::string& message);

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

  /// The file's size when it was opened.
  std::uint64_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Reads all of [offset, offset + len) into `buf` (which must stay valid until `done`);
  /// returns at once. `done` runs on the queue's thread; std::errc::io_error for a short read.
  void read(std::uint64_t offset, std::size_t len, std::byte* buf, read_callback done);

  ~file_parts();
  file_parts(const file_parts&) = delete;
  file_parts& operator=(const file_parts&) = delete;

 private:
  file_parts(std::filesystem::path path, int fd, std::uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  std::filesystem::path path_;
  int fd_;
  std::uint64_t size_;
};

/// Reads all of `path` on the calling thread (blocking), with the same errors.
std::vector<std::byte> read_whole_file_sync(const std::filesystem::path& path, std::error_code& ec,
                                            std::string& message);

}  // namespace cora::detail
