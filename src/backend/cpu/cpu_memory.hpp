// Device memory of the CPU device: a reserved range of address space with its own allocator,
// so device pointers are told apart from host pointers the way a GPU's are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <system_error>

namespace cora::backend::cpu {

class device_memory {
 public:
  /// Reserves `capacity` bytes of address space (committed only when touched).
  explicit device_memory(std::size_t capacity);
  ~device_memory();
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;

  void* allocate(std::size_t bytes, std::error_code& ec);
  /// Frees an allocation. One of at least release_threshold bytes returns its pages to the
  /// system; a smaller one keeps them (resident) for the next allocation.
  void deallocate(void* p) noexcept;
  static constexpr std::size_t release_threshold = std::size_t{1} << 20;
  /// Returns the pages of every free range to the system (those small frees kept).
  void release_free_pages() noexcept;
  std::size_t capacity() const noexcept { return capacity_; }
  bool contains(const void* p) const noexcept {
    return static_cast<const std::byte*>(p) >= base_ && static_cast<const std::byte*>(p) < base_ + capacity_;
  }
  std::size_t in_use() const noexcept;

 private:
  static constexpr std::size_t granule = 256;
  void insert_free(std::uintptr_t offset, std::size_t size);

  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> free_;       // offset -> size, address ordered
  std::multimap<std::size_t, std::uintptr_t> by_size_;  // size -> offset, for best fit
  std::map<std::uintptr_t, std::size_t> used_;       // offset -> size
  std::size_t in_use_ = 0;
};

}  // namespace cora::backend::cpu
