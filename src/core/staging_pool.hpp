// Pinned staging buffers for file reads, kept per device between reads: allocating pinned
// memory (and faulting it in, and registering it with the ring) costs far more than reading
// a few megabytes, so buffers are reused until the device shuts down.
#pragma once

#include <cstddef>
#include <system_error>

namespace cora::detail {

class device_state;

namespace io {

class io_queue;

/// One staging buffer: pinned memory of a device, `host` aligned for O_DIRECT.
struct staging_buffer {
  std::byte* alloc = nullptr;  // the pinned allocation
  std::byte* host = nullptr;   // aligned start inside it
  std::size_t size = 0;        // usable bytes from `host`
  io_queue* queue = nullptr;   // the queue `reg` belongs to
  int reg = -1;                // fixed-buffer index in `queue`, or -1
};

/// A buffer of at least `size` bytes for `dev`, from the cache or newly allocated. With
/// `register_with`, the buffer is registered with that queue where it can be (fixed buffers);
/// `reg` tells whether it is.
staging_buffer take_staging(device_state& dev, std::size_t size, io_queue* register_with,
                            std::error_code& ec);
/// Returns a buffer that no read or copy uses any more: cached, or freed when the cache is
/// full or the device is shutting down.
void give_back_staging(device_state& dev, staging_buffer b) noexcept;

/// Staging memory taken by reads and not given back yet, in bytes (for tests: it must return
/// to zero once every read has completed, cancelled or not).
std::size_t staging_bytes_in_use() noexcept;

/// Alignment of file offsets, lengths and memory for O_DIRECT reads: 4 KiB covers the logical
/// block size of practically every device; a file system that wants more fails the first read
/// with EINVAL and the read goes on buffered.
inline constexpr std::size_t direct_alignment = 4096;

}  // namespace io
}  // namespace cora::detail
