// The portable kernel dialect. One kernel source compiles with nvcc for NVIDIA GPUs and with the
// host compiler for the CPU device (through cora_add_kernel_binary):
//
//   #include <cora/kernel.hpp>
//   CORA_KERNEL(add_f32)(const float* x, const float* y, float* z, std::uint64_t n) {
//     for (auto i : cora::grid_range(n)) z[i] = x[i] + y[i];
//   }
//
// Element-wise kernels use cora::grid_range(n): every index in [0, n) exactly once over the
// grid. On a GPU it is the grid-stride loop; on the CPU device each block (and each thread of a
// block) gets one contiguous, cache-line-aligned slice, a plain counted loop the compiler
// vectorizes.
//
// Blocks may have threads on both devices. On the CPU device a block runs on one worker and its
// threads run as an inner loop. Kernels that need a barrier write it in the phased form:
//
//   CORA_SHARED(float, partial, 256);
//   cora::block_threads([&](std::uint32_t t) { partial[t] = ...; });
//   cora::sync_block();
//   cora::block_threads([&](std::uint32_t t) { ... partial[t ^ 1] ... });
//
// Each block_threads call is one inner loop over the block's threads on the CPU device and the
// thread's own call on a GPU; code outside block_threads runs once per block on the CPU device
// (as thread 0) and on every thread on a GPU, so it must not depend on the thread. A per-thread
// body that calls sync_block() outside block_threads also works: on the CPU device its threads
// then run as small-stack fibers that switch at the barrier (correct, but far slower).
// docs/kernels.md has the rules and which path a kernel takes.
#pragma once

#include <cstdint>

#include "cora/kernel_types.hpp"

#if defined(__CUDACC__)

/// Declares a kernel; the parameter list and body follow.
#define CORA_KERNEL(name) extern "C" __global__ void name
/// Marks a helper function callable from kernels.
#define CORA_DEVICE __device__ inline
/// Defines a global variable of the device code, `type name = init` (a constant initializer),
/// that the host finds with binary::global("name") (CANN's aclrtBinaryGetGlobal).
#define CORA_GLOBAL(type, name, init) \
  extern "C" {                        \
  __device__ type name = init;        \
  }
/// Registration is done by the CPU build only.
#define CORA_REGISTER_KERNEL(name)
#define CORA_REGISTER_KERNEL_FORM(name, form)
/// Declares `type* name`: `count` elements of memory shared by the threads of a block
/// (`count` a constant; at most 48 KiB a block; uninitialized). Put it at the top of the body.
#define CORA_SHARED(type, name, count)         \
  __shared__ type cora_shared_##name[(count)]; \
  type* const name = cora_shared_##name

