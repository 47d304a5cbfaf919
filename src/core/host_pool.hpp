// Threads for host work that blocks (driver loads, file reads without io_uring), so that it
// never runs on a caller's executor.
#pragma once

#include <asio/thread_pool.hpp>
#include <chrono>

namespace cora::detail {

inline constexpr unsigned host_pool_threads = 2;
inline constexpr unsigned device_wait_pool_threads = 2;

/// The process-wide pool for blocking host work.
asio::thread_pool& host_pool();

/// Threads for driver calls that may wait for the whole device (pinned allocation and its
/// growth, unloading modules, creating and destroying streams): kept apart from host_pool()
/// so that a load or a file read never queues behind a call that waits for a running kernel.
asio::thread_pool& device_wait_pool();

/// Waits until each of the `threads` threads of `pool` has finished the task it was running
/// (and those queued before the call), or until `deadline`. Returns true if all of them did.
/// Blocks the caller: for the exit handler, never for an executor thread. On a thread of the
/// pool, waits for the others.
bool pass_barrier(asio::thread_pool& pool, unsigned threads,
                  std::chrono::steady_clock::time_point deadline) noexcept;

}  // namespace cora::detail
