// Kernel libraries (mixed mode): kernels built into the program by cora_add_kernel_library,
// embedded as a .corabin and loaded on first launch per device. The build generates one typed
// launcher per kernel, so host code launches by symbol:
//
//   #include "my_kernels.hpp"          // generated
//   co_await my_kernels::add_custom(s, {.grid = 8}, x, y, z);
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cora/binary.hpp"
#include "cora/kernel_types.hpp"
#include "cora/memory.hpp"
#include "cora/stream.hpp"

namespace cora {

/// A kernel binary compiled into the program. Thread-safe; loads lazily per device.
class kernel_library {
 public:
  /// `image` must stay valid for the program's life (it is the embedded .corabin);
  /// `kernels` are the names the launchers refer to by index.
  kernel_library(std::span<const std::byte> image, std::vector<std::string> kernels);
  kernel_library(const kernel_library&) = delete;
  kernel_library& operator=(const kernel_library&) = delete;
  ~kernel_library();

  /// Kernel `index` (of the constructor's list) on the stream's device, loading the library on
  /// that device first if needed (a blocking load, once per device).
  /// @throws cora::error when loading or the lookup fails.
  const cora::kernel& kernel(const stream& s, std::size_t index);
  /// The same, by name, on `dev`.
  cora::kernel kernel(cora::device& dev, std::string_view name);
  /// The embedded .corabin.
  std::span<const std::byte> image() const noexcept { return image_; }
  const std::vector<std::string>& kernel_names() const noexcept { return names_; }

 private:
  struct per_device;
  per_device& on(const std::shared_ptr<detail::device_state>& dev);
  std::span<const std::byte> image_;
  std::vector<std::string> names_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<per_device>> devices_;
};

/// A launcher's symbol and the kernel it launches, for APIs that take kernel symbols (CANN's
/// aclrtGetFuncBySymbol, aclrtLaunchKernelWithArgsArray).
struct kernel_symbol {
  kernel_library* library = nullptr;
  std::size_t index = 0;
};

/// Registers `symbol` (a launcher's address) as kernel `index` of `library`.
void register_kernel_symbol(const void* symbol, kernel_library& library, std::size_t index);
/// The kernel behind a registered symbol; library is null when unknown.
kernel_symbol find_kernel_symbol(const void* symbol) noexcept;

namespace detail {

/// What a generated launcher takes for a pointer parameter P: a P, or a device_buffer of its
/// element type (any device_buffer for gm_addr, CANN's untyped pointer).
template <class P>
struct device_arg {
  using element = std::remove_cv_t<std::remove_pointer_t<P>>;
  device_arg(P p) noexcept : ptr(p) {}  // NOLINT
  template <class U>
    requires(std::is_same_v<std::remove_cv_t<U>, element> || std::is_same_v<P, gm_addr>)
  device_arg(const device_buffer<U>& b) noexcept  // NOLINT
      : ptr(reinterpret_cast<P>(b.data())) {}
  P ptr;
};

/// Parameter type of a generated launcher for a kernel parameter of type T.
template <class T>
using launcher_param = std::conditional_t<std::is_pointer_v<T>, device_arg<T>, T>;

template <class T>
T unwrap(const device_arg<T>& a) noexcept {
  return a.ptr;
}
template <class T>
const T& unwrap(const T& v) noexcept {
  return v;
}

}  // namespace detail
}  // namespace cora
