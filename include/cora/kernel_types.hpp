// Types shared by kernel signatures and host code: gm_addr and half.
#pragma once

#include <cstdint>

#include "cora/half.hpp"

namespace cora {

/// CANN's GM_ADDR: an untyped pointer into device (global) memory.
using gm_addr = std::uint8_t*;

}  // namespace cora
