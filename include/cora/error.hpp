// Errors: cora::errc, its error category, and cora::error.
#pragma once

#include <string>
#include <system_error>

namespace cora {

/// Error conditions reported by cora. Values are stable.
enum class errc {
  invalid_argument = 1,   ///< a bad value: zero size, null handle, unknown option...
  invalid_handle,         ///< a handle that is empty, moved from, or belongs elsewhere
  invalid_pointer,        ///< null, or not inside a live allocation of this device
  out_of_range,           ///< a range runs past the end of its allocation
  out_of_memory,          ///< the device (or pinned host memory) is exhausted
  invalid_binary,         ///< bytes that are no loadable kernel binary for this device
  kernel_not_found,       ///< no kernel with that name or entry key
  argument_mismatch,      ///< wrong argument count, size or type for the kernel
  invalid_launch_config,  ///< zero grid, grid or block over the device limit, bad attribute
  placeholder_misuse,     ///< append after fetching a buffer, fetch on a normal argument...
  args_not_finalized,     ///< launching a kernel_args before finalize()
  args_finalized,         ///< appending to a kernel_args after finalize()
  too_many_arguments,     ///< more than 128 parameters, or an argument block over 64 KiB
  binary_unloaded,        ///< the kernel's binary was unloaded
  already_unloaded,       ///< unload() of a binary that was already unloaded
  kernel_fault,           ///< a kernel trapped or faulted on the device
  kernel_timeout,         ///< a kernel ran past its timeout attribute
  device_lost,            ///< the device stopped working; nothing more runs on it
  not_supported,          ///< the backend cannot do this (never silently ignored)
  wrong_device,           ///< an object of one device used with another
  runtime_shut_down,      ///< the runtime was destroyed
  no_device,              ///< no device matches the request
  driver_error,           ///< the driver reported an error (see the message)
  not_ready,              ///< the operation has not completed yet
  timed_out,              ///< a wait ran past its timeout
  copy_fault,             ///< a copy or fill failed on the device (bad address, DMA error)
  illegal_in_capture,     ///< an op not allowed while its stream captures a graph (the capture is abandoned)
  aborted,                ///< an op discarded by stream::abort() before it ran
};

/// The category of cora::errc; name() is "cora".
const std::error_category& error_category() noexcept;

/// Makes an error_code from a cora::errc.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// The exception cora throws; what() carries the detail of the failure.
class error : public std::system_error {
 public:
  explicit error(std::error_code ec) : std::system_error(ec) {}
  error(std::error_code ec, const std::string& what) : std::system_error(ec, what) {}
  error(errc e, const std::string& what) : std::system_error(make_error_code(e), what) {}
};

/// The detail message of the last error reported through an error_code on this thread
/// (the same text the throwing form puts into what()).
const std::string& last_error_message() noexcept;

}  // namespace cora

template <>
struct std::is_error_code_enum<cora::errc> : std::true_type {};
