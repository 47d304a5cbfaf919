// cora::device: one GPU or the CPU device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <system_error>

#include "cora/binary.hpp"
#include "cora/detail/checked_size.hpp"
#include "cora/event.hpp"
#include "cora/launch.hpp"
#include "cora/memory.hpp"
#include "cora/pending.hpp"
#include "cora/stream.hpp"

namespace cora {

/// Which backend a device belongs to.
enum class backend_kind { cpu, cuda };

/// What a device reports about itself.
struct device_properties {
  std::string name;
  backend_kind backend = backend_kind::cpu;
  unsigned ordinal = 0;            ///< index among the backend's devices
  unsigned compute_units = 0;      ///< streaming multiprocessors, or CPU worker threads
  std::size_t total_memory = 0;    ///< bytes of device memory
  dim3 max_grid;
  dim3 max_block;
  std::uint32_t max_threads_per_block = 1;
  std::uint32_t max_shared_bytes = 0;
  int compute_major = 0;           ///< CUDA compute capability (0 on the CPU device)
  int compute_minor = 0;
  std::string driver;
  std::string pci_bus_id;
  std::string uuid;
};

/// Flags of a new event.
struct event_options {
  bool timing = true;  ///< record timestamps (needed by event::elapsed)
};

/// What a device's memory pools hold (device::memory_stats).
struct memory_stats {
  /// Device memory handed out and not yet freed, in bytes. Memory whose buffer was dropped
  /// counts until the work that used it has completed and it went back to the pool.
  std::size_t device_in_use = 0;
  /// Device memory the backend's pool holds (in use plus cached for reuse), in bytes; 0 where
  /// the backend keeps no pool of its own.
  std::size_t device_reserved = 0;
  /// Pinned host memory handed out (alloc_host, malloc_host, staging), in bytes.
  std::size_t pinned_in_use = 0;
  /// Pinned host memory the slab pool holds (in use plus free), in bytes.
  std::size_t pinned_reserved = 0;
};

/// A device. Made by its cora::runtime; runtime::device() references are valid while the
/// runtime lives, and stream::device() references while the stream does (the device's state
/// outlives the runtime as long as objects made from it exist). Objects created from it
/// (buffers, streams, binaries) stay valid after the runtime is gone, but fail with
/// errc::runtime_shut_down.
///
/// @par Thread safety
/// Safe to use from several threads.
class device {
 public:
  /// Made by the runtime; the object lives in the device's state, so a reference obtained
  /// from a stream (stream::device()) stays valid while the stream does.
  explicit device(detail::device_state* s) noexcept : s_(s) {}
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  const device_properties& properties() const noexcept;
  const std::string& name() const noexcept { return properties().name; }
  backend_kind backend() const noexcept { return properties().backend; }
  /// Position in runtime::device(i).
  std::size_t index() const noexcept;

  // --- memory --------------------------------------------------------------------------------

  /// Allocates `n` elements of device memory, usable at once by every stream. Never waits for
  /// device work (on CUDA it comes from cora's stream-ordered pool). Dropping the buffer is a
  /// stream-ordered free (see cora::basic_buffer). @throws cora::error (errc::out_of_memory,
  /// also beyond runtime_options::device_memory_limit; errc::invalid_argument for n == 0
  /// or n * sizeof(T) past the address space).
  template <class T>
  device_buffer<T> alloc(std::size_t n) {
    return device_buffer<T>(state(), static_cast<T*>(malloc(detail::checked_bytes<T>(n))), n);
  }
  /// Allocates `n` elements of pinned host memory from the device's slab pool (the driver is
  /// called only while the pool grows).
  template <class T>
  host_buffer<T> alloc_host(std::size_t n) {
    return host_buffer<T>(state(), static_cast<T*>(malloc_host(detail::checked_bytes<T>(n))), n);
  }
  /// Raw device allocation (freed with free(); freeing is stream-ordered like a buffer's).
  void* malloc(std::size_t bytes);
  void* malloc(std::size_t bytes, std::error_code& ec);
  /// Frees a raw device allocation, stream-ordered: never blocks; the memory returns to the
  /// pool once the ops in flight that use it have completed. @throws cora::error
  /// (errc::invalid_pointer).
  void free(void* p);
  void free(void* p, std::error_code& ec);
  /// Raw pinned host allocation (freed with free_host()).
  void* malloc_host(std::size_t bytes);
  void* malloc_host(std::size_t bytes, std::error_code& ec);
  /// Frees a raw pinned allocation, stream-ordered like free().
  void free_host(void* p);
  void free_host(void* p, std::error_code& ec);
  /// Device memory currently allocated, in bytes (memory_stats().device_in_use).
  std::size_t memory_in_use() const noexcept;
  /// Bytes in use and reserved by the device's memory pools.
  cora::memory_stats memory_stats() const noexcept;
  /// Returns cached pool memory to the system: device memory beyond `keep` bytes (on the CPU
  /// device, every free page, `keep` aside), and wholly free pinned slabs, on a cora thread.
  /// Never waits for device work.
  void trim_memory(std::size_t keep = 0) noexcept;

  // --- streams and events --------------------------------------------------------------------

  /// A new stream, taken from a pool of created streams (32 per device, made on a cora thread
  /// when the device opens; a dropped stream goes back to it once its work is done), so it
  /// does not wait for the driver. With more streams alive at once than the pool holds, the
  /// extra ones are created on the calling thread, and a CUDA context that already has a few
  /// dozen streams may wait for running kernels to make one.
  cora::stream make_stream(const stream_options& options = {});
  /// A cora stream around a native stream of another library (a CUstream on CUDA), borrowed:
  /// cora never destroys it. Work on it is ordered with the other library's work on the same
  /// native stream. @throws cora::error (errc::not_supported on devices without native
  /// streams, errc::invalid_argument for a null stream).
  cora::stream adopt_stream(void* native_stream);
  cora::event make_event(const event_options& options = {});

  // --- binaries ------------------------------------------------------------------------------

  /// Loads a kernel binary from a file, read without blocking the caller's executor. Accepts
  /// .corabin containers, CPU kernel images and (on CUDA devices) cubin, fatbin and PTX. File
  /// errors carry the path in their message. A small file whose pages are cached is read and
  /// loaded on the calling thread, as bytes in memory are (below); anything else is read and
  /// loaded off it. On a GPU the load runs while cora's streams are idle (the driver's load
  /// waits for running kernels and holds other threads' calls meanwhile): at once when they
  /// are, else after the work in flight.
  pending<binary> load_binary(const std::filesystem::path& path, const load_options& options = {});
  /// Loads a kernel binary from memory (the bytes are read during the call only; no temporary
  /// files). A small image loads on the calling thread when the device is idle (on a GPU:
  /// cora's streams), else on a cora thread once the work in flight has finished.
  pending<binary> load_binary(std::span<const std::byte> bytes, const load_options& options = {});

  /// Returns an awaitable that completes when all work enqueued so far on every stream of this
  /// device has completed; reports (and clears) the streams' device faults. It does not block:
  /// `co_await` it or call `.wait()` on it.
  pending<void> synchronize();

  /// The backend's own device handle: the device's primary CUcontext on CUDA (the context
  /// cora's streams and memory belong to), null on the CPU device.
  void* native_handle() const noexcept;

  std::shared_ptr<detail::device_state> state() const noexcept;

 private:
  detail::device_state* s_;
};

}  // namespace cora
