// The seed sample's kernel in simple mode: z = x + y in fp16 over 8 blocks of 2048 elements,
// sizes fixed at compile time. Each block handles its 2048-element slice in tiles, as the
// Ascend C kernel does with its double-buffered queues.
#include <cora/kernel.hpp>

namespace add_custom_simple {
constexpr std::uint32_t total_length = 8 * 2048;
constexpr std::uint32_t use_core_num = 8;
constexpr std::uint32_t block_length = total_length / use_core_num;
constexpr std::uint32_t tile_num = 8;
constexpr std::uint32_t buffer_num = 2;
constexpr std::uint32_t tile_length = block_length / tile_num / buffer_num;
}  // namespace add_custom_simple

CORA_KERNEL(add_custom)(cora::gm_addr x, cora::gm_addr y, cora::gm_addr z) {
  using namespace add_custom_simple;
  const auto* xs = reinterpret_cast<const cora::half*>(x) + block_length * cora::block_idx();
  const auto* ys = reinterpret_cast<const cora::half*>(y) + block_length * cora::block_idx();
  auto* zs = reinterpret_cast<cora::half*>(z) + block_length * cora::block_idx();
  for (std::uint32_t t = 0; t < tile_num * buffer_num; ++t)
    for (std::uint32_t i = cora::thread_idx(); i < tile_length; i += cora::block_dim()) {
      const std::uint32_t k = t * tile_length + i;
      zs[k] = xs[k] + ys[k];
    }
}