namespace cora {

/// Linear index of this block in the grid.
__device__ inline std::uint32_t block_idx() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
/// Number of blocks in the grid.
__device__ inline std::uint32_t block_num() { return gridDim.x * gridDim.y * gridDim.z; }
/// Linear index of this thread in its block.
__device__ inline std::uint32_t thread_idx() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
/// Threads per block.
__device__ inline std::uint32_t block_dim() { return blockDim.x * blockDim.y * blockDim.z; }
/// Index of this thread in the whole grid.
__device__ inline std::uint64_t global_idx() {
  return static_cast<std::uint64_t>(block_idx()) * block_dim() + thread_idx();
}
/// Threads in the whole grid.
__device__ inline std::uint64_t global_size() {
  return static_cast<std::uint64_t>(block_num()) * block_dim();
}
/// Barrier for the threads of a block.
__device__ inline void sync_block() { __syncthreads(); }

/// Runs `f(t)` for this thread's index t: one phase of a phased kernel (see the file comment).
template <class F>
__device__ inline void block_threads(F&& f) {
  f(thread_idx());
}

/// The indices a strided loop visits: first, first + stride, ... below last (grid_range's
/// grid-stride loop, block_range's block-stride loop).
template <class I>
struct stride_range {
  struct sentinel {
    std::uint64_t last;
  };
  struct iterator {
    std::uint64_t i, stride;
    __device__ I operator*() const { return static_cast<I>(i); }
    __device__ iterator& operator++() {
      i += stride;
      return *this;
    }
    __device__ bool operator!=(const sentinel& s) const { return i < s.last; }
  };
  std::uint64_t first_, last_, stride_;
  __device__ iterator begin() const { return {first_, stride_}; }
  __device__ sentinel end() const { return {last_}; }
};

/// Every index in [0, n) once over the whole grid: `for (auto i : cora::grid_range(n))`.
template <class I>
__device__ inline stride_range<I> grid_range(I n) {
  const std::uint64_t count = n > I(0) ? static_cast<std::uint64_t>(n) : 0;
  return {global_idx(), count, global_size()};
}

/// Every index in [0, n) once over the threads of this block:
/// `for (auto i : cora::block_range(n))`.
template <class I>
__device__ inline stride_range<I> block_range(I n) {
  const std::uint64_t count = n > I(0) ? static_cast<std::uint64_t>(n) : 0;
  return {thread_idx(), count, block_dim()};
}

/// Stops the launch with a device fault.
[[noreturn]] __device__ inline void trap(const char* = nullptr) {
  __trap();
  __builtin_unreachable();
}
/// Traps unless `ok`.
__device__ inline void check(bool ok, const char* what = nullptr) {
  if (!ok) trap(what);
}
/// A point where the CPU device may stop a launch that ran past its timeout (no-op on GPUs).
__device__ inline void checkpoint() {}
/// A monotonic clock in nanoseconds.
__device__ inline std::uint64_t clock_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace cora

#else  // CPU device

#include <array>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <exception>
#include <tuple>
#include <type_traits>

#include "cora/detail/arg_layout.hpp"
#include "cora/detail/cpu_kernel_abi.h"

#include <sys/mman.h>
#include <ucontext.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CORA_DETAIL_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CORA_DETAIL_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(CORA_DETAIL_ASAN)
#define CORA_DETAIL_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(CORA_DETAIL_TSAN)
#define CORA_DETAIL_TSAN 1
#endif
#ifndef CORA_DETAIL_ASAN
#define CORA_DETAIL_ASAN 0
#endif
#ifndef CORA_DETAIL_TSAN
#define CORA_DETAIL_TSAN 0
#endif
#if CORA_DETAIL_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#if CORA_DETAIL_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#include <atomic>
#include <memory>
#include <vector>

#define CORA_KERNEL(name) [[maybe_unused]] static void name
#define CORA_DEVICE inline
/// Defines a global variable of the device code, `type name = init` (a constant initializer),
/// that the host finds with binary::global("name") (CANN's aclrtBinaryGetGlobal).
/// Its size goes beside it (cora_global_size_<name>): the symbol's own size may include
/// padding that a sanitizer adds around globals.
#define CORA_GLOBAL(type, name, init)                                                       \
  extern "C" {                                                                              \
  __attribute__((visibility("default"))) type name = init;                                  \
  __attribute__((visibility("default"))) extern const unsigned long long cora_global_size_##name = \
      sizeof(type);                                                                         \
  }
/// Declares `type* name`: `count` elements of memory shared by the threads of a block
/// (`count` a constant; at most 48 KiB a block; uninitialized). Put it at the top of the body.
#define CORA_SHARED(type, name, count) \
  type* const name = ::cora::detail::shared_array<type>(static_cast<std::size_t>(count))

namespace cora {

namespace detail {

struct kernel_stop {
  int status;
  const char* what;
};

// How the threads of a block run on the CPU device (docs/kernels.md).
enum class block_mode : std::uint8_t {
  single,      // block_dim() == 1: the body once per block
  probe,       // thread 0 runs on a fiber until the body shows its form
  phased,      // the body once per block, each block_threads call an inner loop
  per_thread,  // the body once per thread, in a loop (no barrier seen)
  fibers       // the body once per thread on fibers that switch at sync_block()
};

struct fiber_set;

// One block being run by a worker.
struct block_run {
  cora_cpu_launch launch;  // block_index is the block being run
  std::uint32_t threads = 1;
  block_mode mode = block_mode::single;
  unsigned char* shared = nullptr;  // CORA_CPU_SHARED_BYTES
  fiber_set* fibers = nullptr;
};

// One thread of a block (or the whole block, when the body runs once for all of them).
struct thread_run {
  block_run* block = nullptr;
  std::uint32_t thread = 0;
  bool whole_block = true;  // grid_range() gives the block's slice, not this thread's
  bool asked = false;       // the body asked for a per-thread value (thread_idx, grid_range...)
  std::uint32_t shared_used = 0;
};

// The thread being run by this worker. Read once per body or helper call, never per element.
inline thread_local thread_run* current = nullptr;

}  // namespace detail

inline std::uint32_t block_idx() { return detail::current->block->launch.block_index; }
inline std::uint32_t block_num() { return detail::current->block->launch.block_count; }
inline std::uint32_t block_dim() { return detail::current->block->threads; }
inline std::uint32_t thread_idx() {
  detail::thread_run* r = detail::current;
  r->asked = true;
  return r->thread;
}
inline std::uint64_t global_idx() {
  return static_cast<std::uint64_t>(block_idx()) * block_dim() + thread_idx();
}
inline std::uint64_t global_size() { return static_cast<std::uint64_t>(block_num()) * block_dim(); }

inline std::uint64_t clock_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

[[noreturn]] inline void trap(const char* what = nullptr) {
  throw detail::kernel_stop{CORA_CPU_TRAP, what ? what : "kernel trap"};
}

inline void check(bool ok, const char* what = nullptr) {
  if (!ok) trap(what ? what : "kernel check failed");
}

inline void checkpoint() {
  const cora_cpu_launch& l = detail::current->block->launch;
  if (l.abort_flag && __atomic_load_n(l.abort_flag, __ATOMIC_RELAXED))
    throw detail::kernel_stop{CORA_CPU_ABORTED, "launch aborted by the device"};
  if (l.deadline_ns && clock_ns() > l.deadline_ns)
    throw detail::kernel_stop{CORA_CPU_TIMEOUT, "kernel ran past its timeout"};
}

/// A contiguous range of indices [first, last): what grid_range gives on the CPU device.
template <class I>
struct index_range {
  struct iterator {
    I i;
    I operator*() const { return i; }
    iterator& operator++() {
      ++i;
      return *this;
    }
    // `<`, not `!=`: first <= last always, and a loop that cannot wrap lets the compiler treat
    // an index computed from i (t * tile + i in 32 bits) as affine, and vectorize.
    bool operator!=(const iterator& o) const { return i < o.i; }
  };
  I first, last;
  iterator begin() const { return {first}; }
  iterator end() const { return {last}; }
  I size() const { return last - first; }
};

namespace detail {

// Slices start at multiples of 64 elements: whole cache lines for any element type, so no two
// workers write to one line and every slice can start on a vector boundary.
constexpr std::uint64_t slice_align = 64;

inline void slice(std::uint64_t n, std::uint64_t parts, std::uint64_t part, std::uint64_t& lo,
                  std::uint64_t& hi) {
  std::uint64_t per = (n + parts - 1) / parts;
  per = (per + slice_align - 1) / slice_align * slice_align;
  const std::uint64_t start = per * part;
  lo = start < n ? start : n;
  hi = n - lo < per ? n : lo + per;
}

}  // namespace detail

namespace detail {

// The part of [lo, hi) that the running body stands for: all of it where the body runs once for
// the whole block, else the running thread's contiguous share. Marks the body as having asked
// for a per-thread value.
template <class I>
inline index_range<I> thread_part(std::uint64_t lo, std::uint64_t hi) {
  thread_run* r = current;
  r->asked = true;
  if (!r->whole_block) {
    std::uint64_t tlo, thi;
    slice(hi - lo, r->block->threads, r->thread, tlo, thi);
    hi = lo + thi;
    lo += tlo;
  }
  return {static_cast<I>(lo), static_cast<I>(hi)};
}

}  // namespace detail

/// Every index in [0, n) once over the whole grid: `for (auto i : cora::grid_range(n))`. On
/// the CPU device, this block's (or this thread's) contiguous slice.
template <class I>
inline index_range<I> grid_range(I n) {
  const detail::block_run* b = detail::current->block;
  const std::uint64_t count = n > I(0) ? static_cast<std::uint64_t>(n) : 0;
  std::uint64_t lo, hi;
  detail::slice(count, b->launch.block_count, b->launch.block_index, lo, hi);
  return detail::thread_part<I>(lo, hi);
}

/// Every index in [0, n) once over the threads of this block:
/// `for (auto i : cora::block_range(n))`. On the CPU device, the whole range where the body runs
/// once for the block, else this thread's contiguous part of it: a plain counted loop that
/// vectorizes, where a loop stepping by block_dim() would not.
template <class I>
inline index_range<I> block_range(I n) {
  return detail::thread_part<I>(0, n > I(0) ? static_cast<std::uint64_t>(n) : 0);
}

/// Runs one phase of a phased kernel: f(t) for each thread t of the block, as one inner loop.
template <class F>
inline void block_threads(F&& f) {
  detail::thread_run* r = detail::current;
  detail::block_run* b = r->block;
  if (b->mode == detail::block_mode::probe && !r->asked) {
    // The body's first per-thread step is a phase: the phased form.
    b->mode = detail::block_mode::phased;
    r->whole_block = true;
  }
  if (r->whole_block) {
    // Inside the phase the body stands for thread t alone (grid_range gives t's part).
    r->whole_block = false;
    const std::uint32_t n = b->threads;
    for (std::uint32_t t = 0; t < n; ++t) {
      r->thread = t;
      f(t);
    }
    r->thread = 0;
    r->whole_block = true;
    return;
  }
  r->asked = true;
  f(r->thread);
}

namespace detail {

template <class T>
T* shared_array(std::size_t count) {
  thread_run* r = current;
  constexpr std::size_t align = alignof(T) < 16 ? 16 : alignof(T);
  const std::size_t off = (r->shared_used + align - 1) / align * align;
  if (count > (CORA_CPU_SHARED_BYTES - off) / sizeof(T))
    throw kernel_stop{CORA_CPU_TRAP, "block shared memory (CORA_SHARED) exceeds 48 KiB"};
  r->shared_used = static_cast<std::uint32_t>(off + count * sizeof(T));
  return reinterpret_cast<T*>(r->block->shared + off);
}

// ---- Fibers: the fallback for per-thread bodies with a barrier ------------------------------
// Sanitizers are told of every stack switch, or they take a fiber's stack for a corrupt one.

constexpr std::size_t fiber_stack = 64 * 1024;
constexpr std::size_t fiber_guard = 4096;

struct fiber {
  ucontext_t context;
  thread_run run;
  bool started = false;
  bool done = false;
  void* tsan = nullptr;           // the fiber's ThreadSanitizer context
  unsigned char* map = nullptr;   // [guard page | stack]

