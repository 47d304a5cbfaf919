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

/// A device. Owned by its cora::runtime, which must outlive every use of this reference;
/// objects created from it (buffers, streams, binaries) stay valid after that, but fail with
/// errc::runtime_shut_down once the runtime is gone.
///
/// @par Thread safety
/// Safe to use from several threads.
class device {
 public:
  explicit device(std::shared_ptr<detail::device_state> s) noexcept : s_(std::move(s)) {}
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  const device_properties& properties() const noexcept;
  const std::string& name() const noexcept { return properties().name; }
  backend_kind backend() const noexcept { return properties().backend; }
  /// Position in runtime::device(i).
  std::size_t index() const noexcept;

  // --- memory --------------------------------------------------------------------------------

  /// Allocates `n` elements of device memory. @throws cora::error (errc::out_of_memory,
  /// errc::invalid_argument for n == 0 or n * sizeof(T) past the address space).
  template <class T>
  device_buffer<T> alloc(std::size_t n) {
    return device_buffer<T>(s_, static_cast<T*>(malloc(detail::checked_bytes<T>(n))), n);
  }
  /// Allocates `n` elements of pinned host memory (errors as alloc()).
  template <class T>
  host_buffer<T> alloc_host(std::size_t n) {
    return host_buffer<T>(s_, static_cast<T*>(malloc_host(detail::checked_bytes<T>(n))), n);
  }
  /// Raw device allocation (freed with free()).
  void* malloc(std::size_t bytes);
  void* malloc(std::size_t bytes, std::error_code& ec);
  /// Frees a raw device allocation. @throws cora::error (errc::invalid_pointer).
  void free(void* p);
  void free(void* p, std::error_code& ec);
  /// Raw pinned host allocation (freed with free_host()).
  void* malloc_host(std::size_t bytes);
  void* malloc_host(std::size_t bytes, std::error_code& ec);
  void free_host(void* p);
  void free_host(void* p, std::error_code& ec);
  /// Device memory currently allocated, in bytes.
  std::size_t memory_in_use() const noexcept;

  // --- streams and events --------------------------------------------------------------------

  cora::stream make_stream(const stream_options& options = {});
  cora::event make_event(const event_options& options = {});

  // --- binaries ------------------------------------------------------------------------------

  /// Loads a kernel binary from a file: read without blocking the caller's executor, then
  /// loaded off it. Accepts .corabin containers, CPU kernel images and (on CUDA devices)
  /// cubin, fatbin and PTX. File errors carry the path in their message.
  pending<binary> load_binary(const std::filesystem::path& path, const load_options& options = {});
  /// Loads a kernel binary from memory (the bytes are copied; no temporary files).
  pending<binary> load_binary(std::span<const std::byte> bytes, const load_options& options = {});

  /// Completes when all work enqueued so far on every stream of this device has completed;
  /// reports (and clears) the streams' device faults.
  pending<void> synchronize();

  const std::shared_ptr<detail::device_state>& state() const noexcept { return s_; }

 private:
  std::shared_ptr<detail::device_state> s_;
};

}  // namespace cora
