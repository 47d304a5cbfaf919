// cora::pending<T>: the handle every device operation returns.
#pragma once

#include <coroutine>
#include <memory>
#include <thread>
#include <system_error>
#include <type_traits>
#include <utility>

#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/bind_allocator.hpp>
#include <asio/cancellation_signal.hpp>
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
/// A promise whose frame belongs to a tree owned by a frame_owner (cora::task).
template <class P>
concept owned_promise = requires(const P& p) {
  { p.owner() } -> std::convertible_to<frame_owner*>;
};
/// A promise that carries an Asio cancellation slot (cora::task).
template <class P>
concept cancellable_promise = requires(const P& p) {
  { p.cancellation_slot() } -> std::convertible_to<asio::cancellation_slot>;
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

/// Only terminal and partial cancellation let an op stop early: stopping has side effects
/// (data already copied).
inline bool stoppable(asio::cancellation_type type) noexcept {
  constexpr auto mask = asio::cancellation_type::terminal | asio::cancellation_type::partial;
  return (type & mask) != asio::cancellation_type::none;
}

/// The awaiter of `co_await pending`. It lives in the awaiting frame and is the wait node
/// itself (no allocation). Destroying it while suspended (the frame is destroyed) withdraws
/// the wait; if completion is already under way on another thread, the destructor waits until
/// the completer has let go of the node.
template <class T>
class pending_awaiter : private wait_node {
 public:
  explicit pending_awaiter(op_handle& op) noexcept : op_(op) {}
  pending_awaiter(const pending_awaiter&) = delete;
  pending_awaiter& operator=(const pending_awaiter&) = delete;
  ~pending_awaiter() { withdraw(); }

  bool await_ready() noexcept { return op_.ready(this->ec); }

  template <class P>
  bool await_suspend(std::coroutine_handle<P> h) {
    handle_ = h;
    this->on_complete = &complete;
    if constexpr (executor_promise<P>) {
      if (h.promise().executor()) executor_ = tracked(h.promise().executor());
    }
    if constexpr (owned_promise<P>) {
      if (frame_owner* o = h.promise().owner()) owner_ = intrusive_ptr<frame_owner>::share(o);
    }
    if constexpr (cancellable_promise<P>) {
      slot_ = h.promise().cancellation_slot();
      if (slot_.is_connected())
        slot_.assign([this](asio::cancellation_type t) { cancel(t); });
      else
        slot_ = {};
    }
    armed_ = true;
    // Once arm() returns true the wait may complete on another thread and resume (and
    // destroy) this frame: nothing here touches `this` after it.
    if (op_.source()->arm(*this, op_.seq(), executor_ ? &executor_ : nullptr)) return true;
    armed_ = false;
    clear_slot();
    return false;
  }

  T await_resume() {
    clear_slot();
    op_.observe();
    if (this->ec) throw_op_error(op_, this->ec);
    if constexpr (!std::is_void_v<T>) return take_value<T>(op_.source());
  }

 private:
  // Hands the resumption to the waiter's executor (or cora's handler thread when it has none).
  //
  // The node is let go (state 3) only once the executor is no longer used: a frame destroyed
  // with its io_context waits for that in withdraw(), so the context outlives the post. A
  // resumption that runs inline here and ends the awaiter is told apart (completing_), so
  // that it does not wait for itself, and the node is then not touched again.
  static void complete(wait_node& node, bool may_run_inline) noexcept {
    auto& self = static_cast<pending_awaiter&>(node);
    resume_op op(self.handle_, std::move(self.owner_));
    asio::any_io_executor ex = std::move(self.executor_);
    pending_awaiter* const outer = completing_;
    bool* const outer_ended = ended_inline_;
    bool ended_inline = false;
    completing_ = &self;
    ended_inline_ = &ended_inline;
    if (!ex)
      asio::post(handler_executor(), std::move(op));
    else if (may_run_inline)
      asio::dispatch(ex, std::move(op));
    else
      asio::post(ex, std::move(op));
    ex = asio::any_io_executor();
    completing_ = outer;
    ended_inline_ = outer_ended;
    // From here on the frame may resume or be destroyed: the node is not touched again.
    if (!ended_inline) self.state.store(3, std::memory_order_release);
  }
  // The awaiter whose completion runs on this thread, and where to note that it ended inline.
  static inline thread_local pending_awaiter* completing_ = nullptr;
  static inline thread_local bool* ended_inline_ = nullptr;

  // Runs where the cancellation is emitted (the waiter's executor).
  void cancel(asio::cancellation_type type) noexcept {
    if (stoppable(type) && op_.source()->request_cancel(op_.seq())) return;
    if (op_.source()->disarm(*this)) {
      this->ec = asio::error::operation_aborted;
      complete(*this, false);
    }
  }

  void clear_slot() noexcept {
    if (slot_.is_connected()) slot_.clear();
    slot_ = {};
  }

  void withdraw() noexcept {
    if (!armed_) return;
    int s = this->state.load(std::memory_order_acquire);
    if (s == 0 && op_.source()->disarm(*this)) {
      // Withdrawn before completing: nothing will resume the frame being destroyed.
      clear_slot();
      return;
    }
    if (completing_ == this) {
      // Resumed inline by its own completion, which is still on this thread's stack: it must
      // not touch the node again.
      if (ended_inline_) *ended_inline_ = true;
      completing_ = nullptr;
      clear_slot();
      return;
    }
    // Completion is under way (possibly on another thread): wait until it let go of the node.
    while (this->state.load(std::memory_order_acquire) != 3) std::this_thread::yield();
    clear_slot();
  }

  op_handle& op_;
  std::coroutine_handle<> handle_;
  asio::any_io_executor executor_;
  intrusive_ptr<frame_owner> owner_;
  asio::cancellation_slot slot_;
  bool armed_ = false;
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
  using allocator_type = asio::associated_allocator_t<Handler, std::allocator<void>>;
  using self_allocator =
      typename std::allocator_traits<allocator_type>::template rebind_alloc<wait_op>;

  /// Allocated with the handler's associated allocator (asio's convention).
  static wait_op* create(Handler&& h, intrusive_ptr<completion_source> src, std::uint64_t position) {
    self_allocator alloc(asio::get_associated_allocator(h, std::allocator<void>()));
    wait_op* p = std::allocator_traits<self_allocator>::allocate(alloc, 1);
    try {
      std::allocator_traits<self_allocator>::construct(alloc, p, std::move(h), std::move(src), position);
    } catch (...) {
      std::allocator_traits<self_allocator>::deallocate(alloc, p, 1);
      throw;
    }
    return p;
  }

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
  struct deleter {
    self_allocator alloc;
    void operator()(wait_op* p) noexcept {
      std::allocator_traits<self_allocator>::destroy(alloc, p);
      std::allocator_traits<self_allocator>::deallocate(alloc, p, 1);
    }
  };
  using op_ptr = std::unique_ptr<wait_op, deleter>;

  // Without an executor the handler runs on cora's handler thread, never on the thread that
  // detected the completion.
  static void complete(wait_node& node, bool may_run_inline) noexcept {
    auto& self = static_cast<wait_op&>(node);
    self.finish(may_run_inline);
  }

  void cancel(asio::cancellation_type type) noexcept {
    // An op that can stop (a file read) completes by itself, with a defined end state.
    if (stoppable(type) && source_->request_cancel(seq_)) return;
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
    auto alloc = asio::get_associated_allocator(handler_, std::allocator<void>());
    auto call = asio::bind_allocator(
        alloc, [op = op_ptr(this, deleter{self_allocator(alloc)})]() mutable { deliver(std::move(op)); });
    if (!ex)
      asio::post(handler_executor(), std::move(call));
    else if (may_run_inline)
      asio::dispatch(ex, std::move(call));
    else
      asio::post(ex, std::move(call));
  }

  static void deliver(op_ptr op) {
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
    using op_t = wait_op<T, std::decay_t<Handler>>;
    std::decay_t<Handler> h(std::forward<Handler>(handler));
    op_t::create(std::move(h), std::move(src), position)->start();
  }
};

}  // namespace detail

/// The executor on which waits without an executor of their own complete: a thread owned by
/// cora that runs only such completions. Blocking there (a wait() inside a callback) works but
/// delays the other executor-less completions; bind an executor with `asio::bind_executor`
/// to choose where a handler runs.
inline asio::any_io_executor handler_executor() noexcept { return detail::handler_executor(); }

/// The completion of one operation: a copy, fill, launch, record, load or synchronize.
///
/// The operation was started when the call that returned this handle was made (device work is
/// enqueued in stream order). The handle only observes its completion:
/// - `co_await` suspends until the operation has completed on the device and returns its value
///   or throws cora::error. In a cora::task the coroutine resumes on the task's executor; in
///   a coroutine without an executor it resumes on cora's handler thread (see
///   cora::handler_executor), never on the thread that detected the completion. The wait lives
///   in the awaiting frame: destroying the frame while it is suspended withdraws the wait. A
///   cora::task's cancellation slot (see cora::spawn) completes the wait at once with
///   `asio::error::operation_aborted`.
/// - `async_wait(token)` accepts any Asio completion token (callbacks, `asio::use_awaitable`,
///   `asio::use_future`, `asio::experimental::deferred`, `asio::experimental::as_tuple`...),
///   with the signature `void(std::error_code)` or `void(std::error_code, T)`. The handler runs
///   on its associated executor (on cora's handler thread if it has none; bind an executor of
///   your choice with `asio::bind_executor`), and its memory comes from the handler's
///   associated allocator. An Asio cancellation
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
class [[nodiscard("a pending is the op's completion: await it, wait() on it, or drop it with (void)")]] pending {
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