  fiber() {
    void* p = ::mmap(nullptr, fiber_guard + fiber_stack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw kernel_stop{CORA_CPU_EXCEPTION, "out of memory for block fibers"};
    map = static_cast<unsigned char*>(p);
    ::mprotect(map, fiber_guard, PROT_NONE);
#if CORA_DETAIL_TSAN
    tsan = __tsan_create_fiber(0);
#endif
  }
  ~fiber() {
#if CORA_DETAIL_TSAN
    if (tsan) __tsan_destroy_fiber(tsan);
#endif
    ::munmap(map, fiber_guard + fiber_stack);
  }
  fiber(const fiber&) = delete;
  fiber& operator=(const fiber&) = delete;
  unsigned char* stack() const { return map + fiber_guard; }
};

struct fiber_set {
  ucontext_t scheduler;
  fiber* running = nullptr;
  // Made as needed and kept for the blocks that follow; never moved (a suspended fiber's
  // context points into itself).
  std::vector<std::unique_ptr<fiber>> fibers;
  std::exception_ptr failure;
  void* body = nullptr;  // the kernel's arguments, for the entry
  // The worker's stack, for switches back to it under AddressSanitizer.
  const void* scheduler_bottom = nullptr;
  std::size_t scheduler_size = 0;
  void* scheduler_tsan = nullptr;

