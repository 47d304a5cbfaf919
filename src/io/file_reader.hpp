// Reading whole files without blocking the caller.
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

/// Reads all of `path` off the calling thread; calls `done` on an I/O thread.
void read_whole_file(const std::filesystem::path& path, file_callback done);

/// Reads all of `path` on the calling thread (blocking).
std::vector<std::byte> read_whole_file_sync(const std::filesystem::path& path, std::error_code& ec,
                                            std::string& message);

}  // namespace cora::detail
