#include "core/host_pool.hpp"

#include <asio/post.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace cora::detail {

asio::thread_pool& host_pool() {
  // Never destroyed: work may still be queued while the process exits.
  static auto* pool = new asio::thread_pool(host_pool_threads);
  return *pool;
}

asio::thread_pool& device_wait_pool() {
  static auto* pool = new asio::thread_pool(device_wait_pool_threads);  // never destroyed, as host_pool()
  return *pool;
}

bool pass_barrier(asio::thread_pool& pool, unsigned threads,
                  std::chrono::steady_clock::time_point deadline) noexcept {
  // One task per thread, each holding its thread until all have arrived or the caller is done
  // waiting: only when all arrived has every thread left what it was doing. Shared, because a
  // task may run after the caller gave up.
  struct rendezvous {
    std::mutex mutex;
    std::condition_variable cv;
    unsigned arrived = 0;
    bool over = false;
  };
  std::shared_ptr<rendezvous> r;
  try {
    r = std::make_shared<rendezvous>();
  } catch (...) {
    return false;
  }
  // Called on one of the pool's threads (an exit from a task): that one is in no other task.
  if (pool.get_executor().running_in_this_thread() && threads > 0) --threads;
  unsigned posted = 0;
  try {
    for (; posted < threads; ++posted) {
      asio::post(pool, [r, threads] {
        std::unique_lock lock(r->mutex);
        if (++r->arrived == threads) r->cv.notify_all();
        r->cv.wait(lock, [&] { return r->over || r->arrived == threads; });
      });
    }
  } catch (...) {
  }
  std::unique_lock lock(r->mutex);
  // Decided and closed under one lock: a task that arrives later finds `over` and leaves.
  const bool all = posted == threads &&
                   r->cv.wait_until(lock, deadline, [&] { return r->arrived == threads; });
  r->over = true;
  r->cv.notify_all();
  return all;
}

}  // namespace cora::detail
