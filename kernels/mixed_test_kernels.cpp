// Kernels of the mixed-mode tests (built into the test program by cora_add_kernel_library).
#include <cora/kernel.hpp>

// y = a * x + y
CORA_KERNEL(axpy)(float a, const float* x, float* y, std::uint64_t n) {
  for (auto i : cora::grid_range(n)) y[i] = a * x[i] + y[i];
}

// out[0] = number of blocks, via an untyped pointer as CANN kernels take them.
CORA_KERNEL(count_blocks_3)(cora::gm_addr out) {
  if (cora::block_idx() == 0 && cora::thread_idx() == 0)
    *reinterpret_cast<std::uint32_t*>(out) = cora::block_num();
}
