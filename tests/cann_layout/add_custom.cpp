// z = x + y over n floats, in cora's portable dialect (the role an Ascend C kernel has in a
// CANN project); each block handles a grid-strided share.
#include <cora/kernel.hpp>

CORA_KERNEL(add_custom)(cora::gm_addr x, cora::gm_addr y, cora::gm_addr z, std::uint32_t n) {
  const auto* xs = reinterpret_cast<const float*>(x);
  const auto* ys = reinterpret_cast<const float*>(y);
  auto* zs = reinterpret_cast<float*>(z);
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) zs[i] = xs[i] + ys[i];
}

// Scales a vector in place; a second kernel of the same library.
CORA_KERNEL(scale)(float* v, float factor, std::uint32_t n) {
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) v[i] *= factor;
}
