// Kernels the tests, examples and benchmarks share.
#include <cora/kernel.hpp>

// Does nothing: launch and completion overhead alone.
CORA_KERNEL(empty)() {}

// z = x + y over n floats, grid-stride.
CORA_KERNEL(add_f32)(const float* x, const float* y, float* z, std::uint64_t n) {
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) z[i] = x[i] + y[i];
}

// y = a * x + y, repeated `rounds` times: a kernel heavy enough for the device to matter.
CORA_KERNEL(saxpy_rounds)(float a, const float* x, float* y, std::uint64_t n, std::uint32_t rounds) {
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) {
    float v = y[i];
    for (std::uint32_t r = 0; r < rounds; ++r) v = a * x[i] + v;
    y[i] = v;
  }
}

// Writes each element's index: a way to see which blocks ran.
CORA_KERNEL(iota_u32)(std::uint32_t* out, std::uint64_t n) {
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size())
    out[i] = static_cast<std::uint32_t>(i);
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
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) x[i] *= factor;
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
