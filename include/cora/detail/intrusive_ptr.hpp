// A minimal intrusive reference-counted pointer for the runtime's shared states.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace cora::detail {

/// Base of objects owned through intrusive_ptr. Starts at one reference.
class ref_counted {
 public:
  ref_counted() = default;
  ref_counted(const ref_counted&) = delete;
  ref_counted& operator=(const ref_counted&) = delete;

  void add_ref() const noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  /// Adds a reference unless the count already reached zero (the object is being destroyed).
  bool try_add_ref() const noexcept {
    std::uint32_t n = refs_.load(std::memory_order_relaxed);
    while (n != 0)
      if (refs_.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel)) return true;
    return false;
  }
  void release() const noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 protected:
  virtual ~ref_counted() = default;

 private:
  mutable std::atomic<std::uint32_t> refs_{1};
};

/// Owning pointer to a ref_counted object.
template <class T>
class intrusive_ptr {
 public:
  intrusive_ptr() noexcept = default;
  /// Adopts a reference (does not add one).
  static intrusive_ptr adopt(T* p) noexcept {
    intrusive_ptr r;
    r.p_ = p;
    return r;
  }
  /// Shares `p`, adding a reference.
  static intrusive_ptr share(T* p) noexcept {
    if (p) p->add_ref();
    return adopt(p);
  }
  intrusive_ptr(const intrusive_ptr& o) noexcept : p_(o.p_) {
    if (p_) p_->add_ref();
  }
  intrusive_ptr(intrusive_ptr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  template <class U>
  intrusive_ptr(intrusive_ptr<U>&& o) noexcept : p_(o.detach()) {}  // NOLINT
  template <class U>
  intrusive_ptr(const intrusive_ptr<U>& o) noexcept : p_(o.get()) {  // NOLINT
    if (p_) p_->add_ref();
  }
  intrusive_ptr& operator=(intrusive_ptr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~intrusive_ptr() {
    if (p_) p_->release();
  }

  T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  T* detach() noexcept { return std::exchange(p_, nullptr); }
  void reset() noexcept { intrusive_ptr().swap(*this); }
  void swap(intrusive_ptr& o) noexcept { std::swap(p_, o.p_); }
  friend bool operator==(const intrusive_ptr& a, const intrusive_ptr& b) noexcept {
    return a.p_ == b.p_;
  }

 private:
  T* p_ = nullptr;
};

template <class T, class... A>
intrusive_ptr<T> make_intrusive(A&&... a) {
  return intrusive_ptr<T>::adopt(new T(std::forward<A>(a)...));
}

}  // namespace cora::detail
