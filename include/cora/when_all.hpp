// cora::when_all: await several tasks running concurrently.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <asio/cancellation_signal.hpp>

#include "cora/spawn.hpp"
#include "cora/task.hpp"

namespace cora {

/// What when_all yields for a task<T>: T, or std::monostate for task<void>.
template <class T>
using when_all_value_t = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

namespace detail {

/// The shared state of one when_all, in its frame: the count of children still running, the
/// parent to resume, and one cancellation signal per child.
struct when_all_counter {
  explicit when_all_counter(std::size_t n)
      : remaining(n + 1), size(n), signals(new asio::cancellation_signal[n]) {}
  std::atomic<std::size_t> remaining;
  std::size_t size;
  std::unique_ptr<asio::cancellation_signal[]> signals;
  std::coroutine_handle<> parent;
  std::atomic<bool> failed{false};

  std::coroutine_handle<> arrive() noexcept {
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) return parent;
    return std::noop_coroutine();
  }
  /// Stops waiting in every child (the first failure, or the parent's own cancellation).
  void cancel_all(asio::cancellation_type type) {
    for (std::size_t i = 0; i < size; ++i) signals[i].emit(type);
  }
};

/// A child of when_all. Its frame is owned by the when_all frame (destroyed with it), and it
/// resumes the parent from its final suspension when it is the last to finish.
struct when_all_child_frame {
  struct promise_type {
    const asio::any_io_executor& executor() const noexcept { return executor_; }
    frame_owner* owner() const noexcept { return owner_; }
    asio::cancellation_slot cancellation_slot() const noexcept { return slot_; }
    when_all_child_frame get_return_object() noexcept {
      return when_all_child_frame(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    struct final_awaiter {
      bool await_ready() const noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        return h.promise().counter_->arrive();
      }
      void await_resume() const noexcept {}
    };
    final_awaiter final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }
    asio::any_io_executor executor_;
    frame_owner* owner_ = nullptr;
    asio::cancellation_slot slot_;
    when_all_counter* counter_ = nullptr;
  };

  when_all_child_frame() = default;
  explicit when_all_child_frame(std::coroutine_handle<promise_type> h) noexcept : handle(h) {}
  when_all_child_frame(when_all_child_frame&& o) noexcept : handle(std::exchange(o.handle, nullptr)) {}
  when_all_child_frame& operator=(when_all_child_frame&& o) noexcept {
    if (this != &o) {
      if (handle) handle.destroy();
      handle = std::exchange(o.handle, nullptr);
    }
    return *this;
  }
  ~when_all_child_frame() {
    if (handle) handle.destroy();
  }
  std::coroutine_handle<promise_type> handle;
};

template <class T>
struct when_all_slot {
  std::optional<when_all_value_t<T>> value;
  std::exception_ptr error;
};

template <class T>
when_all_child_frame when_all_child(task<T> t, when_all_slot<T>& slot, when_all_counter& counter) {
  try {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(t);
      slot.value.emplace();
    } else {
      slot.value.emplace(co_await std::move(t));
    }
  } catch (...) {
    slot.error = std::current_exception();
    // The first failure stops the siblings' waits: their ops complete with operation_aborted.
    if (!counter.failed.exchange(true, std::memory_order_acq_rel)) {
      counter.cancel_all(asio::cancellation_type::terminal);
    }
  }
}

