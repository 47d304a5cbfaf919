// cora::use_task: a completion token that lets a cora::task co_await any Asio operation.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/dispatch.hpp>
#include <asio/recycling_allocator.hpp>

#include "cora/detail/wait.hpp"
#include "cora/task.hpp"

namespace cora {

/// The token type; see cora::use_task.
struct use_task_t {};

/// `co_await sock.async_read_some(buf, cora::use_task)` inside a cora::task: the operation is
/// started when awaited, its handler runs on the task's executor and resumes the task. A
/// leading error_code or exception_ptr in the signature is thrown; the remaining arguments are
/// returned (nothing, one value, or a tuple). Combine with `asio::experimental::as_tuple` to
/// get the error as a value. The handler carries the task's cancellation slot (a cancelled
/// task cancels the operation it awaits, as asio::awaitable does) and a recycling allocator.
inline constexpr use_task_t use_task{};

namespace detail {

template <class... Args>
struct use_task_result {
  using type = std::tuple<Args...>;
};

template <class Initiation, class InitArgs, class... Args>
class use_task_awaitable {
 public:
  use_task_awaitable(Initiation init, InitArgs args)
      : init_(std::move(init)), args_(std::move(args)) {}

  bool await_ready() const noexcept { return false; }

  template <class P>
  void await_suspend(std::coroutine_handle<P> h) {
    handle_ = h;
    if constexpr (requires { h.promise().executor(); }) executor_ = h.promise().executor();
    if constexpr (requires { h.promise().cancellation_slot(); }) slot_ = h.promise().cancellation_slot();
    intrusive_ptr<frame_owner> owner;
    if constexpr (requires { h.promise().owner(); })
      owner = intrusive_ptr<frame_owner>::share(h.promise().owner());
    std::apply([&](auto&&... a) { std::move(init_)(handler(this, std::move(owner)), std::move(a)...); },
               std::move(args_));
  }

  auto await_resume() {
    auto& r = *result_;
    using first = std::tuple_element_t<0, std::tuple<std::decay_t<Args>..., void*>>;
    if constexpr (sizeof...(Args) > 0 && std::is_same_v<first, std::error_code>) {
      if (std::get<0>(r)) throw std::system_error(std::get<0>(r));
      return unpack<1>(r);
    } else if constexpr (sizeof...(Args) > 0 && std::is_same_v<first, std::exception_ptr>) {
      if (std::get<0>(r)) std::rethrow_exception(std::get<0>(r));
      return unpack<1>(r);
    } else {
      return unpack<0>(r);
    }
  }

  /// The operation's handler: it carries the task's executor, cancellation slot and an
  /// allocator that recycles memory per thread. Destroyed without being called (the
  /// executor's context was destroyed), it destroys the task's frame tree, as an
  /// asio::awaitable's handler does.
  class handler {
   public:
    using executor_type = asio::any_io_executor;
    using cancellation_slot_type = asio::cancellation_slot;
    using allocator_type = asio::recycling_allocator<void>;

    handler(use_task_awaitable* self, intrusive_ptr<frame_owner> owner) noexcept
        : self_(self), owner_(std::move(owner)) {}
    handler(handler&& o) noexcept : self_(std::exchange(o.self_, nullptr)), owner_(std::move(o.owner_)) {}
    handler& operator=(handler&&) = delete;
    ~handler() {
      if (self_ && owner_) owner_->destroy_root();
    }

    executor_type get_executor() const noexcept { return self_->executor_; }
    cancellation_slot_type get_cancellation_slot() const noexcept { return self_->slot_; }
    allocator_type get_allocator() const noexcept { return {}; }

    void operator()(Args... a) {
      use_task_awaitable* self = std::exchange(self_, nullptr);
      if (owner_ && owner_->gone()) return;  // the frame tree is gone
      owner_.reset();
      self->result_.emplace(std::forward<Args>(a)...);
      self->handle_.resume();
    }

   private:
    use_task_awaitable* self_;
    intrusive_ptr<frame_owner> owner_;
  };

 private:
  template <std::size_t Skip, class Tuple>
  static auto unpack(Tuple& r) {
    constexpr std::size_t n = std::tuple_size_v<Tuple> - Skip;
    if constexpr (n == 0) {
      return;
    } else if constexpr (n == 1) {
      return std::move(std::get<Skip>(r));
    } else {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::make_tuple(std::move(std::get<Skip + I>(r))...);
      }(std::make_index_sequence<n>{});
    }
  }

  Initiation init_;
  InitArgs args_;
  std::coroutine_handle<> handle_;
  asio::any_io_executor executor_;
  asio::cancellation_slot slot_;
  std::optional<std::tuple<std::decay_t<Args>...>> result_;
};

}  // namespace detail
}  // namespace cora

template <class R, class... Args>
class asio::async_result<cora::use_task_t, R(Args...)> {
 public:
  template <class Initiation, class... InitArgs>
  static auto initiate(Initiation init, cora::use_task_t, InitArgs... args) {
    return cora::detail::use_task_awaitable<Initiation, std::tuple<InitArgs...>, Args...>(
        std::move(init), std::tuple<InitArgs...>(std::move(args)...));
  }
};
