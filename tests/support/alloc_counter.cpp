// Replaces the global operator new/delete with counting ones. In a file of its own, so the
// compiler never sees a replaced new paired with a library delete inline. ThreadSanitizer's
// runtime defines them itself (a second definition does not link): there nothing is counted.
#include "support/alloc_counter.hpp"

#include <cstdlib>
#include <new>

#if defined(__SANITIZE_THREAD__)
#define CORA_COUNT_HEAP 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CORA_COUNT_HEAP 0
#endif
#endif
#ifndef CORA_COUNT_HEAP
#define CORA_COUNT_HEAP 1
#endif

namespace {
// Per thread: the runtime's own threads (a device's worker, the poller) allocate when they
// please, and a check of one path must not see them.
thread_local std::uint64_t count = 0;
}

std::uint64_t cora::test::heap_allocations() noexcept { return count; }
bool cora::test::heap_counting() noexcept { return CORA_COUNT_HEAP != 0; }

#if CORA_COUNT_HEAP
void* operator new(std::size_t n) {
  ++count;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// The non-throwing forms too: the library's own would pair with the delete above.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++count;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return operator new(n, std::nothrow);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif
