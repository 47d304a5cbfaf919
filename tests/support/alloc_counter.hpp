// Test support: counts the program's heap allocations (operator new), for tests that check
// that a path allocates nothing once warm. Link support/alloc_counter.cpp into the test.
#pragma once

#include <cstdint>

namespace cora::test {

/// operator new calls so far on the calling thread.
std::uint64_t heap_allocations() noexcept;
/// False where allocations cannot be counted (under ThreadSanitizer).
bool heap_counting() noexcept;

}  // namespace cora::test
