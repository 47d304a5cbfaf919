// What cora does when the process exits while it holds CUDA devices.
#pragma once

#include <chrono>

namespace cora::detail {

/// How long the exit handler waits for driver calls that cora's threads have in flight.
inline constexpr std::chrono::milliseconds exit_drain_limit{2000};

/// Registers cora's exit handler, once per process. Called after cuInit: exit handlers run in
/// the reverse order of their registration, so cora's runs before those the driver and an
/// attached tool (compute-sanitizer) registered during cuInit, and before the destructors of
/// statics made before the first runtime (a map of runtimes, say).
void watch_process_exit();

/// The exit handler's body: stops every further driver call (backend::stop_cuda_calls_for_exit),
/// then waits, up to exit_drain_limit, until the calls that the engine thread and the threads
/// of the host and device-wait pools were making have returned (not user threads, nor the
/// handler thread). Returns false if one of them was still busy at the limit (a driver call
/// waiting for a kernel that does not end).
bool begin_process_exit() noexcept;

}  // namespace cora::detail
