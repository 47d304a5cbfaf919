// cora::sync_wait: run a task to completion on the calling thread.
#pragma once

#include <exception>
#include <optional>
#include <type_traits>

#include <asio/io_context.hpp>

#include "cora/spawn.hpp"
#include "cora/task.hpp"

namespace cora {

/// Runs `t` on a private io_context driven by the calling thread and returns its result (or
/// rethrows its exception). Waits inside the task are polled by this thread, so a short device
/// operation completes without waking any other thread.
template <class T>
T sync_wait(task<T> t) {
  asio::io_context ctx(1);
  std::exception_ptr error;
  if constexpr (std::is_void_v<T>) {
    detail::start_detached(ctx.get_executor(), std::move(t),
                           [&](std::exception_ptr e) { error = e; });
    ctx.run();
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<T> value;
    detail::start_detached(ctx.get_executor(), std::move(t),
                           [&](std::exception_ptr e, std::optional<T> v) {
                             error = e;
                             value = std::move(v);
                           });
    ctx.run();
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }
}

}  // namespace cora
