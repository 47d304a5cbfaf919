// cora::event: a marker recorded into a stream, for waiting, timing and ordering streams.
#pragma once

#include <chrono>
#include <memory>
#include <system_error>

#include "cora/pending.hpp"

namespace cora {

namespace detail {
class event_state;
}

/// An event. stream.record(ev) captures the work enqueued so far on that stream; waiting on
/// the event waits for exactly that work; another stream's wait(ev) orders its later work after
/// it. Re-recording moves the event to a new position. Copies share the event.
class event {
 public:
  event() noexcept = default;
  explicit event(std::shared_ptr<detail::event_state> s) noexcept : s_(std::move(s)) {}

  /// Returns an awaitable that completes when the latest record's work has completed (at once
  /// if never recorded). It does not block: `co_await` it or call `.wait()` on it.
  pending<void> synchronize() const;
  /// True once the latest record's work has completed.
  bool ready() const;

  /// Time between two completed records of timing events.
  /// @throws cora::error (errc::not_ready before both completed, errc::invalid_argument for
  ///         events created without timing, errc::wrong_device across devices).
  static std::chrono::duration<double, std::milli> elapsed(const event& start, const event& end);
  static std::chrono::duration<double, std::milli> elapsed(const event& start, const event& end,
                                                           std::error_code& ec);

  /// The backend's event (a CUevent on CUDA; null on the CPU device). Lets other CUDA code
  /// wait for cora's work (cuStreamWaitEvent after a record) without a host sync.
  void* native_handle() const noexcept;

  explicit operator bool() const noexcept { return static_cast<bool>(s_); }
  const std::shared_ptr<detail::event_state>& state() const noexcept { return s_; }

 private:
  std::shared_ptr<detail::event_state> s_;
};

}  // namespace cora
