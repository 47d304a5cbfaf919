// cora::spawn: start a cora::task on an executor, like asio::co_spawn.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include "cora/task.hpp"

namespace cora {
namespace detail {

/// A detached coroutine frame that runs a task to completion, then calls `done`.
struct detached_frame {
  struct promise_type {
    const asio::any_io_executor& executor() const noexcept { return executor_; }
    detached_frame get_return_object() noexcept {
      return {std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    std::suspend_never final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }
    asio::any_io_executor executor_;
  };
  std::coroutine_handle<promise_type> handle;
};

/// Posted to start a detached frame; destroys the frame if the executor never runs it.
class frame_starter {
 public:
  explicit frame_starter(std::coroutine_handle<> h) noexcept : h_(h) {}
  frame_starter(frame_starter&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  frame_starter& operator=(frame_starter&&) = delete;
  ~frame_starter() {
    if (h_) h_.destroy();
  }
  void operator()() { std::exchange(h_, nullptr).resume(); }

 private:
  std::coroutine_handle<> h_;
};

template <class T, class Done>
detached_frame run_detached(task<T> t, Done done) {
  std::exception_ptr e;
  if constexpr (std::is_void_v<T>) {
    try {
      co_await std::move(t);
    } catch (...) {
      e = std::current_exception();
    }
    done(e);
  } else {
    std::optional<T> v;
    try {
      v.emplace(co_await std::move(t));
    } catch (...) {
      e = std::current_exception();
    }
    done(e, std::move(v));
  }
}

/// Starts `t` on `ex` (posted, never inline); `done` gets (exception_ptr[, optional<T>]).
template <class T, class Done>
void start_detached(const asio::any_io_executor& ex, task<T> t, Done done) {
  detached_frame f = run_detached(std::move(t), std::move(done));
  f.handle.promise().executor_ = ex;
  asio::post(ex, frame_starter(f.handle));
}

template <class T>
struct spawn_signature_of {
  using type = void(std::exception_ptr, T);
};
template <>
struct spawn_signature_of<void> {
  using type = void(std::exception_ptr);
};
template <class T>
using spawn_signature = typename spawn_signature_of<T>::type;

struct initiate_spawn {
  template <class Handler>
  void operator()(Handler&& handler, asio::any_io_executor ex, task<void> t) const {
    auto work = asio::make_work_guard(handler, ex);
    start_detached(ex, std::move(t),
                   [h = std::forward<Handler>(handler), work = std::move(work)](
                       std::exception_ptr e) mutable {
                     auto hex = work.get_executor();
                     asio::dispatch(hex, [h = std::move(h), e]() mutable { std::move(h)(e); });
                     work.reset();
                   });
  }

  template <class Handler, class T>
  void operator()(Handler&& handler, asio::any_io_executor ex, task<T> t) const {
    auto work = asio::make_work_guard(handler, ex);
    start_detached(ex, std::move(t),
                   [h = std::forward<Handler>(handler), work = std::move(work)](
                       std::exception_ptr e, std::optional<T> v) mutable {
                     auto hex = work.get_executor();
                     asio::dispatch(hex, [h = std::move(h), e, v = std::move(v)]() mutable {
                       if (v)
                         std::move(h)(e, std::move(*v));
                       else
                         std::move(h)(e, T{});
                     });
                     work.reset();
                   });
  }
};

}  // namespace detail

/// Starts `t` on `ex` and reports its end through `token`, like asio::co_spawn: the signature
/// is `void(std::exception_ptr)` for task<void> and `void(std::exception_ptr, T)` otherwise
/// (T is default-constructed when the task threw). Use `asio::detached` to ignore the end.
template <class Executor, class T, class CompletionToken>
auto spawn(const Executor& ex, task<T> t, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, detail::spawn_signature<T>>(
      detail::initiate_spawn{}, token, asio::any_io_executor(ex), std::move(t));
}

/// Starts `t` on the executor of `ctx` (an asio::io_context, say).
template <class ExecutionContext, class T, class CompletionToken>
  requires std::is_convertible_v<ExecutionContext&, asio::execution_context&>
auto spawn(ExecutionContext& ctx, task<T> t, CompletionToken&& token) {
  return spawn(ctx.get_executor(), std::move(t), std::forward<CompletionToken>(token));
}

}  // namespace cora
