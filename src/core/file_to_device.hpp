// stream::read_file: a file region streamed into device memory through a ring of pinned
// staging buffers, each chunk's host-to-device copy overlapping the next chunks' reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "cora/pending.hpp"
#include "cora/stream.hpp"
#include "core/staging_pool.hpp"

namespace cora::detail {

class stream_state;

namespace io {

/// Starts reading `bytes` bytes of `path` at `offset` into `dst` on stream `s`; returns at
/// once (the file is opened on the I/O queue). See stream::read_file for the contract.
pending<std::size_t> read_file_to_device(stream_state& s, void* dst,
                                         const std::filesystem::path& path, std::uint64_t offset,
                                         std::size_t bytes, const read_options& options);

}  // namespace io
}  // namespace cora::detail
