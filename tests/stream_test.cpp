#include "cora/stream.hpp"

#include <numeric>
#include <vector>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

class stream_test : public device_test {};
CORA_DEVICE_SUITE(stream_test);

TEST_P(stream_test, CopiesRoundTripThroughDeviceMemory) {
  auto s = dev().make_stream();
  const std::size_t n = 100000;
  auto h = dev().alloc_host<std::uint32_t>(n);
  auto back = dev().alloc_host<std::uint32_t>(n);
  std::iota(h.begin(), h.end(), 7u);
  auto d = dev().alloc<std::uint32_t>(n);
  s.copy(d, h);
  s.copy(back, d).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], i + 7);
}

TEST_P(stream_test, TypedLaunchComputesOnTheDevice) {
  auto s = dev().make_stream();
  const std::size_t n = 1 << 16;
  auto x = dev().alloc<float>(n), y = dev().alloc<float>(n), z = dev().alloc<float>(n);
  auto hx = dev().alloc_host<float>(n), hz = dev().alloc_host<float>(n);
  for (std::size_t i = 0; i < n; ++i) hx[i] = static_cast<float>(i);
  s.copy(x, hx);
  s.copy(y, hx);
  s.launch(kernels().kernel("add_f32"), {.grid = 16}, x, y, z, std::uint64_t{n});
  s.copy(hz, z).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hz[i], 2.0f * static_cast<float>(i));
}

}  // namespace
}  // namespace cora::test
