#include <cora/kernel.hpp>

CORA_KERNEL(negate_i32)(std::int32_t* v, std::uint64_t n) {
  for (std::uint64_t i = cora::global_idx(); i < n; i += cora::global_size()) v[i] = -v[i];
}
