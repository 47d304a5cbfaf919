#include "backend/cpu/cpu_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <new>

#include "cora/error.hpp"

namespace cora::backend::cpu {

device_memory::device_memory(std::size_t capacity) : capacity_(capacity) {
  void* p = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  base_ = static_cast<std::byte*>(p);
  insert_free(0, capacity_);
}

device_memory::~device_memory() { ::munmap(base_, capacity_); }

void device_memory::insert_free(std::uintptr_t offset, std::size_t size) {
  free_.emplace(offset, size);
  by_size_.emplace(size, offset);
}

void* device_memory::allocate(std::size_t bytes, std::error_code& ec) {
  if (bytes == 0) {
    ec = make_error_code(errc::invalid_argument);
    return nullptr;
  }
  if (bytes > capacity_) {
    ec = make_error_code(errc::out_of_memory);
    return nullptr;
  }
  const std::size_t size = (bytes + granule - 1) / granule * granule;
  std::lock_guard lock(mutex_);
  auto it = by_size_.lower_bound(size);
  if (it == by_size_.end()) {
    ec = make_error_code(errc::out_of_memory);
    return nullptr;
  }
  const std::uintptr_t offset = it->second;
  const std::size_t block = it->first;
  by_size_.erase(it);
  free_.erase(offset);
  if (block > size) insert_free(offset + size, block - size);
  used_.emplace(offset, size);
  in_use_ += size;
  ec.clear();
  return base_ + offset;
}

void device_memory::deallocate(void* p) noexcept {
  if (!p) return;
  std::lock_guard lock(mutex_);
  const auto offset = static_cast<std::uintptr_t>(static_cast<std::byte*>(p) - base_);
  auto u = used_.find(offset);
  if (u == used_.end()) return;
  std::uintptr_t start = offset;
  std::size_t size = u->second;
  used_.erase(u);
  in_use_ -= size;

  // Give a large buffer's whole pages back, so that it costs no memory once freed. A small one
  // keeps its pages for the next allocation: madvise flushes the TLB of every core running
  // this process (an interprocessor interrupt each), and the pages then fault in again, which
  // made allocation per request cost more than the request (the kernel server).
  if (size >= release_threshold) {
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const std::uintptr_t lo = (start + page - 1) / page * page, hi = (start + size) / page * page;
    if (hi > lo) ::madvise(base_ + lo, hi - lo, MADV_DONTNEED);
  }

  // Coalesce with neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    for (auto [b, e] = by_size_.equal_range(next->second); b != e; ++b)
      if (b->second == next->first) {
        by_size_.erase(b);
        break;
      }
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      for (auto [b, e] = by_size_.equal_range(prev->second); b != e; ++b)
        if (b->second == prev->first) {
          by_size_.erase(b);
          break;
        }
      free_.erase(prev);
    }
  }
  insert_free(start, size);
}

void device_memory::release_free_pages() noexcept {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::lock_guard lock(mutex_);
  for (const auto& [start, size] : free_) {
    const std::uintptr_t lo = (start + page - 1) / page * page, hi = (start + size) / page * page;
    if (hi > lo) ::madvise(base_ + lo, hi - lo, MADV_DONTNEED);
  }
}

std::size_t device_memory::in_use() const noexcept {
  std::lock_guard lock(mutex_);
  return in_use_;
}

}  // namespace cora::backend::cpu
