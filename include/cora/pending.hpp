// cora::pending<T>: the handle every device operation returns.
#pragma once

#include <coroutine>
#include <memory>
#include <system_error>
#include <type_traits>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/system_executor.hpp>

#include "cora/detail/wait.hpp"

namespace cora {

namespace detail {

template <class P>
concept executor_promise = requires(const P& p) {
  { p.executor() } -> std::convertible_to<const asio::any_io_executor&>;
};

template <class T>
T take_value(completion_source* source) {
  return static_cast<async_state<T>*>(source)->take_value();
}

/// Holds work on `ex` while a wait is armed, so that io_context::run() does not return while
/// the waiter is parked with the engine.
inline asio::any_io_executor tracked(const asio::any_io_executor& ex) {
  return asio::prefer(ex, asio::execution::outstanding_work.tracked);
}

struct resume_handle {
  std::coroutine_handle<> h;
  void operator()() const { h.resume(); }
};

template <class T>
class pending_awaiter : private wait_node {
 public:
  explicit pending_awaiter(op_handle& op) noexcept : op_(op) {}

  bool await_ready() noexcept { return op_.ready(this->ec); }

  template <class P>
  bool await_suspend(std::coroutine_handle<P> h) {
    handle_ = h;
    this->on_complete = &complete;
    if constexpr (executor_promise<P>) {
      if (h.promise().executor()) {
        executor_ = tracked(h.promise().executor());
        return op_.source()->arm(*this, op_.seq(), &executor_);
      }
    }
    return op_.source()->arm(*this, op_.seq(), nullptr);
  }

  T await_resume() {
    op_.observe();
    if (this->ec) throw_op_error(op_, this->ec);
    if constexpr (!std::is_void_v<T>) return take_value<T>(op_.source());
  }

 private:
  static void complete(wait_node& node, bool may_run_inline) noexcept {
    auto& self = static_cast<pending_awaiter&>(node);
    std::coroutine_handle<> h = self.handle_;
    if (!self.executor_) {  // no executor: resumed on the detecting thread, as documented
      h.resume();
      return;
    }
    // The coroutine may resume (and destroy this awaiter) as soon as it is handed over.
    asio::any_io_executor ex = self.executor_;
    if (may_run_inline)
      asio::dispatch(ex, resume_handle{h});
    else
      asio::post(ex, resume_handle{h});
  }

  op_handle& op_;
  std::coroutine_handle<> handle_;
  asio::any_io_executor executor_;
};

// A specialization, not std::conditional_t: `void(std::error_code, void)` is ill-formed even
// in the branch that is not taken.
template <class T>
struct wait_signature_of {
  using type = void(std::error_code, T);
};
template <>
struct wait_signature_of<void> {
  using type = void(std::error_code);
};
template <class T>
using wait_signature = typename wait_signature_of<T>::type;

template <class T, class Handler>
class wait_op : private wait_node {
 public:
  wait_op(Handler&& h, intrusive_ptr<completion_source> src, std::uint64_t position)
      : handler_(std::move(h)), source_(std::move(src)), seq_(position) {
    using assoc = asio::associated_executor_t<Handler, asio::system_executor>;
    if constexpr (!std::is_same_v<assoc, asio::system_executor>)
      executor_ = tracked(asio::get_associated_executor(handler_));
  }

  void start() {
    this->on_complete = &complete;
    if (!source_) {
      this->ec = make_error_code(errc::invalid_handle);
      finish(false);
      return;
    }
    slot_ = asio::get_associated_cancellation_slot(handler_);
    if (slot_.is_connected()) {
      slot_.assign([this](asio::cancellation_type t) { cancel(t); });
      slot_assigned_ = true;
    }
    if (!source_->arm(*this, seq_, executor_ ? &executor_ : nullptr)) finish(false);
  }

 private:
  // Without an executor the handler runs on the detecting (engine) thread, as documented.
  static void complete(wait_node& node, bool may_run_inline) noexcept {
    auto& self = static_cast<wait_op&>(node);
    self.finish(may_run_inline || !self.executor_);
  }

  void cancel(asio::cancellation_type type) noexcept {
    // An op that can stop (a file read) completes by itself, with a defined end state. Only
    // terminal and partial cancellation allow that: it has side effects (data already copied).
    constexpr auto stoppable = asio::cancellation_type::terminal | asio::cancellation_type::partial;
    if ((type & stoppable) != asio::cancellation_type::none && source_->request_cancel(seq_)) return;
    if (source_->disarm(*this)) {
      this->ec = asio::error::operation_aborted;
      finish(false);
    }
  }

  // The op stays alive until its handler runs on the handler's executor. That is where a
  // cancellation is emitted, possibly while completion is being detected on another thread:
  // cancel() must then find the op alive (its disarm fails), and the slot is cleared only
  // there, never concurrently with an emit.
  void finish(bool may_run_inline) noexcept {
    asio::any_io_executor ex = std::move(executor_);
    auto call = [op = std::unique_ptr<wait_op>(this)]() mutable { deliver(std::move(op)); };
    if (!ex && !may_run_inline)
      asio::post(asio::system_executor(), std::move(call));  // never inside the initiation
    else if (!ex)
      call();
    else if (may_run_inline)
      asio::dispatch(ex, std::move(call));
    else
      asio::post(ex, std::move(call));
  }

