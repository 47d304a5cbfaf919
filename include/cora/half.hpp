// cora::half: IEEE 754 binary16, usable in host code and in kernels of the portable dialect.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
namespace cora {
/// Half-precision float. In CUDA code this is CUDA's own `__half`.
using half = __half;
}  // namespace cora
#else
#include <bit>
#include <cstring>

namespace cora {

namespace detail {

/// Converts a float to binary16 bits, rounding to nearest even.
constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu)  // inf or NaN (NaN stays quiet)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
  return static_cast<std::uint16_t>(h);
}

/// Converts binary16 bits to a float (exact).
constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    std::uint32_t k = 0;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      ++k;
    }
    return std::bit_cast<float>(sign | ((113u - k) << 23) | ((mant & 0x3ffu) << 13));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace detail

/// Half-precision float for host code and CPU kernels: arithmetic is done in float and
/// rounded once, which gives the same results as IEEE fp16 hardware for + - * /.
struct half {
  std::uint16_t bits;

  half() = default;
  constexpr half(float f) noexcept : bits(detail::float_to_half_bits(f)) {}  // NOLINT
  constexpr operator float() const noexcept { return detail::half_bits_to_float(bits); }  // NOLINT

  /// The value with the given bit pattern.
  static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }

  friend constexpr half operator+(half a, half b) noexcept { return half(float(a) + float(b)); }
  friend constexpr half operator-(half a, half b) noexcept { return half(float(a) - float(b)); }
  friend constexpr half operator*(half a, half b) noexcept { return half(float(a) * float(b)); }
  friend constexpr half operator/(half a, half b) noexcept { return half(float(a) / float(b)); }
  constexpr half& operator+=(half o) noexcept { return *this = *this + o; }
  constexpr half& operator-=(half o) noexcept { return *this = *this - o; }
  constexpr half& operator*=(half o) noexcept { return *this = *this * o; }
  constexpr half& operator/=(half o) noexcept { return *this = *this / o; }
};

static_assert(sizeof(half) == 2);

}  // namespace cora
#endif
