// Kernels the tests, examples and benchmarks share.
#include <cora/kernel.hpp>

// Does nothing: launch and completion overhead alone.
CORA_KERNEL(empty)() {}

// z = x + y over n floats.
CORA_KERNEL(add_f32)(const float* x, const float* y, float* z, std::uint64_t n) {
  for (auto i : cora::grid_range(n)) z[i] = x[i] + y[i];
}

// add_f32 as a raw grid-stride loop: the form kernels had before grid_range, kept working.
CORA_KERNEL(add_f32_stride)(const float* x, const float* y, float* z, std::uint64_t n) {
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) z[i] = x[i] + y[i];
}

// y = a * x + y, repeated `rounds` times: a kernel heavy enough for the device to matter.
CORA_KERNEL(saxpy_rounds)(float a, const float* x, float* y, std::uint64_t n, std::uint32_t rounds) {
  for (auto i : cora::grid_range(n)) {
    float v = y[i];
    for (std::uint32_t r = 0; r < rounds; ++r) v = a * x[i] + v;
    y[i] = v;
  }
}

// Writes each element's index: a way to see which blocks ran.
CORA_KERNEL(iota_u32)(std::uint32_t* out, std::uint64_t n) {
  for (auto i : cora::grid_range(n)) out[i] = static_cast<std::uint32_t>(i);
}

// Faults on purpose.
CORA_KERNEL(trap)(std::uint32_t* out) {
  if (cora::thread_idx() == 0) out[cora::block_idx()] = 1;
  cora::trap("trap kernel");
}

// Busy for `us` microseconds (per block), then writes 1 to flag[block].
CORA_KERNEL(slow)(std::uint64_t us, std::uint32_t* flag) {
  const std::uint64_t end = cora::clock_ns() + us * 1000;
  while (cora::clock_ns() < end) cora::checkpoint();
  if (cora::thread_idx() == 0) flag[cora::block_idx()] = 1;
}

// A kernel whose name carries entry key 7 ("name_N"), for lookups by entry.
CORA_KERNEL(scale_7)(float* x, float factor, std::uint64_t n) {
  for (auto i : cora::grid_range(n)) x[i] *= factor;
}

// Per-block sums of `in` in the phased form: out[b] = sum of in[i] over the indices i that
// thread t of block b visits in a grid-stride loop, reduced through shared memory.
// block_dim() <= 256.
CORA_KERNEL(block_sum_phased)(const std::uint32_t* in, std::uint64_t n, std::uint64_t* out) {
  CORA_SHARED(std::uint64_t, partial, 256);
  const std::uint32_t threads = cora::block_dim();
  const std::uint64_t stride = cora::global_size();
  const std::uint64_t base = static_cast<std::uint64_t>(cora::block_idx()) * threads;
  cora::block_threads([&](std::uint32_t t) {
    std::uint64_t s = 0;
    for (std::uint64_t i = base + t; i < n; i += stride) s += in[i];
    partial[t] = s;
  });
  cora::sync_block();
  for (std::uint32_t width = 1; width < threads; width *= 2) {
    cora::block_threads([&](std::uint32_t t) {
      if (t % (2 * width) == 0 && t + width < threads) partial[t] += partial[t + width];
    });
    cora::sync_block();
  }
  cora::block_threads([&](std::uint32_t t) {
    if (t == 0) out[cora::block_idx()] = partial[0];
  });
}

// block_sum_phased as a plain per-thread body with raw barriers (the CPU device's fiber path).
CORA_KERNEL(block_sum_raw)(const std::uint32_t* in, std::uint64_t n, std::uint64_t* out) {
  CORA_SHARED(std::uint64_t, partial, 256);
  const std::uint32_t t = cora::thread_idx(), threads = cora::block_dim();
  std::uint64_t s = 0;
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) s += in[i];
  partial[t] = s;
  cora::sync_block();
  for (std::uint32_t width = 1; width < threads; width *= 2) {
    if (t % (2 * width) == 0 && t + width < threads) partial[t] += partial[t + width];
    cora::sync_block();
  }
  if (t == 0) out[cora::block_idx()] = partial[0];
}