  static void deliver(std::unique_ptr<wait_op> op) {
    if (op->slot_assigned_) op->slot_.clear();
    Handler h = std::move(op->handler_);
    const std::error_code ec = op->ec;
    intrusive_ptr<completion_source> src = std::move(op->source_);
    op.reset();
    if constexpr (std::is_void_v<T>) {
      std::move(h)(ec);
    } else {
      if (ec)
        std::move(h)(ec, T{});
      else
        std::move(h)(ec, take_value<T>(src.get()));
    }
  }

  Handler handler_;
  intrusive_ptr<completion_source> source_;
  std::uint64_t seq_;
  asio::any_io_executor executor_;
  asio::associated_cancellation_slot_t<Handler> slot_{};
  bool slot_assigned_ = false;
};

template <class T>
struct initiate_wait {
  template <class Handler>
  void operator()(Handler&& handler, intrusive_ptr<completion_source> src,
                  std::uint64_t position) const {
    auto* op = new wait_op<T, std::decay_t<Handler>>(std::forward<Handler>(handler),
                                                     std::move(src), position);
    op->start();
  }
};

}  // namespace detail

/// The completion of one operation: a copy, fill, launch, record, load or synchronize.
///
/// The operation was started when the call that returned this handle was made (device work is
/// enqueued in stream order). The handle only observes its completion:
/// - `co_await` suspends until the operation has completed on the device and returns its value
///   or throws cora::error. In a cora::task the coroutine resumes on the task's executor; in
///   any other coroutine it resumes on the engine thread that detected completion.
/// - `async_wait(token)` accepts any Asio completion token (callbacks, `asio::use_awaitable`,
///   `asio::use_future`, `asio::experimental::deferred`, `asio::experimental::as_tuple`...),
///   with the signature `void(std::error_code)` or `void(std::error_code, T)`. The handler runs
///   on its associated executor (on the engine thread if it has none). An Asio cancellation
///   signal completes the wait at once with `asio::error::operation_aborted`; the device work
///   runs on, and everything it uses stays alive until it finishes. Ops that can stop early
///   (stream::read_file) stop instead on terminal or partial cancellation, and the wait
///   completes with `operation_aborted` once they have.
/// - `wait()` blocks the calling thread; `ready()` tells without blocking or calling the driver.
///
/// Dropping a pending is allowed: the work still runs, and a failure surfaces at the next wait
/// on the same stream.
///
/// @par Thread safety
/// Distinct objects: safe. Shared objects: unsafe.
template <class T = void>
class pending {
 public:
  using value_type = T;

  /// An empty handle; valid() is false.
  pending() = default;
  explicit pending(detail::op_handle op) noexcept : op_(std::move(op)) {}
  pending(pending&&) noexcept = default;
  pending& operator=(pending&&) noexcept = default;

  /// True when this handle refers to an operation.
  bool valid() const noexcept { return op_.valid(); }

  /// True once the operation has completed, successfully or not. Makes no driver call.
  bool ready() const noexcept {
    std::error_code ec;
    return op_.ready(ec);
  }

  /// Blocks until the operation has completed; returns its value.
  /// @throws cora::error if it failed.
  T wait() {
    std::error_code ec;
    if constexpr (std::is_void_v<T>) {
      wait(ec);
      if (ec) detail::throw_op_error(op_, ec);
    } else {
      T v = wait(ec);
      if (ec) detail::throw_op_error(op_, ec);
      return v;
    }
  }

  /// Blocks until the operation has completed; reports failure through `ec`.
  T wait(std::error_code& ec) {
    op_.observe();
    if (!op_.valid()) {
      ec = make_error_code(errc::invalid_handle);
    } else {
      ec = op_.source()->block(op_.seq());
    }
    if constexpr (!std::is_void_v<T>) {
      if (ec) return T{};
      return detail::take_value<T>(op_.source());
    }
  }

  /// The result of a completed operation (success is an empty code); errc::not_ready before.
  std::error_code error() const noexcept {
    std::error_code ec;
    if (!op_.ready(ec)) return make_error_code(errc::not_ready);
    const_cast<detail::op_handle&>(op_).observe();
    return ec;
  }

  /// Awaits completion in any coroutine (see the class comment).
  /// An empty handle completes at once with errc::invalid_handle.
  auto operator co_await() noexcept { return detail::pending_awaiter<T>(op_); }

  /// Waits through an Asio completion token (see the class comment).
  template <class CompletionToken>
  auto async_wait(CompletionToken&& token) {
    op_.observe();
    return asio::async_initiate<CompletionToken, detail::wait_signature<T>>(
        detail::initiate_wait<T>{}, token, op_.source_ptr(), op_.seq());
  }

  /// The op handle (for cora's own composed operations).
  const detail::op_handle& handle() const noexcept { return op_; }

 private:
  detail::op_handle op_;
};

}  // namespace cora
