#include "cora/kernel_library.hpp"

#include <vector>

#include "support/device_fixture.hpp"
#include "test_mixed_kernels.hpp"

namespace cora::test {
namespace {

class kernel_library_test : public device_test {};
CORA_DEVICE_SUITE(kernel_library_test);

TEST_P(kernel_library_test, LaunchesBySymbolWithTypedArguments) {
  auto s = dev().make_stream();
  const std::size_t n = 1000;
  auto x = dev().alloc<float>(n), y = dev().alloc<float>(n);
  std::vector<float> hx(n, 2.0f), hy(n, 1.0f);
  (void)s.copy(x.data(), hx.data(), n * 4);
  (void)s.copy(y.data(), hy.data(), n * 4);
  auto t = [&]() -> task<void> {
    co_await test_mixed_kernels::axpy(s, {.grid = 4}, 3.0f, x, y, std::uint64_t{n});
    co_await s.copy(hy.data(), y.data(), n * 4);
  };
  sync_wait(t());
  for (float v : hy) ASSERT_EQ(v, 7.0f);
}

TEST_P(kernel_library_test, UntypedPointersTakeAnyBuffer) {
  auto s = dev().make_stream();
  auto out = dev().alloc<std::uint32_t>(1);
  test_mixed_kernels::count_blocks_3(s, {.grid = 5}, out).wait();
  std::uint32_t h = 0;
  s.copy(&h, out.data(), 4).wait();
  EXPECT_EQ(h, 5u);
}

TEST_P(kernel_library_test, LoadsOncePerDeviceAndKeepsEntryKeys) {
  auto& lib = test_mixed_kernels::library();
  auto k = lib.kernel(dev(), "count_blocks_3");
  EXPECT_EQ(k.entry_key(), std::optional<std::uint64_t>(3));
  auto s = dev().make_stream();
  EXPECT_EQ(lib.kernel(s, 1).state(), lib.kernel(s, 1).state());
}

TEST(kernel_library, LaunchersAreRegisteredAsSymbols) {
  auto sym = find_kernel_symbol(reinterpret_cast<const void*>(&test_mixed_kernels::axpy));
  ASSERT_NE(sym.library, nullptr);
  EXPECT_EQ(sym.library->kernel_names()[sym.index], "axpy");
  EXPECT_EQ(find_kernel_symbol(&sym).library, nullptr);
}

}  // namespace
}  // namespace cora::test
