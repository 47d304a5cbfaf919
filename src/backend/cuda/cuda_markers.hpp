// Completion markers of a CUDA stream, four ways:
//  - auto (the default): a counter while one thread records the device's markers, an event
//              while several do (see below);
//  - counter:  cuStreamWriteValue32 of the op's sequence number into host-mapped
//              pinned memory, polled as a plain memory load (1.9 us to record, nothing to poll);
//  - event:    a pooled CU_EVENT_DISABLE_TIMING event recorded after the op, polled with
//              cuEventQuery (0.2 us to record; 0.3 us per query while pending, 1.5 us on the
//              completed one);
//  - callback: a cuLaunchHostFunc callback that counts completions and wakes sleepers (the
//              `callback` completion policy, for comparison only).
// Measured on the H200 (docs/benchmarks.md), an awaited empty launch (spin policy) takes p50
// 8.6 us with counters against 9.0 us with events (raw driver, event poll: 8.5 us): counters win
// with one submitting thread. With an io_context per thread and 4 or 16 threads each submitting
// pipelines, events gave 1.09-1.10x and 1.26-1.32x the pipelines/s of counters on an H100: the
// record is the longer driver call, and the driver serializes a context's calls. So `auto`
// records events while two or more threads recorded markers on the device within one window
// of about a millisecond, the current or the previous one. Callbacks take 20-37 us. Counter and callback markers cannot see a device fault
// (the write or callback never happens), so while they are pending the stream is also asked, at
// most once a millisecond.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_context.hpp"

namespace cora::backend::cuda {

enum class marker_mode { automatic, event, counter, callback };

const char* to_string(marker_mode mode) noexcept;

/// The markers of one stream. record is called under the core's submission lock, poll and
/// release under its completion lock, so the two may run at once; poll and block may also run
/// on a thread blocked in wait_marker.
class marker_source {
 public:
  virtual ~marker_source() = default;
  /// Records a marker after the stream's last op into `out.handle`.
  virtual CUresult record(std::uint64_t seq, marker& out) = 0;
  /// True if `m` (recorded by this source) is an event.
  virtual bool is_event(const marker&) const noexcept { return false; }
  /// CUDA_SUCCESS once done, CUDA_ERROR_NOT_READY while pending, else the stream's error.
  virtual CUresult poll(const marker& m) = 0;
  /// The word that ringing markers write (stream::bell()); none by default.
  virtual doorbell bell() const noexcept { return {}; }
  /// Sleeps until `until`, or earlier when the marker may have completed.
  virtual void block(const marker& m, clock::time_point until);
  /// True if block() wakes when the marker completes (else it sleeps until `until`).
  virtual bool wakes_sleepers() const noexcept { return false; }
  virtual void release(const marker& m) noexcept = 0;
  /// Frees what the device might still write into; only when the stream is idle or lost.
  virtual void retire(bool device_done) noexcept = 0;
  /// The native stream may be destroyed by its owner from now on: never query it again.
  virtual void detach() noexcept { detached_.store(true, std::memory_order_release); }
  bool detached() const noexcept { return detached_.load(std::memory_order_acquire); }
  /// True once every marker recorded so far has completed (known without asking the stream).
  virtual bool reached_all() const noexcept = 0;
  /// Starts positions afresh for a recycled stream; only once reached_all().
  virtual void reset() noexcept = 0;

 private:
  std::atomic<bool> detached_{false};
};

/// Makes the source for `mode` on `stream`; null with `r` set on failure.
std::unique_ptr<marker_source> make_marker_source(marker_mode mode, std::shared_ptr<context> ctx,
                                                  CUstream stream, CUresult& r);

}  // namespace cora::backend::cuda
