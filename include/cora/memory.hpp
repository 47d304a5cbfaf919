// Device memory (cora::device_buffer) and pinned host memory (cora::host_buffer).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace cora {

class device;

namespace detail {
class device_state;
void free_device_memory(device_state& dev, void* p) noexcept;
void free_host_memory(device_state& dev, void* p) noexcept;

/// Where a buffer's memory lives.
enum class memory_space { device, host };
}  // namespace detail

/// Owning handle to `size()` elements of T, in a device's memory (`device_buffer`) or in pinned
/// host memory (`host_buffer`). Move-only.
///
/// Dropping the handle (destruction, reset(), assignment) is a stream-ordered free: it never
/// blocks, and the memory goes back to its pool only once every op enqueued on it so far has
/// completed (each copy, fill and launch that uses the memory holds it until it completes).
template <class T, detail::memory_space Space>
class basic_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "buffers hold trivially copyable types");
  static constexpr bool host = Space == detail::memory_space::host;

 public:
  using value_type = T;

  basic_buffer() noexcept = default;
  basic_buffer(std::shared_ptr<detail::device_state> dev, T* p, std::size_t n) noexcept
      : dev_(std::move(dev)), p_(p), n_(n) {}
  basic_buffer(basic_buffer&& o) noexcept
      : dev_(std::move(o.dev_)), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  basic_buffer& operator=(basic_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = std::move(o.dev_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~basic_buffer() { reset(); }

  /// The address of the first element (a device address for device buffers: read and write it
  /// only through streams and kernels).
  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  std::size_t size_bytes() const noexcept { return n_ * sizeof(T); }
  bool empty() const noexcept { return n_ == 0; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// The device that owns the memory (null for an empty buffer).
  detail::device_state* owner() const noexcept { return dev_.get(); }

  // Host buffers are readable and writable from the host like an array.
  T& operator[](std::size_t i) const noexcept requires host { return p_[i]; }
  T* begin() const noexcept requires host { return p_; }
  T* end() const noexcept requires host { return p_ + n_; }
  std::span<T> span() const noexcept requires host { return {p_, n_}; }

  /// Drops the handle: a stream-ordered free (see the class comment). Never blocks.
  void reset() noexcept {
    if (p_ && dev_) {
      if constexpr (host)
        detail::free_host_memory(*dev_, p_);
      else
        detail::free_device_memory(*dev_, p_);
    }
    p_ = nullptr;
    n_ = 0;
    dev_.reset();
  }

  /// Gives up ownership without freeing (for stream::free and adapters).
  T* release() noexcept {
    dev_.reset();
    n_ = 0;
    return std::exchange(p_, nullptr);
  }

 private:
  std::shared_ptr<detail::device_state> dev_;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Device memory: a device address, used through streams and kernels.
template <class T>
using device_buffer = basic_buffer<T, detail::memory_space::device>;

/// Pinned (page-locked) host memory: what asynchronous copies should use.
template <class T>
using host_buffer = basic_buffer<T, detail::memory_space::host>;

}  // namespace cora
