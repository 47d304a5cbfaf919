// Kernels of the CUDA backend's own tests. CUDA-only (built with NO_CPU): an out-of-bounds
// write must fault on the GPU, which on the CPU device would crash the process instead.
#include <cora/kernel.hpp>

// out[i] = value for i < n.
CORA_KERNEL(fill_u32)(std::uint32_t* out, std::uint32_t value, std::uint64_t n) {
  for (auto i : cora::grid_range(n)) out[i] = value;
}

// Writes out[index]: with an index far past the allocation, an illegal address.
CORA_KERNEL(oob_write)(std::uint32_t* out, std::uint64_t index) {
  if (cora::global_idx() == 0) out[index] = 0xdeadbeefu;
}

// Parameters whose CUDA layout (0, 8, 12, 16) differs from the canonical one (0, 8, 16, 24).
CORA_KERNEL(sum_args)(double* out, std::int32_t a, std::int32_t b, double c) {
  if (cora::global_idx() == 0) *out = a + b + c;
}

// Sums n values through dynamic shared memory (n <= dynamic shared bytes / 4): one block.
CORA_KERNEL(shared_sum)(const std::uint32_t* in, std::uint64_t n, std::uint64_t* out) {
  extern __shared__ std::uint32_t staged[];
  for (std::uint64_t i = cora::thread_idx(); i < n; i += cora::block_dim()) staged[i] = in[i];
  cora::sync_block();
  if (cora::thread_idx() == 0) {
    std::uint64_t sum = 0;
    for (std::uint64_t i = 0; i < n; ++i) sum += staged[i];
    *out = sum;
  }
}
