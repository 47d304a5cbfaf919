// cora::kernel_args: an argument list built by the runtime, like CANN's aclrtArgsHandle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <system_error>
#include <vector>

#include "cora/binary.hpp"
#include "cora/launch.hpp"

namespace cora {

/// Refers to one appended parameter of a kernel_args.
struct param_handle {
  std::uint32_t index = ~0u;
};

/// An argument list for one kernel, assembled in signature order:
///
///   cora::kernel_args args(k);
///   args.append(x.data()); args.append(y.data()); args.append(z.data());
///   auto len = args.append_placeholder(), num = args.append_placeholder();
///   *static_cast<int32_t*>(args.placeholder_buffer(len, 4)) = 16384;
///   *static_cast<int32_t*>(args.placeholder_buffer(num, 4)) = 8;
///   args.finalize();
///   s.launch(k, {.grid = 8}, args);
///
/// Rules (CANN's): at most 128 parameters and a 64 KiB block; each appended size must match
/// the kernel's parameter; a placeholder is an 8-byte pointer parameter whose payload the
/// caller writes into a runtime-owned buffer from placeholder_buffer(), copied to device
/// memory at launch with the slot patched to point at it; no append after the first buffer
/// was fetched; update() changes an appended value, also after finalize() (finalize again
/// before the next launch); launch only after finalize(). The list can be launched many times.
class kernel_args {
 public:
  kernel_args() = default;
  explicit kernel_args(const cora::kernel& k) { reset(k); }

  /// Starts over for kernel `k` (what aclrtKernelArgsInit does to its per-thread handle).
  void reset(const cora::kernel& k);

  /// Appends a parameter from `size` bytes at `data`. @throws cora::error.
  param_handle append(const void* data, std::size_t size);
  param_handle append(const void* data, std::size_t size, std::error_code& ec);
  /// Appends a value (a device pointer, a scalar, a trivially copyable struct).
  template <class T>
  param_handle append(const T& value) {
    return append(&value, sizeof(T));
  }
  /// Appends a placeholder parameter. @throws cora::error.
  param_handle append_placeholder();
  param_handle append_placeholder(std::error_code& ec);
  /// The runtime-owned host buffer of `size` bytes for placeholder `ph`; valid while this list
  /// lives. @throws cora::error (errc::placeholder_misuse on a normal parameter).
  void* placeholder_buffer(param_handle ph, std::size_t size);
  void* placeholder_buffer(param_handle ph, std::size_t size, std::error_code& ec);
  /// Replaces the value of an appended (non-placeholder) parameter. @throws cora::error.
  void update(param_handle p, const void* data, std::size_t size);
  void update(param_handle p, const void* data, std::size_t size, std::error_code& ec);
  /// Marks the list complete. @throws cora::error (argument_mismatch if parameters are missing).
  void finalize();
  void finalize(std::error_code& ec);

  bool finalized() const noexcept { return finalized_; }
  std::size_t param_count() const noexcept { return params_.size(); }
  const cora::kernel& kernel() const noexcept { return kernel_; }
  /// Bytes of the block the list would launch with (parameters plus placeholder payloads).
  std::size_t block_size() const noexcept;

  /// The finalized block: canonical parameters followed by placeholder payloads.
  const std::vector<std::byte>& block() const noexcept { return block_; }
  /// Where each placeholder's slot and payload lie in block().
  const std::vector<placeholder_info>& placeholders() const noexcept { return placeholders_; }

 private:
  struct param {
    std::uint32_t offset;
    std::uint32_t size;
    bool placeholder;
  };
  cora::kernel kernel_;
  std::vector<param> params_;
  std::vector<std::byte> values_;                  // canonical parameter block
  std::vector<std::vector<std::byte>> buffers_;    // placeholder payloads, by parameter index
  std::vector<std::byte> block_;                   // built by finalize()
  std::vector<placeholder_info> placeholders_;     // built by finalize()
  std::size_t end_ = 0;
  bool buffers_fetched_ = false;
  bool finalized_ = false;
};

}  // namespace cora
