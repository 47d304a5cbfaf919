// A mutex whose waiters spin briefly before they sleep.
#pragma once

#include <mutex>

namespace cora::detail {

/// A stream's lock is held across one driver call, a few microseconds. With a plain mutex the
/// waiters slept, and every hand-over cost a wake-up, tens of microseconds on a loaded host: a
/// stream that several threads enqueue on ran at the pace of wake-ups, not of its driver calls
/// (a lock convoy; the kernel server's workers on the H200). Waiters here retry with growing
/// pauses for roughly ten microseconds, then sleep as before.
class adaptive_mutex {
 public:
  void lock() {
    for (unsigned round = 0, pauses = 1; round < spin_rounds; ++round) {
      if (m_.try_lock()) return;
      for (unsigned i = 0; i < pauses; ++i) relax();
      if (pauses < max_pauses) pauses *= 2;
    }
    m_.lock();
  }
  bool try_lock() noexcept { return m_.try_lock(); }
  void unlock() noexcept { m_.unlock(); }

 private:
  static constexpr unsigned spin_rounds = 20;
  static constexpr unsigned max_pauses = 32;

  static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::mutex m_;
};

}  // namespace cora::detail
