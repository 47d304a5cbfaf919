// Size arithmetic that cannot wrap: element counts to bytes, sums of sizes. Every size a caller
// passes in (counts, offsets, byte sizes) goes through these before it is used, so that an
// overflow is an error (errc::invalid_argument) instead of a small allocation or copy.
#pragma once

#include <cstddef>
#include <string>
#include <system_error>

#include "cora/error.hpp"

namespace cora::detail {

/// a + b, or false when the sum does not fit in a size_t.
constexpr bool checked_add(std::size_t a, std::size_t b, std::size_t& out) noexcept {
  return !__builtin_add_overflow(a, b, &out);
}

/// a * b, or false when the product does not fit in a size_t.
constexpr bool checked_mul(std::size_t a, std::size_t b, std::size_t& out) noexcept {
  return !__builtin_mul_overflow(a, b, &out);
}

/// `n` elements of T in bytes; on overflow, 0 and `ec` = errc::invalid_argument.
template <class T>
constexpr std::size_t checked_bytes(std::size_t n, std::error_code& ec) noexcept {
  std::size_t bytes = 0;
  if (!checked_mul(n, sizeof(T), bytes)) {
    ec = make_error_code(errc::invalid_argument);
    return 0;
  }
  ec.clear();
  return bytes;
}

/// `n` elements of T in bytes. @throws cora::error (errc::invalid_argument) on overflow.
template <class T>
std::size_t checked_bytes(std::size_t n) {
  std::error_code ec;
  const std::size_t bytes = checked_bytes<T>(n, ec);
  if (ec)
    throw error(errc::invalid_argument, std::to_string(n) + " elements of " +
                                            std::to_string(sizeof(T)) +
                                            " bytes do not fit in the address space");
  return bytes;
}

}  // namespace cora::detail
