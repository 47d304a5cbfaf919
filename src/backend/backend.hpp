// The interface between cora's core and a device backend. Core code talks to devices only
// through these classes; backends never see core types beyond the plain ones used here.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "cora/launch.hpp"

namespace cora::backend {

using clock = std::chrono::steady_clock;

/// What a device reports about itself.
struct device_info {
  std::string name;
  std::string backend;           // "cpu", "cuda"
  unsigned ordinal = 0;          // index among the backend's devices
  unsigned compute_units = 0;    // SMs, or worker threads
  std::size_t total_memory = 0;  // bytes of device memory
  dim3 max_grid{1, 1, 1};
  dim3 max_block{1, 1, 1};
  std::uint32_t max_threads_per_block = 1;
  std::uint32_t max_shared_bytes = 0;
  int compute_major = 0, compute_minor = 0;  // CUDA compute capability
  std::string driver;            // driver version or description
  std::string pci_bus_id;
  std::string uuid;
};

/// Kinds of kernel image a backend may load.
enum class image_kind { cpu_elf, cuda_cubin, cuda_fatbin, cuda_ptx };

/// One kernel parameter: size and alignment, and its offset in the backend's native block.
struct param_desc {
  std::uint32_t size = 0;
  std::uint32_t align = 1;
  bool pointer = false;  // declared a pointer (CPU kernel records); false when unknown
};

/// A kernel found in a loaded module.
struct kernel_desc {
  std::string name;
  std::optional<std::uint64_t> entry_key;
  std::vector<param_desc> params;
  bool params_known = true;  // false when the backend cannot report the parameter layout
};

/// A loaded kernel image.
class module {
 public:
  virtual ~module() = default;
  /// The kernels the image defines.
  virtual const std::vector<kernel_desc>& kernels() const = 0;
  /// Backend handle of kernel `index` (of kernels()), resolved once.
  virtual void* function(std::size_t index, std::error_code& ec, std::string& message) = 0;
};

/// Backend side of an event.
class event {
 public:
  virtual ~event() = default;
};

/// A marker's state as seen by a query.
enum class marker_state { pending, done, failed };

/// A failure a stream reports: the first failing op (0 when unknown), its code and message.
struct fault {
  std::uint64_t seq = 0;
  std::error_code ec;
  std::string message;
};

/// How the core will mostly wait for a stream's markers: by polling query() (spin and hybrid
/// policies), or by sleeping in wait_marker() (the callback policy), where a backend may have
/// its markers signalled by the driver's host callbacks instead of being polled.
enum class marker_wakeup { poll, host_callback };

/// An opaque completion marker recorded after an op.
struct marker {
  std::uint64_t seq = 0;
  void* handle = nullptr;
};

/// A launch as the core hands it over: the argument block is in cora's canonical layout
/// (see cora/detail/arg_layout.hpp) and has been validated against the kernel's parameters.
struct launch_desc {
  void* function = nullptr;               // from module::function
  const kernel_desc* kernel = nullptr;
  launch_config config;
  const void* args = nullptr;             // canonical argument block (host memory)
  std::size_t args_size = 0;
  const void* device_args = nullptr;      // or: a canonical block in device memory
};

/// An in-order queue of device work. Every enqueue carries the core's sequence number of the
/// op, strictly increasing; ops complete in that order.
class stream {
 public:
  virtual ~stream() = default;

  /// `src_pageable`: the source is ordinary host memory the caller may reuse as soon as this
  /// returns (the backend must read or snapshot it first).
  virtual void copy(std::uint64_t seq, void* dst, const void* src, std::size_t bytes,
                    bool src_pageable) = 0;
  virtual void fill(std::uint64_t seq, void* dst, std::uint8_t value, std::size_t bytes) = 0;
  virtual void launch(std::uint64_t seq, const launch_desc& launch, std::error_code& ec,
                      std::string& message) = 0;
  virtual void host_func(std::uint64_t seq, std::function<void()> fn, std::error_code& ec) = 0;
  virtual void record(std::uint64_t seq, event& ev) = 0;
  /// Later work waits until `ev`'s latest record (on any stream of the device) has completed.
  virtual void wait(std::uint64_t seq, event& ev) = 0;

  /// Records a marker after op `seq` (the last op enqueued).
  virtual marker record_marker(std::uint64_t seq) = 0;
  /// Queries a marker without blocking.
  virtual marker_state query(const marker& m) = 0;
  /// Blocks until the marker completes or `deadline` passes; returns false on timeout.
  virtual bool wait_marker(const marker& m, clock::time_point deadline) = 0;
  virtual void release_marker(const marker& m) noexcept = 0;
  /// The failure behind a failed marker; clears it where the backend can go on.
  virtual fault take_fault() = 0;
};

/// One device of a backend.
class device {
 public:
  virtual ~device() = default;
  virtual const device_info& info() const = 0;

  virtual void* alloc(std::size_t bytes, std::error_code& ec) = 0;
  virtual void free(void* p) noexcept = 0;
  virtual void* alloc_host(std::size_t bytes, std::error_code& ec) = 0;
  virtual void free_host(void* p) noexcept = 0;
  /// True if `p` lies in address space this device reserves for device memory, allocated or
  /// not (lets the core tell freed device memory from host memory). False when unknown.
  virtual bool owns_address(const void* p) const noexcept = 0;
  /// Synchronous copy between any memories of this device (used for small host-side reads).
  virtual void copy_sync(void* dst, const void* src, std::size_t bytes, std::error_code& ec) = 0;

  virtual std::unique_ptr<stream> create_stream(int priority, marker_wakeup wakeup,
                                                std::error_code& ec) = 0;
  virtual std::unique_ptr<event> create_event(bool timing, std::error_code& ec) = 0;
  /// Time between two completed records, in milliseconds.
  virtual double elapsed_ms(event& start, event& end, std::error_code& ec) = 0;
  /// True once the event's latest record has completed (or it was never recorded).
  virtual bool event_done(event& ev, std::error_code& ec) = 0;

  /// Whether the device runs images of this kind.
  virtual bool accepts(image_kind kind) const = 0;
  virtual std::unique_ptr<module> load(std::span<const std::byte> image, image_kind kind,
                                       std::error_code& ec, std::string& message) = 0;

  /// Markers recorded so far (the engine's cost; tests check that unwaited ops record none).
  virtual std::uint64_t markers_recorded() const = 0;

  /// Stops the device's own threads; called once, when the runtime shuts down.
  virtual void shutdown() noexcept = 0;
};

/// Options the CPU backend takes.
struct cpu_options {
  unsigned devices = 1;
  unsigned compute_units = 0;     // 0: hardware threads
  std::size_t memory = 0;         // 0: default
};

/// Enumerates the CPU devices (always at least one).
std::vector<std::unique_ptr<device>> make_cpu_devices(const cpu_options& options);

/// Enumerates the CUDA devices; empty, with `reason` set, when there is no driver or GPU or
/// the backend was not built.
std::vector<std::unique_ptr<device>> make_cuda_devices(std::string& reason);

}  // namespace cora::backend
