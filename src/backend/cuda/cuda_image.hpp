// Reading CUDA kernel images without a driver: a cubin's architecture, a fatbin's entries,
// PTX entry points, and bounds checks. Needs no CUDA header, so the tools use it in every
// build. Every function takes untrusted bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.hpp"

namespace cora::backend::cuda {

/// The SM architecture a cubin was built for (10 * major + minor), or 0 if unknown.
unsigned cubin_arch(std::span<const std::byte> image) noexcept;

/// One entry of a fatbin: PTX or an ELF (cubin) for one architecture.
struct fatbin_entry {
  bool ptx = false;
  unsigned arch = 0;          // 10 * major + minor
  std::uint64_t offset = 0;   // of the entry's header in the fatbin
  std::uint64_t size = 0;     // payload bytes
};

/// The entries of a fatbin; false with `why` when its headers describe bytes it lacks.
bool fatbin_entries(std::span<const std::byte> image, std::vector<fatbin_entry>& out,
                    std::string& why) noexcept;

/// Checks that a cubin's or fatbin's own headers describe ranges inside `image`: the driver
/// trusts them, so a truncated or forged image must be refused before it gets there.
bool image_in_bounds(std::span<const std::byte> image, image_kind kind, std::string& why) noexcept;

/// A kernel declared in PTX text, with its parameters' sizes and alignments.
struct ptx_entry {
  std::string name;
  std::vector<param_desc> params;
};

/// The `.entry` declarations of PTX text.
std::vector<ptx_entry> ptx_entries(std::string_view ptx);

}  // namespace cora::backend::cuda
