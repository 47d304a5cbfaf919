// cora::when_all: await several tasks running concurrently.
#pragma once

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "cora/spawn.hpp"
#include "cora/task.hpp"

namespace cora {

/// What when_all yields for a task<T>: T, or std::monostate for task<void>.
template <class T>
using when_all_value_t = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

namespace detail {

struct when_all_counter {
  explicit when_all_counter(std::size_t n) : remaining(n + 1) {}
  std::atomic<std::size_t> remaining;
  std::coroutine_handle<> parent;
  void arrive() {
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) parent.resume();
  }
};

template <class T>
struct when_all_slot {
  std::optional<when_all_value_t<T>> value;
  std::exception_ptr error;
};

template <class T>
detached_frame when_all_child(task<T> t, when_all_slot<T>& slot, when_all_counter& counter) {
  try {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(t);
      slot.value.emplace();
    } else {
      slot.value.emplace(co_await std::move(t));
    }
  } catch (...) {
    slot.error = std::current_exception();
  }
  counter.arrive();
}

/// Starts every child on the parent's executor and resumes the parent when all have finished.
template <class Start>
struct when_all_awaiter {
  when_all_counter& counter;
  Start start;
  bool await_ready() const noexcept { return false; }
  template <class P>
  bool await_suspend(std::coroutine_handle<P> parent) {
    counter.parent = parent;
    asio::any_io_executor ex;
    if constexpr (requires { parent.promise().executor(); }) ex = parent.promise().executor();
    start(ex);
    return counter.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1;
  }
  void await_resume() const noexcept {}
};

template <class T>
void start_child(const asio::any_io_executor& ex, task<T>& t, when_all_slot<T>& slot,
                 when_all_counter& counter) {
  detached_frame f = when_all_child(std::move(t), slot, counter);
  f.handle.promise().executor_ = ex;
  f.handle.resume();
}

}  // namespace detail

/// Runs the tasks concurrently on the awaiting task's executor and yields their results in
/// order. Every task runs to its end; then the first exception, if any, is rethrown.
template <class... T>
task<std::tuple<when_all_value_t<T>...>> when_all(task<T>... tasks) {
  detail::when_all_counter counter(sizeof...(T));
  std::tuple<detail::when_all_slot<T>...> slots;
  auto start = [&](const asio::any_io_executor& ex) {
    std::apply([&](auto&... s) { (detail::start_child(ex, tasks, s, counter), ...); }, slots);
  };
  co_await detail::when_all_awaiter<decltype(start)>{counter, start};
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
  auto start = [&](const asio::any_io_executor& ex) {
    for (std::size_t i = 0; i < tasks.size(); ++i)
      detail::start_child(ex, tasks[i], slots[i], counter);
  };
  co_await detail::when_all_awaiter<decltype(start)>{counter, start};
  std::vector<when_all_value_t<T>> out;
  out.reserve(slots.size());
  for (auto& s : slots)
    if (s.error) std::rethrow_exception(s.error);
  for (auto& s : slots) out.push_back(std::move(*s.value));
  co_return out;
}

}  // namespace cora
