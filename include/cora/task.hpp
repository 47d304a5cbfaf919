// cora::task<T>: a lazy coroutine task bound to an Asio executor.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>

namespace cora {

template <class T = void>
class task;

namespace detail {

class task_promise_base {
 public:
  /// The executor this task runs on: the one given to spawn(), or its awaiter's.
  const asio::any_io_executor& executor() const noexcept { return executor_; }
  void set_executor(const asio::any_io_executor& ex) { executor_ = ex; }

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
    if constexpr (requires { parent.promise().executor(); }) {
      if (!h.promise().executor()) h.promise().set_executor(parent.promise().executor());
    }
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
