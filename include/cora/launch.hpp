// Launch configuration: grid, block, shared memory and attributes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace cora {

/// Three extents, each at least 1 by default; converts from one number.
struct dim3 {
  std::uint32_t x = 1, y = 1, z = 1;
  constexpr dim3(std::uint32_t x_ = 1, std::uint32_t y_ = 1, std::uint32_t z_ = 1) noexcept  // NOLINT
      : x(x_), y(y_), z(z_) {}
  /// x * y * z, without overflow.
  constexpr std::uint64_t volume() const noexcept {
    return static_cast<std::uint64_t>(x) * y * z;
  }
  friend constexpr bool operator==(const dim3&, const dim3&) = default;
};

/// How a launch's blocks are scheduled.
enum class schedule_mode {
  normal,  ///< blocks start as soon as any compute unit is free
  batch,   ///< the launch starts only when every block can run at once
};

/// How to run one launch. Every field a backend cannot honour makes the launch fail with
/// errc::invalid_launch_config or errc::not_supported; nothing is silently ignored.
struct launch_config {
  dim3 grid = 1;                          ///< blocks (CANN's numBlocks is grid.x)
  dim3 block = 1;                         ///< threads per block (1 on the CPU device)
  std::uint32_t shared_bytes = 0;         ///< dynamic shared memory per block
  schedule_mode schedule = schedule_mode::normal;
  std::chrono::microseconds timeout{0};   ///< fail the launch past this long; 0 = no limit
  bool cooperative = false;               ///< all blocks co-resident (grid-wide sync allowed)
  std::optional<dim3> cluster{};          ///< thread-block cluster dims (CUDA, sm_90)
  std::optional<int> priority{};          ///< launch priority, where the backend has one
};

/// One placeholder of a host argument block: the 8-byte slot at `addr_offset` receives the
/// device address of a copy of the data that starts at `data_offset` and runs to the next
/// placeholder's data (or the block's end). Same layout as CANN's aclrtPlaceHolderInfo.
struct placeholder_info {
  std::uint32_t addr_offset;
  std::uint32_t data_offset;
};

}  // namespace cora
