// cora::binary and cora::kernel: loaded kernel images and the kernels in them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace cora {

class device;

namespace detail {
class binary_state;
class kernel_state;
}  // namespace detail

/// One kernel parameter in cora's canonical argument block.
struct param_info {
  std::size_t offset;  ///< byte offset in the block (a multiple of max(8, align))
  std::size_t size;    ///< bytes
  std::size_t align;   ///< alignment of the parameter's type
  /// The kernel declares it a pointer (CPU kernel records). False where the image does not say
  /// (CUDA kernels): such slots are passed unchecked.
  bool pointer = false;
};

/// How to load a binary.
struct load_options {
  /// Defer the device load until the first kernel lookup (CANN's lazy load).
  bool lazy = false;
};

/// A kernel of a loaded binary. Cheap to copy; keeps its binary's code alive while in use.
class kernel {
 public:
  kernel() noexcept = default;
  explicit kernel(std::shared_ptr<detail::kernel_state> s) noexcept : s_(std::move(s)) {}

  std::string_view name() const noexcept;
  /// The entry key: N for a kernel named `name_N`, or one the container assigned.
  std::optional<std::uint64_t> entry_key() const noexcept;
  /// Parameters in signature order, with offsets in the canonical argument block.
  std::span<const param_info> params() const noexcept;
  /// Bytes of the canonical argument block (8-byte aligned).
  std::size_t args_size() const noexcept;
  /// Where the kernel's code lies in the device's address space (the CPU device: its entry
  /// function in the loaded image); null where the backend exposes none (CUDA) or once the
  /// binary was unloaded.
  void* code_address() const noexcept;

  explicit operator bool() const noexcept { return static_cast<bool>(s_); }
  const std::shared_ptr<detail::kernel_state>& state() const noexcept { return s_; }

 private:
  std::shared_ptr<detail::kernel_state> s_;
};

/// A global variable of a binary's device code: where it lives and its size.
struct device_global {
  void* address = nullptr;  ///< in the device's address space (see binary::global)
  std::size_t size = 0;     ///< bytes
};

/// A kernel binary loaded on one device. Copies share it. Launches in flight keep its code
/// loaded even after unload() or after every handle is gone.
class binary {
 public:
  binary() noexcept = default;
  explicit binary(std::shared_ptr<detail::binary_state> s) noexcept : s_(std::move(s)) {}
  binary(const binary&) noexcept = default;
  binary(binary&&) noexcept = default;
  /// The last handle's release unloads the code on this thread where that waits for no cora
  /// work (the device idle), else on a cora thread once launches in flight have finished.
  binary& operator=(const binary& other) noexcept;
  binary& operator=(binary&& other) noexcept;
  ~binary();

  /// The kernel called `name`. @throws cora::error (errc::kernel_not_found,
  /// errc::binary_unloaded).
  cora::kernel kernel(std::string_view name) const;
  cora::kernel kernel(std::string_view name, std::error_code& ec) const;
  /// The kernel with entry key `key`. @throws cora::error (errc::kernel_not_found...).
  cora::kernel kernel_by_entry(std::uint64_t key) const;
  cora::kernel kernel_by_entry(std::uint64_t key, std::error_code& ec) const;
  /// The global variable `name` (defined with CORA_GLOBAL): on a GPU its device memory, on
  /// the CPU device the loaded image's own data (host memory, where the kernels see it). Copies
  /// read and write it; it lives while the binary is loaded. Loads a lazily loaded binary.
  /// @throws cora::error (errc::kernel_not_found, errc::binary_unloaded, errc::invalid_argument
  ///         for an empty name).
  device_global global(std::string_view name) const;
  device_global global(std::string_view name, std::error_code& ec) const;
  /// Names of every kernel in the binary.
  std::vector<std::string> kernel_names() const;
  /// The format that was loaded ("cpu-elf", "cuda-fatbin", "corabin/cpu-elf"...).
  std::string format() const;

  /// Unloads the binary: new lookups and launches of its kernels fail with
  /// errc::binary_unloaded; launches already enqueued finish first, then the code is freed.
  /// @throws cora::error (errc::already_unloaded on a second call).
  void unload();
  void unload(std::error_code& ec);
  bool loaded() const noexcept;
  /// The backend's module (a CUmodule on CUDA); null on the CPU device, before a lazy load
  /// has happened, and after unload().
  void* native_handle() const noexcept;

  explicit operator bool() const noexcept { return static_cast<bool>(s_); }
  const std::shared_ptr<detail::binary_state>& state() const noexcept { return s_; }

 private:
  std::shared_ptr<detail::binary_state> s_;
};

}  // namespace cora
