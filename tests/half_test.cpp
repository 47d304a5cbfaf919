#include "cora/half.hpp"

#include <gtest/gtest.h>

#include <cmath>
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
