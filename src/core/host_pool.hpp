// Threads for host work that blocks (driver loads, file reads without io_uring), so that it
// never runs on a caller's executor.
#pragma once

#include <asio/thread_pool.hpp>

namespace cora::detail {

/// The process-wide pool for blocking host work.
asio::thread_pool& host_pool();

/// Threads for driver calls that may wait for the whole device (pinned allocation and its
/// growth, unloading modules, creating and destroying streams): kept apart from host_pool()
/// so that a load or a file read never queues behind a call that waits for a running kernel.
asio::thread_pool& device_wait_pool();

}  // namespace cora::detail
