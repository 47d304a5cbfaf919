// One CUDA device's primary context, shared by everything the backend makes on that device:
// retained while any device, stream, event or module object lives, so their handles never
// outlive it, and released with the last of them. It also remembers when the context was
// lost to a fault (CUDA's errors after a faulting kernel are sticky: every later call fails).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>

#include "backend/cuda/cuda_driver.hpp"

namespace cora::backend::cuda {

class marker_slot_pool;  // cuda_markers.cpp

class context {
 public:
  /// Retains device `ordinal`'s primary context; null with `message` on failure.
  static std::shared_ptr<context> retain(const driver_api& api, int ordinal, std::string& message);
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  const driver_api& api;
  const CUdevice device;
  const int ordinal;
  const CUcontext handle;
  int least_priority = 0;     // CUDA's range: numerically lower is more urgent
  int greatest_priority = 0;

  /// Makes the context current on the calling thread: one cheap query when it already is.
  /// Asked every time rather than cached per thread, since other code on the thread (the
  /// CUDA runtime, another library) may switch contexts behind cora's back.
  CUresult make_current() const noexcept;

  /// Records `r` if it leaves the context unusable; returns true if the context is lost (now
  /// or earlier).
  bool note(CUresult r) noexcept;
  bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }
  /// The fault that lost the context: its code (kernel_fault...) and CUDA's message.
  std::error_code lost_code() const;
  std::string lost_message() const;

  // Host-callback markers wake sleepers through this (see cuda_markers.hpp).
  std::mutex signal_mutex;
  std::condition_variable signal_cv;
  std::uint64_t signal_generation = 0;

  /// Counter-marker slots (cuda_markers.cpp), carved from pinned slabs that die with the context:
  /// releasing the primary context frees them, and a later retain may return the same handle.
  std::mutex marker_slots_mutex;
  std::unique_ptr<marker_slot_pool, void (*)(marker_slot_pool*) noexcept> marker_slots{nullptr, nullptr};

  /// How many threads recorded markers lately (the `auto` marker mode, cuda_markers.cpp): the
  /// current window of about a millisecond and its count, packed as window << 16 | count, and
  /// the previous window's count.
  std::atomic<std::uint64_t> marker_window{0};
  std::atomic<std::uint32_t> marker_threads_before{0};

 private:
  context(const driver_api& a, CUdevice d, int o, CUcontext h) noexcept
      : api(a), device(d), ordinal(o), handle(h) {}

  std::atomic<bool> lost_{false};
  mutable std::mutex lost_mutex_;
  std::error_code lost_code_;
  std::string lost_message_;
};

/// Makes `ctx` current for the rest of the scope; `result` is the driver's answer.
struct current_context {
  explicit current_context(const context& ctx) noexcept : result(ctx.make_current()) {}
  CUresult result;
  explicit operator bool() const noexcept { return result == CUDA_SUCCESS; }
};

}  // namespace cora::backend::cuda
