#include "core/process_exit.hpp"

#include <cstdlib>

#include "backend/backend.hpp"
#include "core/engine.hpp"
#include "core/host_pool.hpp"

namespace cora::detail {

bool begin_process_exit() noexcept {
  // First no new call, then none in flight: a runtime destroyed later in the exit (a static)
  // or the releases its streams and binaries leave to cora's threads then touch no driver that
  // is being torn down.
  backend::stop_cuda_calls_for_exit();
  const auto deadline = clock::now() + exit_drain_limit;
  bool drained = engine::get().barrier(deadline);
  drained &= pass_barrier(host_pool(), host_pool_threads, deadline);
  drained &= pass_barrier(device_wait_pool(), device_wait_pool_threads, deadline);
  return drained;
}

void watch_process_exit() {
  static const bool registered = std::atexit([] { (void)begin_process_exit(); }) == 0;
  (void)registered;
}

}  // namespace cora::detail
