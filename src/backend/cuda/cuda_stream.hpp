// A CUDA stream (non-blocking, with a priority): copies, fills, launches through
// cuLaunchKernelEx, host functions, event records and waits, and completion markers.
//
// Failures: an enqueue the driver refuses, or a host function that throws, fails the markers
// at and after that op until take_fault() reports it. A fault that loses the context (a kernel
// that faulted: CUDA's errors are sticky) fails every marker of every stream of the device from
// then on, and new launches fail at once with errc::device_lost.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_markers.hpp"

namespace cora::backend::cuda {

class cuda_device;

/// Failures recorded against op positions of one stream. Shared with host-function
/// callbacks, which may record into it from the driver's thread.
struct stream_faults {
  std::mutex mutex;
  std::atomic<std::uint64_t> first{~std::uint64_t{0}};  // seq of the first recorded failure
  fault recorded;
  void record(std::uint64_t seq, std::error_code ec, std::string message) noexcept;
};

class cuda_stream final : public stream {
 public:
  /// `owned`: false for a stream adopted from another library, which is never destroyed.
  cuda_stream(cuda_device& device, CUstream handle, std::unique_ptr<marker_source> markers,
              bool owned = true);
  ~cuda_stream() override;

  void copy(std::uint64_t seq, void* dst, const void* src, std::size_t bytes,
            bool src_pageable) override;
  void fill(std::uint64_t seq, void* dst, std::uint8_t value, std::size_t bytes) override;
  void launch(std::uint64_t seq, const launch_desc& launch, std::error_code& ec,
              std::string& message) override;
  void host_func(std::uint64_t seq, std::function<void()> fn, std::error_code& ec) override;
  void record(std::uint64_t seq, event& ev) override;
  void wait(std::uint64_t seq, event& ev) override;
  void launch_graph(std::uint64_t seq, graph_exec& graph, std::error_code& ec,
                    std::string& message) override;  // cuda_graph.cpp
  void wait_value(std::uint64_t seq, const void* addr, value_memory where, std::uint64_t value,
                  unsigned condition, bool wide, std::error_code& ec, std::string& message) override;
  void write_value(std::uint64_t seq, void* addr, value_memory where, std::uint64_t value,
                   bool wide, std::error_code& ec, std::string& message) override;

  marker record_marker(std::uint64_t seq) override;
  marker_state query(const marker& m) override;
  doorbell bell() const noexcept override { return markers_->bell(); }
  bool wait_marker(const marker& m, clock::time_point deadline) override;
  void release_marker(const marker& m) noexcept override;
  fault take_fault() override;

  CUstream handle() const noexcept { return stream_; }
  void* native_handle() const noexcept override { return stream_; }
  bool borrowed() const noexcept override { return !owned_; }
  bool recycle() noexcept override;
  void detach() noexcept override { markers_->detach(); }

 private:
  /// False (with the op failed) when the context was lost before this op.
  bool usable(std::uint64_t seq);
  void failed(std::uint64_t seq, CUresult r, const std::string& what);
  std::string lost_detail() const;

  cuda_device& device_;
  std::shared_ptr<context> ctx_;
  CUstream stream_;
  bool owned_ = true;
  std::unique_ptr<marker_source> markers_;
  std::shared_ptr<stream_faults> faults_;
  std::atomic<std::uint64_t> last_failed_{0};  // the marker query() last found failed
  std::mutex poll_error_mutex_;
  CUresult poll_error_ = CUDA_SUCCESS;         // a query error that did not lose the context
};

/// True inside a host function, on the driver's callback thread, where no CUDA call may be
/// made (so no device may be destroyed there: cuda_device::on_own_thread()).
bool in_host_call() noexcept;

}  // namespace cora::backend::cuda
