#include "core/host_pool.hpp"

namespace cora::detail {

asio::thread_pool& host_pool() {
  // Never destroyed: work may still be queued while the process exits.
  static auto* pool = new asio::thread_pool(2);
  return *pool;
}

asio::thread_pool& device_wait_pool() {
  static auto* pool = new asio::thread_pool(2);  // never destroyed, as host_pool()
  return *pool;
}

}  // namespace cora::detail
