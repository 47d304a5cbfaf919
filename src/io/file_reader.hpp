// Reading whole files (kernel binaries) without blocking the caller.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
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

/// The size of the open file `fd`, checked to be a regular file (EISDIR for a directory,
/// EINVAL for other kinds); sets `ec` and a message naming `path` otherwise.
std::size_t regular_file_size(int fd, const std::filesystem::path& path, std::error_code& ec,
                              std::string& message);

/// Reads all of `path` on the calling thread (blocking), with the same errors.
std::vector<std::byte> read_whole_file_sync(const std::filesystem::path& path, std::error_code& ec,
                                            std::string& message);

}  // namespace cora::detail
