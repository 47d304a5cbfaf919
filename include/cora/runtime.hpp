// cora::runtime: backends, devices and the completion engine.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cora/device.hpp"

namespace cora {

/// Which backends a runtime uses (environment: CORA_BACKEND=any|cpu|cuda).
enum class backend_selection { any, cpu, cuda };

/// How waits detect completion (environment: CORA_COMPLETION=spin|hybrid|blocking|callback).
enum class completion_policy {
  spin,      ///< poll continuously while any wait is pending: lowest latency, a core per poller
  hybrid,    ///< spin briefly, then sleep until shortly before the expected end, then spin
  blocking,  ///< sleep in the driver until completion: least CPU, highest latency
  callback,  ///< the driver's host callbacks signal completion (for comparison)
};

/// Options of a runtime. Unless use_environment is false, CORA_* environment variables
/// override the corresponding fields.
struct runtime_options {
  backend_selection backend = backend_selection::any;
  /// Index of runtime::default_device() (environment: CORA_DEVICE).
  std::optional<std::size_t> default_device;
  completion_policy completion = completion_policy::hybrid;
  /// Worker threads of each CPU device; 0 = hardware threads (CORA_CPU_UNITS).
  unsigned cpu_compute_units = 0;
  /// Device memory of each CPU device in bytes; 0 = physical memory, at most 64 GiB.
  std::size_t cpu_memory = 0;
  /// Number of CPU devices (more than one models a multi-device machine) (CORA_CPU_DEVICES).
  unsigned cpu_devices = 1;
  /// Hybrid policy: how long a waiter spins before handing the wait to the engine thread.
  std::chrono::microseconds spin_limit{50};
  /// Most device memory each device hands out, in bytes (allocations beyond it fail with
  /// errc::out_of_memory); 0 = what the device has (CORA_DEVICE_MEMORY_LIMIT).
  std::size_t device_memory_limit = 0;
  /// Most pinned host memory each device's slab pool reserves, in bytes; 0 = no limit
  /// (CORA_PINNED_MEMORY_LIMIT).
  std::size_t pinned_memory_limit = 0;
  /// Device memory a device's pool keeps cached while idle, in bytes, rather than returning it
  /// to the system (CUDA: the pool's release threshold, and the bound on freed blocks kept for
  /// reuse); device::trim_memory() returns the rest at once (CORA_POOL_RELEASE_THRESHOLD).
  std::size_t pool_release_threshold = std::size_t{256} << 20;
  bool use_environment = true;
};

/// A backend's state as the runtime found it.
struct backend_status {
  std::string name;       ///< "cpu", "cuda"
  bool available = false;
  std::size_t devices = 0;
  std::string detail;     ///< why unavailable, or driver details
};

/// Owns the backends and devices. Devices are listed GPUs first, then the CPU device(s).
///
/// Destroying the runtime completes every pending wait with asio::error::operation_aborted
/// (delivered on each waiter's executor, never inline on the destroying thread) and never waits
/// for the device: work the backend can stop stops (the CPU device's kernels, and ops queued
/// behind them, complete with errc::runtime_shut_down), GPU work already enqueued runs on. A
/// later wait on any op completes with its result or errc::runtime_shut_down. Objects made from
/// the runtime (streams, buffers, binaries, and the device a stream reports) stay safe to use
/// and destroy afterwards; new work on them fails with errc::runtime_shut_down.
class runtime {
 public:
  runtime();
  explicit runtime(runtime_options options);
  ~runtime();
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  std::size_t device_count() const noexcept;
  /// Device `i` (GPUs first, then CPU devices). @throws cora::error (errc::no_device).
  cora::device& device(std::size_t i);
  /// The default device: CORA_DEVICE or options.default_device, else GPU 0 if present, else
  /// the CPU device.
  cora::device& default_device();
  const runtime_options& options() const noexcept;
  std::vector<backend_status> backends() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The completion policy's name ("spin", "hybrid"...).
const char* to_string(completion_policy p) noexcept;

}  // namespace cora