// out[b * per_block + i] += b * per_block + i + 1 for every i in [0, per_block), over the block's
// threads through block_range: each element must be written exactly once.
CORA_KERNEL(block_range_mark)(std::uint32_t* out, std::uint32_t per_block) {
  const std::uint32_t base = cora::block_idx() * per_block;
  for (auto i : cora::block_range(per_block)) out[base + i] += base + i + 1;
}

// Sum of in[0, n): out[b] = the sum over the indices grid_range gives block b's threads, so the
// out[] of all blocks add up to the whole sum. The portable form of a block reduction: each
// thread sums its part of the grid, then the block reduces through shared memory.
// block_dim() <= 1024.
CORA_KERNEL(reduce_u32)(const std::uint32_t* in, std::uint64_t n, std::uint64_t* out) {
  CORA_SHARED(std::uint64_t, partial, 1024);
  const std::uint32_t threads = cora::block_dim();
  cora::block_threads([&](std::uint32_t t) {
    std::uint64_t s = 0;
    for (auto i : cora::grid_range(n)) s += in[i];
    partial[t] = s;
  });
  cora::sync_block();
  for (std::uint32_t width = 1; width < threads; width *= 2) {
    cora::block_threads([&](std::uint32_t t) {
      if (t % (2 * width) == 0 && t + width < threads) partial[t] += partial[t + width];
    });
    cora::sync_block();
  }
  cora::block_threads([&](std::uint32_t t) {
    if (t == 0) out[cora::block_idx()] = partial[0];
  });
}

// Mixed parameter sizes and alignments: checks the canonical layout end to end.
struct pair16 {
  double a;
  double b;
};
CORA_KERNEL(mixed_args)(std::uint8_t a, std::uint16_t b, pair16 c, std::uint32_t d, double* out) {
  out[0] = a;
  out[1] = b;
  out[2] = c.a;
  out[3] = c.b;
  out[4] = d;
}

// The most parameters a kernel may take (128): the last is where the sum goes.
CORA_KERNEL(many_params)(std::uint8_t a0, std::uint8_t a1, std::uint8_t a2, std::uint8_t a3, std::uint8_t a4, std::uint8_t a5, std::uint8_t a6, std::uint8_t a7, std::uint8_t a8, std::uint8_t a9, std::uint8_t a10, std::uint8_t a11, std::uint8_t a12, std::uint8_t a13, std::uint8_t a14, std::uint8_t a15, std::uint8_t a16, std::uint8_t a17, std::uint8_t a18, std::uint8_t a19, std::uint8_t a20, std::uint8_t a21, std::uint8_t a22, std::uint8_t a23, std::uint8_t a24, std::uint8_t a25, std::uint8_t a26, std::uint8_t a27, std::uint8_t a28, std::uint8_t a29, std::uint8_t a30, std::uint8_t a31, std::uint8_t a32, std::uint8_t a33, std::uint8_t a34, std::uint8_t a35, std::uint8_t a36, std::uint8_t a37, std::uint8_t a38, std::uint8_t a39, std::uint8_t a40, std::uint8_t a41, std::uint8_t a42, std::uint8_t a43, std::uint8_t a44, std::uint8_t a45, std::uint8_t a46, std::uint8_t a47, std::uint8_t a48, std::uint8_t a49, std::uint8_t a50, std::uint8_t a51, std::uint8_t a52, std::uint8_t a53, std::uint8_t a54, std::uint8_t a55, std::uint8_t a56, std::uint8_t a57, std::uint8_t a58, std::uint8_t a59, std::uint8_t a60, std::uint8_t a61, std::uint8_t a62, std::uint8_t a63, std::uint8_t a64, std::uint8_t a65, std::uint8_t a66, std::uint8_t a67, std::uint8_t a68, std::uint8_t a69, std::uint8_t a70, std::uint8_t a71, std::uint8_t a72, std::uint8_t a73, std::uint8_t a74, std::uint8_t a75, std::uint8_t a76, std::uint8_t a77, std::uint8_t a78, std::uint8_t a79, std::uint8_t a80, std::uint8_t a81, std::uint8_t a82, std::uint8_t a83, std::uint8_t a84, std::uint8_t a85, std::uint8_t a86, std::uint8_t a87, std::uint8_t a88, std::uint8_t a89, std::uint8_t a90, std::uint8_t a91, std::uint8_t a92, std::uint8_t a93, std::uint8_t a94, std::uint8_t a95, std::uint8_t a96, std::uint8_t a97, std::uint8_t a98, std::uint8_t a99, std::uint8_t a100, std::uint8_t a101, std::uint8_t a102, std::uint8_t a103, std::uint8_t a104, std::uint8_t a105, std::uint8_t a106, std::uint8_t a107, std::uint8_t a108, std::uint8_t a109, std::uint8_t a110, std::uint8_t a111, std::uint8_t a112, std::uint8_t a113, std::uint8_t a114, std::uint8_t a115, std::uint8_t a116, std::uint8_t a117, std::uint8_t a118, std::uint8_t a119, std::uint8_t a120, std::uint8_t a121, std::uint8_t a122, std::uint8_t a123, std::uint8_t a124, std::uint8_t a125, std::uint8_t a126, std::uint32_t* out) {
  out[0] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15 + a16 + a17 + a18 + a19 + a20 + a21 + a22 + a23 + a24 + a25 + a26 + a27 + a28 + a29 + a30 + a31 + a32 + a33 + a34 + a35 + a36 + a37 + a38 + a39 + a40 + a41 + a42 + a43 + a44 + a45 + a46 + a47 + a48 + a49 + a50 + a51 + a52 + a53 + a54 + a55 + a56 + a57 + a58 + a59 + a60 + a61 + a62 + a63 + a64 + a65 + a66 + a67 + a68 + a69 + a70 + a71 + a72 + a73 + a74 + a75 + a76 + a77 + a78 + a79 + a80 + a81 + a82 + a83 + a84 + a85 + a86 + a87 + a88 + a89 + a90 + a91 + a92 + a93 + a94 + a95 + a96 + a97 + a98 + a99 + a100 + a101 + a102 + a103 + a104 + a105 + a106 + a107 + a108 + a109 + a110 + a111 + a112 + a113 + a114 + a115 + a116 + a117 + a118 + a119 + a120 + a121 + a122 + a123 + a124 + a125 + a126;
}

