#include "core/host_memory_probe.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>

namespace cora::detail {

namespace {

std::uintptr_t page_size() noexcept {
  static const std::uintptr_t size = [] {
    const long s = ::sysconf(_SC_PAGESIZE);
    return s > 0 ? static_cast<std::uintptr_t>(s) : std::uintptr_t{4096};
  }();
  return size;
}

// Page ranges that passed a probe on this thread, replaced round-robin.
struct range_cache {
  struct entry {
    std::uintptr_t lo = 0, hi = 0;
    bool accessible = false;  // its ends were read, not only found mapped
  };
  std::array<entry, 8> entries{};
  unsigned next = 0;

  bool covers(std::uintptr_t lo, std::uintptr_t hi, bool accessible) const noexcept {
    for (const auto& e : entries)
      if (lo >= e.lo && hi <= e.hi && (e.accessible || !accessible)) return true;
    return false;
  }
  void add(std::uintptr_t lo, std::uintptr_t hi, bool accessible) noexcept {
    entries[next] = {lo, hi, accessible};
    next = (next + 1) % entries.size();
  }
};

thread_local range_cache cache;

// This process's id without a system call per probe (glibc no longer caches it); a forked
// child asks again.
std::atomic<pid_t> self_pid{0};

pid_t self() noexcept {
  pid_t p = self_pid.load(std::memory_order_relaxed);
  if (p == 0) {
    static std::once_flag once;
    std::call_once(once, [] { ::pthread_atfork(nullptr, nullptr, [] { self_pid.store(0); }); });
    p = ::getpid();
    self_pid.store(p, std::memory_order_relaxed);
  }
  return p;
}

// Reads one byte of each given page through the kernel: fails (EFAULT) for a page that is not
// mapped or not readable, without a signal. 1: readable, 0: not, -1: the call is not permitted
// here (a seccomp filter), so mincore's answer has to do.
int readable(const std::uintptr_t* pages, std::size_t n) noexcept {
  char sink[2];
  std::array<iovec, 2> remote{};
  for (std::size_t i = 0; i < n; ++i) remote[i] = {reinterpret_cast<void*>(pages[i]), 1};
  iovec local{sink, n};
  const ssize_t r = ::process_vm_readv(self(), &local, 1, remote.data(), n, 0);
  if (r == static_cast<ssize_t>(n)) return 1;
  return r < 0 && (errno == ENOSYS || errno == EPERM) ? -1 : 0;
}

// Whether every page of [lo, hi) (page-aligned) is mapped, a chunk of pages at a time.
bool mapped(std::uintptr_t lo, std::uintptr_t hi) noexcept {
  const std::uintptr_t ps = page_size();
  unsigned char vec[1024];
  for (std::uintptr_t a = lo; a < hi;) {
    const std::uintptr_t pages = std::min<std::uintptr_t>((hi - a) / ps, sizeof(vec));
    if (::mincore(reinterpret_cast<void*>(a), pages * ps, vec) != 0) return false;
    a += pages * ps;
  }
  return true;
}

}  // namespace

bool host_range_mapped(const void* p, std::size_t bytes, bool accessible) noexcept {
  if (bytes == 0) return true;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes - 1 > UINTPTR_MAX - a) return false;
  const std::uintptr_t ps = page_size();
  const std::uintptr_t lo = a & ~(ps - 1);
  const std::uintptr_t last = (a + (bytes - 1)) & ~(ps - 1);
  if (last > UINTPTR_MAX - ps) return false;
  const std::uintptr_t hi = last + ps;
  if (cache.covers(lo, hi, accessible)) return true;
  if (!accessible) {
    if (!mapped(lo, hi)) return false;
    cache.add(lo, hi, false);
    return true;
  }
  const std::uintptr_t ends[2] = {a, a + (bytes - 1)};
  const int ends_readable = readable(ends, lo == last ? 1 : 2);
  if (ends_readable == 0) return false;
  // Both ends were read (two pages or fewer: all of it); no page between may be unmapped.
  if (ends_readable < 0 ? !mapped(lo, hi) : hi - lo > 2 * ps && !mapped(lo + ps, last))
    return false;
  cache.add(lo, hi, true);
  return true;
}

void forget_host_ranges() noexcept { cache = {}; }

}  // namespace cora::detail
