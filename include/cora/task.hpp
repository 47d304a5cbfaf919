// cora::task<T>: a lazy coroutine task bound to an Asio executor.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/cancellation_signal.hpp>

namespace cora {

template <class T = void>
class task;

namespace detail {

class frame_owner;

class task_promise_base {
 public:
  /// The executor this task runs on: the one given to spawn(), or its awaiter's.
  const asio::any_io_executor& executor() const noexcept { return executor_; }
  void set_executor(const asio::any_io_executor& ex) { executor_ = ex; }
  /// The owner of the frame tree this task belongs to (spawn, sync_wait), or null.
  frame_owner* owner() const noexcept { return owner_; }
  /// Where a cancellation of this task is signalled: inherited from its awaiter, or from the
  /// completion token given to cora::spawn. Ops the task awaits attach to it.
  asio::cancellation_slot cancellation_slot() const noexcept { return slot_; }
  /// Adopts what an awaiting frame passes down: executor, owner, cancellation slot.
  template <class P>
  void inherit(const P& parent) {
    if constexpr (requires { parent.executor(); }) {
      if (!executor_) executor_ = parent.executor();
    }
    if constexpr (requires { parent.owner(); }) {
      if (!owner_) owner_ = parent.owner();
    }
    if constexpr (requires { parent.cancellation_slot(); }) {
      if (!slot_.is_connected()) slot_ = parent.cancellation_slot();
    }
  }
  void set_owner(frame_owner* o) noexcept { owner_ = o; }
  void set_cancellation_slot(asio::cancellation_slot s) noexcept { slot_ = s; }

  std::suspend_always initial_suspend() const noexcept { return {}; }

  struct final_awaiter {
    bool await_ready() const noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) const noexcept {
      auto c = h.promise().continuation_;
      return c ? c : std::noop_coroutine();
    }
    void await_resume() const noexcept {}
  };
  final_awaiter final_suspend() const noexcept { return {}; }

  void unhandled_exception() noexcept { exception_ = std::current_exception(); }

  std::coroutine_handle<> continuation_;
  std::exception_ptr exception_;
  asio::any_io_executor executor_;
  frame_owner* owner_ = nullptr;
  asio::cancellation_slot slot_;
};

template <class T>
class task_promise : public task_promise_base {
 public:
  task<T> get_return_object() noexcept;
  template <class U = T>
  void return_value(U&& v) {
    value_.emplace(std::forward<U>(v));
  }
  T result() {
    if (exception_) std::rethrow_exception(exception_);
    return std::move(*value_);
  }

 private:
  std::optional<T> value_;
};

template <>
class task_promise<void> : public task_promise_base {
 public:
  task<void> get_return_object() noexcept;
  void return_void() const noexcept {}
  void result() const {
    if (exception_) std::rethrow_exception(exception_);
  }
};

template <class T>
struct task_awaiter {
  std::coroutine_handle<task_promise<T>> h;
  bool await_ready() const noexcept { return !h || h.done(); }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> parent) noexcept {
    h.promise().continuation_ = parent;
    h.promise().inherit(parent.promise());
    return h;
  }
  T await_resume() { return h.promise().result(); }
};

}  // namespace detail

/// A lazily started coroutine that produces a T.
///
/// Nothing runs until the task is awaited or given to cora::spawn / cora::sync_wait. Awaiting
/// transfers control to the task directly (symmetric transfer) and it inherits the awaiter's
/// executor; when it finishes, the awaiter resumes on the same thread. Exceptions propagate to
/// the awaiter. Inside a task, `co_await` on a cora::pending resumes on the task's executor, and
/// Asio operations are awaited with the cora::use_task token.
///
/// Ownership: a task owns its frame, and a frame owns the tasks it awaits. A task started by
/// cora::spawn or cora::sync_wait belongs to a frame tree whose root is destroyed if a
/// resumption of the tree is dropped unrun (its io_context was destroyed while the task was
/// suspended), so frames, streams and buffers held by a task are never leaked. Destroying a
/// frame suspended on a cora::pending withdraws the wait.
///
/// Cancellation: a task carries an Asio cancellation slot, inherited by the tasks it awaits.
/// An emitted cancellation completes the cora::pending or use_task operation being awaited
/// with asio::error::operation_aborted (the device work runs on). cora::spawn connects it to
/// its completion token's slot, and when_all uses it to stop siblings after a failure.
template <class T>
class [[nodiscard]] task {
 public:
  using promise_type = detail::task_promise<T>;
  using value_type = T;

  task() noexcept = default;
  explicit task(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  task(task&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  task& operator=(task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  ~task() {
    if (h_) h_.destroy();
  }

  /// True when the task holds a coroutine.
  bool valid() const noexcept { return static_cast<bool>(h_); }

  auto operator co_await() && noexcept { return detail::task_awaiter<T>{h_}; }

  /// Gives up the coroutine (for spawn and when_all).
  std::coroutine_handle<promise_type> release() noexcept { return std::exchange(h_, nullptr); }

 private:
  std::coroutine_handle<promise_type> h_;
};

namespace detail {
template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
  return task<T>(std::coroutine_handle<task_promise<T>>::from_promise(*this));
}
inline task<void> task_promise<void>::get_return_object() noexcept {
  return task<void>(std::coroutine_handle<task_promise<void>>::from_promise(*this));
}

struct this_executor_t {
  bool await_ready() const noexcept { return false; }
  template <class P>
  bool await_suspend(std::coroutine_handle<P> h) noexcept {
    executor = h.promise().executor();
    return false;
  }
  asio::any_io_executor await_resume() noexcept { return std::move(executor); }
  asio::any_io_executor executor;
};
}  // namespace detail

/// `co_await cora::this_executor()` in a cora::task returns the task's executor.
inline detail::this_executor_t this_executor() noexcept { return {}; }

}  // namespace cora
