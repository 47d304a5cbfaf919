// cora::spawn: start a cora::task on an executor, like asio::co_spawn.
#pragma once

#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/associated_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include "cora/detail/wait.hpp"
#include "cora/task.hpp"

namespace cora {
namespace detail {

/// The owner of a spawned task's frame tree, with the task's cancellation signal.
class spawn_owner final : public frame_owner {
 public:
  asio::cancellation_signal signal;
};

/// A coroutine frame that runs a task to completion, then calls `done`, and frees itself. It
/// is the root of the task's frame tree (see frame_owner).
struct detached_frame {
  struct promise_type {
    promise_type() = default;
    promise_type(const promise_type&) = delete;
    ~promise_type() {
      if (owner_) owner_->root_gone();
    }
    const asio::any_io_executor& executor() const noexcept { return executor_; }
    frame_owner* owner() const noexcept { return owner_.get(); }
    asio::cancellation_slot cancellation_slot() const noexcept { return slot_; }
    detached_frame get_return_object() noexcept {
      return {std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    std::suspend_never final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }
    asio::any_io_executor executor_;
    intrusive_ptr<frame_owner> owner_;
    asio::cancellation_slot slot_;
  };
  std::coroutine_handle<promise_type> handle;
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
/// The frame tree is owned: if `ex`'s context is destroyed before the task ends, the task's
/// frames are destroyed with it. Returns the owner, whose signal cancels the task.
/// `before_start(owner)` runs before the task can start (spawn connects its cancellation there).
struct no_hook {
  void operator()(spawn_owner&) const noexcept {}
};
template <class T, class Done, class Hook = no_hook>
intrusive_ptr<spawn_owner> start_detached(const asio::any_io_executor& ex, task<T> t, Done done,
                                          Hook before_start = {}) {
  detached_frame f = run_detached(std::move(t), std::move(done));
  auto owner = make_intrusive<spawn_owner>();
  owner->set_root(f.handle);
  auto& p = f.handle.promise();
  p.executor_ = ex;
  p.owner_ = owner;
  p.slot_ = owner->signal.slot();
  before_start(*owner);
  asio::post(ex, resume_op(f.handle, owner));
  return owner;
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

/// Forwards the completion token's cancellation slot to the task, as co_spawn does.
template <class Handler>
void connect_cancellation(Handler& handler, spawn_owner& owner) {
  auto slot = asio::get_associated_cancellation_slot(handler);
  if (!slot.is_connected()) return;
  slot.assign([o = intrusive_ptr<spawn_owner>::share(&owner)](asio::cancellation_type type) {
    if (!o->gone()) o->signal.emit(type);
  });
}

template <class Handler>
void disconnect_cancellation(Handler& handler) {
  auto slot = asio::get_associated_cancellation_slot(handler);
  if (slot.is_connected()) slot.clear();
}

struct initiate_spawn {
  template <class Handler>
  void operator()(Handler&& handler, asio::any_io_executor ex, task<void> t) const {
    auto work = asio::make_work_guard(handler, ex);
    using H = std::decay_t<Handler>;
    auto h = std::make_shared<H>(std::forward<Handler>(handler));
    start_detached(ex, std::move(t),
                   [h, work = std::move(work)](std::exception_ptr e) mutable {
                     disconnect_cancellation(*h);
                     auto hex = work.get_executor();
                     asio::dispatch(hex, [h = std::move(*h), e]() mutable { std::move(h)(e); });
                     work.reset();
                   },
                   [h](spawn_owner& owner) { connect_cancellation(*h, owner); });
  }

  template <class Handler, class T>
  void operator()(Handler&& handler, asio::any_io_executor ex, task<T> t) const {
    auto work = asio::make_work_guard(handler, ex);
    using H = std::decay_t<Handler>;
    auto h = std::make_shared<H>(std::forward<Handler>(handler));
    start_detached(ex, std::move(t),
                   [h, work = std::move(work)](std::exception_ptr e, std::optional<T> v) mutable {
                     disconnect_cancellation(*h);
                     auto hex = work.get_executor();
                     asio::dispatch(hex, [h = std::move(*h), e, v = std::move(v)]() mutable {
                       if (v)
                         std::move(h)(e, std::move(*v));
                       else
                         std::move(h)(e, T{});
                     });
                     work.reset();
                   },
                   [h](spawn_owner& owner) { connect_cancellation(*h, owner); });
  }
};

}  // namespace detail

/// Starts `t` on `ex` and reports its end through `token`, like asio::co_spawn: the signature
/// is `void(std::exception_ptr)` for task<void> and `void(std::exception_ptr, T)` otherwise
/// (T is default-constructed when the task threw). Use `asio::detached` to ignore the end.
/// A cancellation slot associated with the token (`asio::bind_cancellation_slot`) is forwarded
/// to the task: an emitted signal completes the op the task awaits with operation_aborted.
/// If the executor's context is destroyed before the task ends, the task's frames are
/// destroyed with it and the token's handler is destroyed without being called.
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
