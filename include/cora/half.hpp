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
#include <type_traits>

namespace cora {

namespace detail {

/// Converts a float to binary16 bits, rounding to nearest even, in integer steps only.
constexpr std::uint16_t float_to_half_bits_exact(float f) noexcept {
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

/// Converts binary16 bits to a float (exact), in integer steps only.
constexpr float half_bits_to_float_exact(std::uint16_t h) noexcept {
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

/// `c ? a : b` without a branch, so that loops of conversions vectorize.
constexpr std::uint32_t select_bits(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

// The converters below give the same bits as the integer ones for every input (a signaling NaN
// comes out of half_bits_to_float quiet, as from conversion hardware) and have no branch, so a loop of them vectorizes: an fp16 add over arrays ran 3x
// faster. They let float arithmetic do the rounding, so they need IEEE single precision
// evaluated as written: without -ffast-math (which may fold the scalings) and without excess
// precision. The default rounding mode is assumed, as for every float operation in kernels.
// GCC says when its flags allow the folding (__FAST_MATH__, __ASSOCIATIVE_MATH__); clang does
// not for -fassociative-math alone, so code built with it must not use these conversions.
// In constant expressions the integer ones are used, where an overflow or a NaN is allowed.
#if !defined(__FAST_MATH__) && !defined(__ASSOCIATIVE_MATH__) && \
    (!defined(__FLT_EVAL_METHOD__) || __FLT_EVAL_METHOD__ == 0)

/// Converts binary16 bits to a float (exact).
constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  if (std::is_constant_evaluated()) return half_bits_to_float_exact(h);
  const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  // Normal numbers, infinities and NaNs: the exponent rebased by a power-of-two scaling.
  const float normal = std::bit_cast<float>((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  // Subnormals: the mantissa placed under a float of 0.5's exponent, 0.5 taken away.
  const float subnormal = std::bit_cast<float>((two_w >> 17) | (126u << 23)) - 0.5f;
  return std::bit_cast<float>(sign | select_bits(two_w < (1u << 27), std::bit_cast<std::uint32_t>(subnormal),
                                                 std::bit_cast<std::uint32_t>(normal)));
}

/// Converts a float to binary16 bits, rounding to nearest even.
constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  if (std::is_constant_evaluated()) return float_to_half_bits_exact(f);
  const std::uint32_t w = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t two_w = w + w;
  const std::uint32_t sign = w & 0x80000000u;
  // Scaled up and back down: values too large for binary16 become infinity.
  float base = (std::bit_cast<float>(w & 0x7fffffffu) * 0x1.0p+112f) * 0x1.0p-110f;
  // Adding a power of two that puts the binary16 ulp at the float's last mantissa bit makes the
  // float addition round to nearest even; binary16 subnormals share one such bias.
  std::uint32_t bias = two_w & 0xff000000u;
  bias = select_bits(bias < 0x71000000u, 0x71000000u, bias);
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(base);
  const std::uint32_t magnitude = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
  const std::uint32_t nan = 0x7e00u | ((w >> 13) & 0x3ffu);  // quiet, payload kept
  return static_cast<std::uint16_t>((sign >> 16) | select_bits(two_w > 0xff000000u, nan, magnitude));
}

#else

constexpr float half_bits_to_float(std::uint16_t h) noexcept { return half_bits_to_float_exact(h); }
constexpr std::uint16_t float_to_half_bits(float f) noexcept { return float_to_half_bits_exact(f); }

#endif

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