  void reserve(std::uint32_t n) {
    while (fibers.size() < n) fibers.push_back(std::make_unique<fiber>());
  }
  fiber& at(std::uint32_t t) { return *fibers[t]; }
};

// The scheduler (the worker's stack) switches to fiber t and returns when it yields or ends.
inline void switch_to_fiber(fiber_set& fs, std::uint32_t t) {
  fiber& f = fs.at(t);
  fs.running = &f;
#if CORA_DETAIL_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack(), fiber_stack);
#endif
#if CORA_DETAIL_TSAN
  fs.scheduler_tsan = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(f.tsan, 0);
#endif
  ::swapcontext(&fs.scheduler, &f.context);
#if CORA_DETAIL_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  fs.running = nullptr;
}

// On a fiber, just switched to: tell AddressSanitizer, and learn the worker's stack.
inline void arrived_on_fiber([[maybe_unused]] fiber_set& fs, [[maybe_unused]] void* fake) {
#if CORA_DETAIL_ASAN
  __sanitizer_finish_switch_fiber(fake, &fs.scheduler_bottom, &fs.scheduler_size);
#endif
}

// Leaves the running fiber for the scheduler (at a barrier); returns when resumed.
inline void fiber_yield(fiber_set& fs) {
  fiber* f = fs.running;
  void* fake = nullptr;
#if CORA_DETAIL_ASAN
  __sanitizer_start_switch_fiber(&fake, fs.scheduler_bottom, fs.scheduler_size);
#endif
#if CORA_DETAIL_TSAN
  __tsan_switch_to_fiber(fs.scheduler_tsan, 0);
#endif
  ::swapcontext(&f->context, &fs.scheduler);
  arrived_on_fiber(fs, fake);
}

template <auto Fn, class Values>
void fiber_entry(unsigned lo, unsigned hi) {
  auto* fs = reinterpret_cast<fiber_set*>((static_cast<std::uintptr_t>(hi) << 32) | lo);
  arrived_on_fiber(*fs, nullptr);
  fiber* f = fs->running;
  current = &f->run;
  try {
    std::apply(Fn, *static_cast<Values*>(fs->body));
  } catch (...) {
    if (!fs->failure) fs->failure = std::current_exception();
  }
  f->done = true;
  // Returning switches to uc_link, the scheduler; this fiber's stack is done with.
#if CORA_DETAIL_ASAN
  __sanitizer_start_switch_fiber(nullptr, fs->scheduler_bottom, fs->scheduler_size);
#endif
#if CORA_DETAIL_TSAN
  __tsan_switch_to_fiber(fs->scheduler_tsan, 0);
#endif
}

template <auto Fn, class Values>
void start_fiber(fiber_set& fs, std::uint32_t t, block_run& b, thread_run* self) {
  fs.reserve(t + 1);
  fiber& f = fs.at(t);
  f.run = thread_run{&b, t, false, false, 0};
  f.started = true;
  f.done = false;
  ::getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack();
  f.context.uc_stack.ss_size = fiber_stack;
  f.context.uc_link = &fs.scheduler;
  const auto p = reinterpret_cast<std::uintptr_t>(&fs);
  ::makecontext(&f.context, reinterpret_cast<void (*)()>(&fiber_entry<Fn, Values>), 2,
                static_cast<unsigned>(p & 0xffffffffu), static_cast<unsigned>(p >> 32));
  switch_to_fiber(fs, t);
  current = self;
}

inline void resume_fiber(fiber_set& fs, std::uint32_t t, thread_run* self) {
  current = &fs.at(t).run;
  switch_to_fiber(fs, t);
  current = self;
}

inline void rethrow_failure(fiber_set& fs) {
  if (fs.failure) {
    std::exception_ptr e = fs.failure;
    fs.failure = nullptr;
    std::rethrow_exception(e);
  }
}

// The body of each thread on its own fiber; every fiber runs up to the next barrier (or its
// end) in turn, then all are released. Thread 0 may already wait at the first barrier (probe).
template <auto Fn, class Values>
void run_fibers(block_run& b, fiber_set& fs, thread_run* self, std::uint32_t first_fresh) {
  b.mode = block_mode::fibers;
  for (std::uint32_t t = first_fresh; t < b.threads; ++t) {
    start_fiber<Fn, Values>(fs, t, b, self);
    rethrow_failure(fs);
  }
  for (;;) {
    bool live = false;
    for (std::uint32_t t = 0; t < b.threads; ++t) {
      if (fs.at(t).done) continue;
      live = true;
      resume_fiber(fs, t, self);
      rethrow_failure(fs);
    }
    if (!live) return;
  }
}

enum class learned_form : std::uint8_t { unknown, phased, per_thread, fibers };

// What the first blocks of a kernel showed of its form; a plain static of the image.
template <auto Fn>
std::atomic<learned_form>& kernel_form() {
  static std::atomic<learned_form> form{learned_form::unknown};
  return form;
}

// Runs one block whose threads number more than one.
template <auto Fn, class Values>
void run_block_threads(block_run& b, thread_run& self, Values& values, fiber_set& fs) {
  auto& form = kernel_form<Fn>();
  const learned_form known = form.load(std::memory_order_relaxed);
  self.shared_used = 0;
  self.asked = false;
  self.thread = 0;
  if (known == learned_form::phased) {
    b.mode = block_mode::phased;
    self.whole_block = true;
    std::apply(Fn, values);
    return;
  }
  fs.body = &values;
  b.fibers = &fs;
  if (known == learned_form::fibers) {
    run_fibers<Fn, Values>(b, fs, &self, 0);
    return;
  }
  // Thread 0 runs on a fiber until the body shows its form: a block_threads call before any
  // per-thread value (phased), a barrier (fibers), or its end (a per-thread loop).
  b.mode = block_mode::probe;
  start_fiber<Fn, Values>(fs, 0, b, &self);
  rethrow_failure(fs);
  fiber& f0 = fs.at(0);
  if (b.mode == block_mode::phased) {
    if (!f0.done) throw kernel_stop{CORA_CPU_EXCEPTION, "phased kernel left its fiber early"};
    form.store(learned_form::phased, std::memory_order_relaxed);
    return;
  }
  if (b.mode == block_mode::fibers) {  // thread 0 waits at the first barrier
    form.store(learned_form::fibers, std::memory_order_relaxed);
    run_fibers<Fn, Values>(b, fs, &self, 1);
    return;
  }
  form.store(learned_form::per_thread, std::memory_order_relaxed);
  b.mode = block_mode::per_thread;
  self.whole_block = false;
  for (std::uint32_t t = 1; t < b.threads; ++t) {
    self.thread = t;
    self.shared_used = 0;
    std::apply(Fn, values);
  }
  self.thread = 0;
  self.whole_block = true;
}

}  // namespace detail

/// Barrier for the threads of a block (see the file comment).
inline void sync_block() {
  detail::thread_run* r = detail::current;
  detail::block_run* b = r->block;
  switch (b->mode) {
    case detail::block_mode::single:
    case detail::block_mode::phased:
      return;  // phases already run one after another
    case detail::block_mode::probe:
      b->mode = detail::block_mode::fibers;
      detail::fiber_yield(*b->fibers);
      return;
    case detail::block_mode::fibers:
      detail::fiber_yield(*b->fibers);
      return;
    case detail::block_mode::per_thread:
      throw detail::kernel_stop{CORA_CPU_TRAP,
                                "sync_block() reached by a thread of a block whose thread 0 "
                                "finished without it (a barrier in divergent code)"};
  }
}

namespace detail {

template <class... P>
struct param_pack {
  static constexpr std::size_t count = sizeof...(P);
  static_assert(count <= CORA_KERNEL_MAX_PARAMS, "a kernel takes at most 128 parameters");
  static_assert((std::is_trivially_copyable_v<std::decay_t<P>> && ...),
                "kernel parameters must be trivially copyable");
  static_assert((!std::is_reference_v<P> && ...), "kernel parameters are passed by value");

