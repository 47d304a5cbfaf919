#include "core/host_pool.hpp"

namespace cora::detail {

asio::thread_pool& host_pool() {
  // Never destroyed: work may still be queued while the process exits.
  static auto* pool = new asio::thread_pool(2);
  return *pool;
}

}  // namespace cora::detail
