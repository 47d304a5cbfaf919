// cora's canonical argument-block layout, shared by host packing and CPU kernel images:
// parameters in signature order, each at an offset aligned to max(8, its alignment), the block
// padded to 8 bytes. It is CANN's layout for AI Core kernels (8-byte slots), so a host block
// built for CANN (`void* args[] = {x, y, z}`) is a valid block here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cora::detail {

constexpr std::size_t align_up(std::size_t v, std::size_t a) noexcept {
  return (v + a - 1) / a * a;
}

constexpr std::size_t slot_alignment(std::size_t align) noexcept { return align < 8 ? 8 : align; }

/// Offset of a parameter that follows a block currently `end` bytes long.
constexpr std::size_t next_param_offset(std::size_t end, std::size_t align) noexcept {
  return align_up(end, slot_alignment(align));
}

/// Offsets of parameters with the given sizes and alignments; returns the block size.
template <std::size_t N>
constexpr std::size_t canonical_offsets(const std::size_t (&sizes)[N],
                                        const std::size_t (&aligns)[N],
                                        std::size_t (&offsets)[N]) noexcept {
  std::size_t end = 0;
  for (std::size_t i = 0; i < N; ++i) {
    offsets[i] = next_param_offset(end, aligns[i]);
    end = offsets[i] + sizes[i];
  }
  return align_up(end, 8);
}

}  // namespace cora::detail
