// The portable kernel dialect. One kernel source compiles with nvcc for NVIDIA GPUs and with the
// host compiler for the CPU device (through cora_add_kernel_binary):
//
//   #include <cora/kernel.hpp>
//   CORA_KERNEL(add_f32)(const float* x, const float* y, float* z, std::uint64_t n) {
//     for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size())
//       z[i] = x[i] + y[i];
//   }
//
// On the CPU device a block runs as one thread (block_dim() == 1), like an Ascend AI core;
// kernels written with grid-stride loops or per-block tiles run on both.
#pragma once

#include <cstdint>

#include "cora/kernel_types.hpp"

#if defined(__CUDACC__)

/// Declares a kernel; the parameter list and body follow.
#define CORA_KERNEL(name) extern "C" __global__ void name
/// Marks a helper function callable from kernels.
#define CORA_DEVICE __device__ inline
/// Registration is done by the CPU build only.
#define CORA_REGISTER_KERNEL(name)

namespace cora {

/// Linear index of this block in the grid.
__device__ inline std::uint32_t block_idx() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
/// Number of blocks in the grid.
__device__ inline std::uint32_t block_num() { return gridDim.x * gridDim.y * gridDim.z; }
/// Linear index of this thread in its block (always 0 on the CPU device).
__device__ inline std::uint32_t thread_idx() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
/// Threads per block (always 1 on the CPU device).
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

#define CORA_KERNEL(name) [[maybe_unused]] static void name
#define CORA_DEVICE inline

namespace cora {

namespace detail {

// The launch of the block this thread is running; set by the image's entry function.
inline thread_local const cora_cpu_launch* current_launch = nullptr;

struct kernel_stop {
  int status;
  const char* what;
};

}  // namespace detail

inline std::uint32_t block_idx() { return detail::current_launch->block_index; }
inline std::uint32_t block_num() { return detail::current_launch->block_count; }
inline std::uint32_t thread_idx() { return 0; }
inline std::uint32_t block_dim() { return 1; }
inline std::uint64_t global_idx() { return block_idx(); }
inline std::uint64_t global_size() { return block_num(); }
inline void sync_block() {}

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
  const cora_cpu_launch* l = detail::current_launch;
  if (l->abort_flag && __atomic_load_n(l->abort_flag, __ATOMIC_RELAXED))
    throw detail::kernel_stop{CORA_CPU_ABORTED, "launch aborted by the device"};
  if (l->deadline_ns && clock_ns() > l->deadline_ns)
    throw detail::kernel_stop{CORA_CPU_TIMEOUT, "kernel ran past its timeout"};
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
constexpr cora_kernel_record make_kernel_record(const char (&name)[N]) {
  using pack = typename kernel_signature<decltype(Fn)>::pack;
  static_assert(N <= CORA_KERNEL_MAX_NAME, "kernel name too long");
  cora_kernel_record r{};
  const char magic[] = CORA_KERNEL_RECORD_MAGIC;
  for (int i = 0; i < 8; ++i) r.magic[i] = magic[i];
  r.record_size = sizeof(cora_kernel_record);
  r.param_count = static_cast<std::uint32_t>(pack::count);
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
  cora_cpu_launch local = *launch;
  const cora_cpu_launch* saved = current_launch;
  current_launch = &local;
  int status = CORA_CPU_OK;
  try {
    auto values = pack::unpack(static_cast<const unsigned char*>(args),
                               std::make_index_sequence<pack::count>{});
    for (std::uint32_t b = first; b < last; ++b) {
      local.block_index = b;
      std::apply(Fn, values);
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
  current_launch = saved;
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

/// cora_add_kernel_binary: the entry function and the kernel's metadata record.
#define CORA_REGISTER_KERNEL(name)                                                         \
  extern "C" __attribute__((visibility("default"))) int cora_cpu_entry_##name(             \
      const cora_cpu_launch* launch, std::uint32_t first, std::uint32_t last,              \
      const void* args, char* message, std::uint32_t message_size) {                       \
    return ::cora::detail::run_blocks<&name>(launch, first, last, args, message,           \
                                             message_size);                                \
  }                                                                                        \
  [[gnu::used, gnu::section(CORA_KERNEL_RECORD_SECTION)]] CORA_DETAIL_RECORD_NO_ASAN       \
  constexpr cora_kernel_record cora_kernel_record_##name =                                   \
      ::cora::detail::make_kernel_record<&name>(#name);

#endif
