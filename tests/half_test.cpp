#include "cora/half.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace cora {
namespace {

TEST(half, EveryFiniteValueRoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const half h = half::from_bits(static_cast<std::uint16_t>(b));
    const float f = h;
    if (std::isnan(f)) continue;
    EXPECT_EQ(half(f).bits, h.bits) << std::hex << b;
  }
}

// The branch-free converters against the integer ones: every binary16 value to float, and to
// binary16 every value of a binary16, the ties halfway to its neighbour and one float ulp either
// side of them, the range around the overflow to infinity, NaNs, and pseudo-random floats.
TEST(half, BranchFreeConversionsGiveTheSameBitsAsTheIntegerOnes) {
  auto bits_of = [](float f) { return std::bit_cast<std::uint32_t>(f); };
  auto float_of = [](std::uint32_t b) { return std::bit_cast<float>(b); };
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    std::uint32_t expected = bits_of(detail::half_bits_to_float_exact(h));
    if ((b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0) expected |= 0x00400000u;  // NaNs come out quiet
    ASSERT_EQ(bits_of(detail::half_bits_to_float(h)), expected) << std::hex << b;
  }
  long checked = 0;
  auto check = [&](float f) {
    ++checked;
    ASSERT_EQ(detail::float_to_half_bits(f), detail::float_to_half_bits_exact(f)) << std::hex << bits_of(f);
  };
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float f = detail::half_bits_to_float_exact(static_cast<std::uint16_t>(b));
    check(f);
    if ((b & 0x7fffu) >= 0x7bffu) continue;  // the largest finite value, infinities, NaNs
    const float next = detail::half_bits_to_float_exact(static_cast<std::uint16_t>(b + 1));
    const float tie = (f + next) / 2;  // exact: floats have 13 more mantissa bits
    for (float g : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 2 * tie), std::nextafter(f, next)}) check(g);
  }
  for (std::uint32_t b = bits_of(65504.0f); b <= bits_of(65536.0f); ++b) {
    check(float_of(b));
    check(-float_of(b));
  }
  for (std::uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7fffffffu, 0x00000001u, 0x80000001u})
    check(float_of(b));
  std::uint64_t x = 0x9e3779b97f4a7c15u;
  for (int i = 0; i < (1 << 20); ++i) {
    x = x * 6364136223846793005u + 1442695040888963407u;
    check(float_of(static_cast<std::uint32_t>(x >> 32)));
  }
  EXPECT_GT(checked, 1 << 20);
}

// Constant expressions convert overflows and NaNs too (through the integer conversions).
TEST(half, ConstantExpressionsConvertOverflowsAndNaNs) {
  constexpr half big(1e6f);
  static_assert(big.bits == 0x7c00);
  constexpr half nan(std::numeric_limits<float>::quiet_NaN());
  static_assert((nan.bits & 0x7e00) == 0x7e00);
  constexpr float from_nan = half::from_bits(0x7c01);
  EXPECT_TRUE(std::isnan(from_nan));
  constexpr float one = half::from_bits(0x3c00);
  static_assert(one == 1.0f);
}

TEST(half, KnownValues) {
  EXPECT_EQ(half(1.0f).bits, 0x3c00);
  EXPECT_EQ(half(-2.0f).bits, 0xc000);
  EXPECT_EQ(half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(half(65520.0f).bits, 0x7c00);   // rounds to infinity
  EXPECT_EQ(half(5.96046448e-8f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(half(2.98023224e-8f).bits, 0x0000);  // halfway to zero: ties to even
  EXPECT_TRUE(std::isnan(float(half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(half, RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties to the even mantissa (1).
  EXPECT_EQ(half(1.0f + 0.00048828125f).bits, 0x3c00);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: ties to even (1 + 2^-9).
  EXPECT_EQ(half(1.0f + 3 * 0.00048828125f).bits, 0x3c02);
}

TEST(half, ArithmeticRoundsOnce) {
  EXPECT_EQ(float(half(1.5f) + half(2.25f)), 3.75f);
  EXPECT_EQ(float(half(100.0f) * half(100.0f)), 10000.0f);
}

}  // namespace
}  // namespace cora
