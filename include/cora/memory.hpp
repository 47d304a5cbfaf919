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
}  // namespace detail

/// Owning handle to `size()` elements of T in a device's memory. Move-only; frees on
/// destruction. The pointer is a device address: read and write it only through streams and
/// kernels. Freeing does not wait for device work that still uses the memory: keep the buffer
/// alive until that work has completed.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "device memory holds trivially copyable types");

 public:
  using value_type = T;

  device_buffer() noexcept = default;
  device_buffer(std::shared_ptr<detail::device_state> dev, T* p, std::size_t n) noexcept
      : dev_(std::move(dev)), p_(p), n_(n) {}
  device_buffer(device_buffer&& o) noexcept
      : dev_(std::move(o.dev_)), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = std::move(o.dev_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~device_buffer() { reset(); }

  /// The device address of the first element.
  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  std::size_t size_bytes() const noexcept { return n_ * sizeof(T); }
  bool empty() const noexcept { return n_ == 0; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// The device that owns the memory (null for an empty buffer).
  detail::device_state* owner() const noexcept { return dev_.get(); }

  /// Frees the memory now.
  void reset() noexcept {
    if (p_ && dev_) detail::free_device_memory(*dev_, p_);
    p_ = nullptr;
    n_ = 0;
    dev_.reset();
  }

 private:
  std::shared_ptr<detail::device_state> dev_;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Owning handle to pinned (page-locked) host memory: what asynchronous copies should use.
/// Readable and writable from the host like an array.
template <class T>
class host_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "host buffers hold trivially copyable types");

 public:
  using value_type = T;

  host_buffer() noexcept = default;
  host_buffer(std::shared_ptr<detail::device_state> dev, T* p, std::size_t n) noexcept
      : dev_(std::move(dev)), p_(p), n_(n) {}
  host_buffer(host_buffer&& o) noexcept
      : dev_(std::move(o.dev_)), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  host_buffer& operator=(host_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = std::move(o.dev_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~host_buffer() { reset(); }

  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  std::size_t size_bytes() const noexcept { return n_ * sizeof(T); }
  bool empty() const noexcept { return n_ == 0; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  T& operator[](std::size_t i) const noexcept { return p_[i]; }
  T* begin() const noexcept { return p_; }
  T* end() const noexcept { return p_ + n_; }
  std::span<T> span() const noexcept { return {p_, n_}; }
  detail::device_state* owner() const noexcept { return dev_.get(); }

  void reset() noexcept {
    if (p_ && dev_) detail::free_host_memory(*dev_, p_);
    p_ = nullptr;
    n_ = 0;
    dev_.reset();
  }

 private:
  std::shared_ptr<detail::device_state> dev_;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace cora