  static constexpr std::array<std::size_t, count> sizes{sizeof(std::decay_t<P>)...};
  static constexpr std::array<std::size_t, count> aligns{alignof(std::decay_t<P>)...};
  static constexpr std::array<bool, count> pointers{std::is_pointer_v<std::decay_t<P>>...};
  static constexpr std::array<std::size_t, count> offsets = [] {
    std::array<std::size_t, count> o{};
    std::size_t end = 0;
    for (std::size_t i = 0; i < count; ++i) {
      o[i] = next_param_offset(end, aligns[i]);
      end = o[i] + sizes[i];
    }
    return o;
  }();

  template <std::size_t... I>
  static std::tuple<std::decay_t<P>...> unpack(const unsigned char* block,
                                               std::index_sequence<I...>) {
    std::tuple<std::decay_t<P>...> values;
    (std::memcpy(static_cast<void*>(&std::get<I>(values)), block + offsets[I], sizes[I]), ...);
    return values;
  }
};

template <class F>
struct kernel_signature;
template <class... P>
struct kernel_signature<void (*)(P...)> {
  using pack = param_pack<P...>;
};

constexpr bool is_digit(char c) { return c >= '0' && c <= '9'; }

template <auto Fn, std::size_t N>
constexpr cora_kernel_record make_kernel_record(const char (&name)[N], std::uint32_t form) {
  using pack = typename kernel_signature<decltype(Fn)>::pack;
  static_assert(N <= CORA_KERNEL_MAX_NAME, "kernel name too long");
  cora_kernel_record r{};
  const char magic[] = CORA_KERNEL_RECORD_MAGIC;
  for (int i = 0; i < 8; ++i) r.magic[i] = magic[i];
  r.record_size = sizeof(cora_kernel_record);
  r.param_count = static_cast<std::uint32_t>(pack::count);
  r.flags = form & (CORA_KERNEL_FLAG_PHASED | CORA_KERNEL_FLAG_RAW_BARRIER);
  for (std::size_t i = 0; i < N; ++i) r.name[i] = name[i];
  for (std::size_t i = 0; i < pack::count; ++i) {
    r.param_size[i] = static_cast<std::uint32_t>(pack::sizes[i]);
    r.param_align[i] = static_cast<std::uint32_t>(pack::aligns[i]) |
                       (pack::pointers[i] ? CORA_KERNEL_PARAM_POINTER : 0u);
  }
  // "name_N" has entry key N, as in CANN.
  std::size_t end = N - 1, digits = end;
  while (digits > 0 && is_digit(name[digits - 1])) --digits;
  if (digits < end && digits > 0 && name[digits - 1] == '_') {
    std::uint64_t key = 0;
    for (std::size_t i = digits; i < end; ++i) key = key * 10 + static_cast<std::uint64_t>(name[i] - '0');
    r.entry_key = key;
    r.flags |= CORA_KERNEL_FLAG_HAS_ENTRY_KEY;
  }
  return r;
}

inline int report(char* message, std::uint32_t size, const char* what) {
  if (message && size) {
    std::size_t n = std::strlen(what);
    if (n >= size) n = size - 1;
    std::memcpy(message, what, n);
    message[n] = '\0';
  }
  return 0;
}

template <auto Fn>
int run_blocks(const cora_cpu_launch* launch, std::uint32_t first, std::uint32_t last,
               const void* args, char* message, std::uint32_t message_size) noexcept {
  using pack = typename kernel_signature<decltype(Fn)>::pack;
  alignas(64) unsigned char shared[CORA_CPU_SHARED_BYTES];
  block_run block;
  block.launch = *launch;
  block.threads = launch->block_threads ? launch->block_threads : 1;
  block.shared = shared;
  thread_run self;
  self.block = &block;
  thread_run* saved = current;
  current = &self;
  int status = CORA_CPU_OK;
  try {
    auto values = pack::unpack(static_cast<const unsigned char*>(args),
                               std::make_index_sequence<pack::count>{});
    if (block.threads == 1) {
      for (std::uint32_t b = first; b < last; ++b) {
        block.launch.block_index = b;
        self.shared_used = 0;
        std::apply(Fn, values);
      }
    } else {
      fiber_set fibers;
      for (std::uint32_t b = first; b < last; ++b) {
        block.launch.block_index = b;
        run_block_threads<Fn>(block, self, values, fibers);
      }
    }
  } catch (const kernel_stop& stop) {
    status = stop.status;
    report(message, message_size, stop.what);
  } catch (const std::exception& e) {
    status = CORA_CPU_EXCEPTION;
    report(message, message_size, e.what());
  } catch (...) {
    status = CORA_CPU_EXCEPTION;
    report(message, message_size, "unknown exception in kernel");
  }
  current = saved;
  return status;
}

}  // namespace detail
}  // namespace cora

/// Emitted after a kernel's definition by the generated registration unit of
// Clang's AddressSanitizer pads instrumented globals with redzones, which would break the
// packed array of records that the section must hold; GCC leaves sectioned globals alone.
#if defined(__clang__)
#define CORA_DETAIL_RECORD_NO_ASAN __attribute__((no_sanitize("address")))
#else
#define CORA_DETAIL_RECORD_NO_ASAN
#endif

/// cora_add_kernel_binary: the entry function and the kernel's metadata record; `form` is
/// the CORA_KERNEL_FLAG_PHASED / _RAW_BARRIER the source reads as.
#define CORA_REGISTER_KERNEL(name) CORA_REGISTER_KERNEL_FORM(name, 0)
#define CORA_REGISTER_KERNEL_FORM(name, form)                                              \
  extern "C" __attribute__((visibility("default"))) int cora_cpu_entry_##name(             \
      const cora_cpu_launch* launch, std::uint32_t first, std::uint32_t last,              \
      const void* args, char* message, std::uint32_t message_size) {                       \
    return ::cora::detail::run_blocks<&name>(launch, first, last, args, message,           \
                                             message_size);                                \
  }                                                                                        \
  [[gnu::used, gnu::section(CORA_KERNEL_RECORD_SECTION)]] CORA_DETAIL_RECORD_NO_ASAN       \
  constexpr cora_kernel_record cora_kernel_record_##name =                                   \
      ::cora::detail::make_kernel_record<&name>(#name, form);

#endif