// Flags shared with the host while a kernel runs: volatile accesses on the GPU (mapped pinned
// memory), atomic ones on the CPU device (the host thread reads them concurrently).
CORA_DEVICE std::uint32_t load_flag(const std::uint32_t* p) {
#if defined(__CUDACC__)
  return *static_cast<const volatile std::uint32_t*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
CORA_DEVICE void store_flag(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDACC__)
  *static_cast<volatile std::uint32_t*>(p) = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

// Spins until the host sets go[0] (pinned, mapped memory) or `limit_us` microseconds pass, then
// writes done[0]: 1 when released, 2 on timeout. The deterministic form of "does this call
// wait for the device?": make the call while the kernel spins, then read done (still 0 means
// the call returned without waiting for it).
CORA_KERNEL(spin_until_set)(const std::uint32_t* go, std::uint32_t* done, std::uint64_t limit_us) {
  if (cora::global_idx() != 0) return;
  const std::uint64_t end = cora::clock_ns() + limit_us * 1000;
  std::uint32_t result = 2;
  while (cora::clock_ns() < end) {
    if (load_flag(go) != 0) {
      result = 1;
      break;
    }
    cora::checkpoint();
  }
  store_flag(done, result);
}

// Waits like spin_until_set, then writes `pattern` into out[0..n): a kernel whose late writes
// show whether its output buffer was handed to someone else while it ran.
CORA_KERNEL(spin_then_fill)(const std::uint32_t* go, std::uint32_t* out, std::uint64_t n,
                            std::uint32_t pattern, std::uint64_t limit_us) {
  if (cora::global_idx() == 0) {
    const std::uint64_t end = cora::clock_ns() + limit_us * 1000;
    while (cora::clock_ns() < end && load_flag(go) == 0) cora::checkpoint();
  }
  // One block: no other block may start writing before the wait ended.
  cora::sync_block();
  for (std::uint64_t i = cora::thread_idx(); i < n; i += cora::block_dim()) out[i] = pattern;
}

// A global of the device code (binary::global, aclrtBinaryGetGlobal), and a kernel that adds
// `n` to it.
CORA_GLOBAL(std::uint32_t, cora_test_counter, 7)

CORA_KERNEL(bump_global)(std::uint32_t n) {
  if (cora::global_idx() == 0) cora_test_counter += n;
}