/// Starts every child on the parent's executor and resumes the parent when all have finished.
/// The parent's own cancellation is forwarded to every child.
template <class Start>
struct when_all_awaiter {
  when_all_counter& counter;
  Start start;
  asio::cancellation_slot parent_slot;
  bool await_ready() const noexcept { return false; }
  template <class P>
  bool await_suspend(std::coroutine_handle<P> parent) {
    counter.parent = parent;
    asio::any_io_executor ex;
    frame_owner* owner = nullptr;
    if constexpr (requires { parent.promise().executor(); }) ex = parent.promise().executor();
    if constexpr (requires { parent.promise().owner(); }) owner = parent.promise().owner();
    if constexpr (requires { parent.promise().cancellation_slot(); }) {
      parent_slot = parent.promise().cancellation_slot();
      if (parent_slot.is_connected())
        parent_slot.assign([c = &counter](asio::cancellation_type type) { c->cancel_all(type); });
    }
    start(ex, owner);
    return counter.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1;
  }
  void await_resume() noexcept { clear(); }
  ~when_all_awaiter() { clear(); }
  void clear() noexcept {
    if (parent_slot.is_connected()) parent_slot.clear();
    parent_slot = {};
  }
};

template <class T>
when_all_child_frame start_child(const asio::any_io_executor& ex, frame_owner* owner, task<T>& t,
                                 when_all_slot<T>& slot, when_all_counter& counter, std::size_t i) {
  when_all_child_frame f = when_all_child(std::move(t), slot, counter);
  auto& p = f.handle.promise();
  p.executor_ = ex;
  p.owner_ = owner;
  p.slot_ = counter.signals[i].slot();
  p.counter_ = &counter;
  f.handle.resume();
  // A sibling failed before this child started: it stops waiting at once.
  if (counter.failed.load(std::memory_order_acquire)) counter.signals[i].emit(asio::cancellation_type::terminal);
  return f;
}

}  // namespace detail

/// Runs the tasks concurrently on the awaiting task's executor and yields their results in
/// order. Every task runs to its end; then the first exception, if any, is rethrown. The first
/// failure cancels the other tasks (terminal cancellation: the cora op or use_task operation
/// each is awaiting completes with asio::error::operation_aborted), and a cancellation of the
/// awaiting task is forwarded to every child. The children's frames belong to the when_all
/// frame: destroying it destroys them, withdrawing their waits. Children share the awaiting
/// task's executor; on a multi-threaded context give the tasks a strand.
template <class... T>
task<std::tuple<when_all_value_t<T>...>> when_all(task<T>... tasks) {
  detail::when_all_counter counter(sizeof...(T));
  std::tuple<detail::when_all_slot<T>...> slots;
  std::array<detail::when_all_child_frame, sizeof...(T)> frames;
  auto start = [&](const asio::any_io_executor& ex, detail::frame_owner* owner) {
    std::size_t i = 0;
    std::apply(
        [&](auto&... s) {
          ((frames[i] = detail::start_child(ex, owner, tasks, s, counter, i), ++i), ...);
        },
        slots);
  };
  co_await detail::when_all_awaiter<decltype(start)>{counter, start, {}};
  std::apply(
      [](auto&... s) {
        ((s.error ? std::rethrow_exception(s.error) : void()), ...);
      },
      slots);
  co_return std::apply([](auto&... s) { return std::make_tuple(std::move(*s.value)...); }, slots);
}

/// Runs the tasks concurrently and yields their results in order (see the variadic form).
template <class T>
task<std::vector<when_all_value_t<T>>> when_all(std::vector<task<T>> tasks) {
  detail::when_all_counter counter(tasks.size());
  std::vector<detail::when_all_slot<T>> slots(tasks.size());
  std::vector<detail::when_all_child_frame> frames(tasks.size());
  auto start = [&](const asio::any_io_executor& ex, detail::frame_owner* owner) {
    for (std::size_t i = 0; i < tasks.size(); ++i)
      frames[i] = detail::start_child(ex, owner, tasks[i], slots[i], counter, i);
  };
  co_await detail::when_all_awaiter<decltype(start)>{counter, start, {}};
  std::vector<when_all_value_t<T>> out;
  out.reserve(slots.size());
  for (auto& s : slots)
    if (s.error) std::rethrow_exception(s.error);
  for (auto& s : slots) out.push_back(std::move(*s.value));
  co_return out;
}

}  // namespace cora
