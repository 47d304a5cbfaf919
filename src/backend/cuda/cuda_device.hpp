// A CUDA device: its primary context, memory, streams, events and modules.
//
// Stream priorities use CUDA's convention (numerically lower is more urgent; 0 is the default)
// and are clamped by the driver to the device's range. owns_address() answers false: CUDA
// cannot tell freed device memory from host memory cheaply, so the core sees freed device
// pointers as host memory and the driver rejects the copy.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_markers.hpp"

namespace cora::backend::cuda {

struct cuda_event final : event {
  cuda_event(std::shared_ptr<context> c, CUevent e, bool t) noexcept
      : ctx(std::move(c)), handle(e), timing(t) {}
  ~cuda_event() override;
  void* native_handle() const noexcept override { return handle; }
  std::shared_ptr<context> ctx;
  CUevent handle;
  bool timing;
};

/// Launch limits of a device that streams check.
struct launch_limits {
  std::uint32_t max_shared_optin = 0;  // dynamic + static shared bytes a block may opt into
  bool cooperative = false;
  bool clusters = false;
};

class cuda_device final : public device {
 public:
  cuda_device(std::shared_ptr<context> ctx, device_info info, launch_limits limits, marker_mode mode);
  ~cuda_device() override;

  const device_info& info() const override { return info_; }
  void* alloc(std::size_t bytes, std::error_code& ec) override;
  void free(void* p, std::size_t bytes) noexcept override;
  void* alloc_host(std::size_t bytes, std::error_code& ec) override;
  void free_host(void* p) noexcept override;
  memory_counters memory() const noexcept override;
  void set_pool_release_threshold(std::size_t bytes) noexcept override;
  void trim(std::size_t keep) noexcept override;
  foreign_memory describe_pointer(const void* p) noexcept override;
  void* native_handle() const noexcept override;
  std::unique_ptr<stream> adopt_stream(void* native, marker_wakeup wakeup, std::error_code& ec) override;
  bool pool_streams() const noexcept override { return true; }
  bool unload_waits() const noexcept override { return true; }
  bool load_waits() const noexcept override { return true; }
  std::error_code health() const noexcept override;
  bool owns_address(const void*) const noexcept override { return false; }
  void copy_sync(void* dst, const void* src, std::size_t bytes, std::error_code& ec) override;
  std::unique_ptr<stream> create_stream(int priority, marker_wakeup wakeup,
                                        std::error_code& ec) override;
  std::unique_ptr<event> create_event(bool timing, std::error_code& ec) override;
  double elapsed_ms(event& start, event& end, std::error_code& ec) override;
  bool event_done(event& ev, std::error_code& ec) override;
  bool accepts(image_kind kind) const override { return kind != image_kind::cpu_elf; }
  std::unique_ptr<module> load(std::span<const std::byte> image, image_kind kind,
                               const image_key& key, std::error_code& ec,
                               std::string& message) override;
  std::unique_ptr<graph_exec> instantiate(std::span<const graph_node_desc> nodes,
                                          std::error_code& ec,
                                          std::string& message) override;  // cuda_graph.cpp
  std::uint64_t markers_recorded() const override {
    return markers_.load(std::memory_order_relaxed);
  }
  void shutdown() noexcept override;
  bool on_own_thread() const noexcept override;

  // Used by streams.
  const std::shared_ptr<context>& ctx() const noexcept { return ctx_; }
  const launch_limits& limits() const noexcept { return limits_; }
  /// "CUDA device 0 (NVIDIA H200)", for messages.
  const std::string& label() const noexcept { return label_; }
  void count_marker() noexcept { markers_.fetch_add(1, std::memory_order_relaxed); }
  /// Beside count_marker, for a marker that is an event.
  void count_event_marker() noexcept { event_markers_.fetch_add(1, std::memory_order_relaxed); }
  /// How many of the markers were events (with CORA_CUDA_MARKER=auto: how often it chose them).
  std::uint64_t event_markers_recorded() const noexcept {
    return event_markers_.load(std::memory_order_relaxed);
  }
  /// Whether device memory comes from cora's stream-ordered pool, which the driver's stream
  /// memory operations (cuStreamWaitValue/WriteValue) do not accept.
  bool pooled() const noexcept { return pool_ != nullptr; }
  /// What the device's stream memory operations support (device attributes, read once).
  struct memop_support {
    bool wide = false;          // 64-bit waits and writes (CAN_USE_64_BIT_STREAM_MEM_OPS)
    bool nor = false;           // CU_STREAM_WAIT_VALUE_NOR (CAN_USE_STREAM_WAIT_VALUE_NOR)
    bool host_pointer = false;  // host pointers of pinned memory work as device pointers
  };
  const memop_support& memops() const noexcept { return memops_; }

 private:
  std::error_code fail(CUresult r) noexcept;
  std::unique_ptr<stream> wrap_stream(CUstream s, bool owned, marker_wakeup wakeup, std::error_code& ec);

  // Device memory: a pool of cora's own (never the device's default pool, which other
  // libraries share), allocated and freed in stream order on an internal stream that runs
  // nothing else, so synchronizing it never waits for other work. Null pool: the device has
  // no memory pools, and cuMemAlloc/cuMemFree are used (they may wait for the device).
  CUmemoryPool pool_ = nullptr;
  CUstream memory_stream_ = nullptr;

  // Freed blocks kept for reuse, by size class: an allocation that finds one makes no driver
  // call. A pool allocation must be followed by a synchronize of the internal stream before
  // other streams may use it, and while the device is busy that round trip took hundreds of
  // microseconds on the H200, on the caller's thread; a reused block needs none (the core frees
  // only memory that no op in flight uses). Bounded by the pool's release threshold.
  CUdeviceptr take_cached(std::size_t size_class) noexcept;
  void release_cache() noexcept;
  void pool_alloc(CUdeviceptr& p, std::size_t bytes, CUresult& r) noexcept;
  mutable std::mutex cache_mutex_;
  std::unordered_map<std::size_t, std::vector<CUdeviceptr>> cache_;
  std::size_t cached_bytes_ = 0;
  std::size_t cache_limit_ = std::size_t{256} << 20;

  std::shared_ptr<context> ctx_;
  device_info info_;
  launch_limits limits_;
  marker_mode mode_;
  std::string label_;
  std::atomic<std::uint64_t> markers_{0};
  std::atomic<std::uint64_t> event_markers_{0};  // beside markers_: one cache line for both
  memop_support memops_;
};

}  // namespace cora::backend::cuda
