#include "cora/error.hpp"

#include <gtest/gtest.h>

namespace cora {
namespace {

TEST(error, CategoryNamesEveryCode) {
  EXPECT_STREQ(error_category().name(), "cora");
  for (int e = static_cast<int>(errc::invalid_argument); e <= static_cast<int>(errc::aborted); ++e)
    EXPECT_NE(error_category().message(e), "unknown cora error") << e;
  EXPECT_EQ(error_category().message(9999), "unknown cora error");
}

TEST(error, ErrcConvertsToErrorCode) {
  std::error_code ec = errc::kernel_fault;
  EXPECT_EQ(ec.category(), error_category());
  EXPECT_EQ(ec.message(), "kernel fault");
}

TEST(error, ExceptionCarriesCodeAndDetail) {
  const error e(errc::kernel_not_found, "no kernel named 'x'");
  EXPECT_EQ(e.code(), make_error_code(errc::kernel_not_found));
  EXPECT_NE(std::string(e.what()).find("no kernel named 'x'"), std::string::npos);
  const std::system_error& base = e;
  EXPECT_EQ(base.code(), make_error_code(errc::kernel_not_found));
}

}  // namespace
}  // namespace cora
