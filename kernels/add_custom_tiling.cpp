// The seed sample's kernel in placeholder mode: the total length and the tile count arrive as
// device pointers (placeholders the runtime fills at launch) and are read inside the kernel.
#include <cora/kernel.hpp>

CORA_KERNEL(add_custom)(cora::gm_addr x, cora::gm_addr y, cora::gm_addr z,
                        std::int32_t* tiling_length, std::int32_t* tiling_num) {
  constexpr std::uint32_t use_core_num = 8;
  constexpr std::uint32_t buffer_num = 2;
  const std::uint32_t total_length = static_cast<std::uint32_t>(*tiling_length);
  const std::uint32_t tile_num = static_cast<std::uint32_t>(*tiling_num);
  if (tile_num == 0) return;
  const std::uint32_t block_length = total_length / use_core_num;
  const std::uint32_t tile_length = block_length / tile_num / buffer_num;
  const auto* xs = reinterpret_cast<const cora::half*>(x) + block_length * cora::block_idx();
  const auto* ys = reinterpret_cast<const cora::half*>(y) + block_length * cora::block_idx();
  auto* zs = reinterpret_cast<cora::half*>(z) + block_length * cora::block_idx();
  // Each tile over the block's threads: contiguous per thread on the CPU device (a loop that
  // vectorizes), a block-stride loop on a GPU.
  // (Pointers to the tile, not an index t * tile_length + i: a 32-bit index that may wrap
  // keeps the compiler from vectorizing.)
  for (std::uint32_t t = 0; t < tile_num * buffer_num; ++t) {
    const std::size_t at = static_cast<std::size_t>(t) * tile_length;
    const cora::half* xt = xs + at;
    const cora::half* yt = ys + at;
    cora::half* zt = zs + at;
    for (auto i : cora::block_range(tile_length)) zt[i] = xt[i] + yt[i];
  }
}
