// Threads for host work that blocks (driver loads, file reads without io_uring), so that it
// never runs on a caller's executor.
#pragma once

#include <asio/thread_pool.hpp>

namespace cora::detail {

/// The process-wide pool for blocking host work.
asio::thread_pool& host_pool();

}  // namespace cora::detail
