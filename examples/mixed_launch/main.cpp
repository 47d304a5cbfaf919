// Mixed mode: the seed's add kernel is built into this program by cora_add_kernel_library and
// launched by symbol, like CANN's add_custom<<<8, nullptr, stream>>>(x, y, z) but awaitable.
#include <cstdio>
#include <random>
#include <vector>

#include <cora/cora.hpp>

#include "mixed_kernels.hpp"  // generated: mixed_kernels::add_custom(stream, config, x, y, z)

cora::task<std::size_t> run(cora::device& dev) {
  constexpr std::size_t n = 8 * 2048;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(1.0f, 100.0f);
  auto hx = dev.alloc_host<cora::half>(n), hy = dev.alloc_host<cora::half>(n), hz = dev.alloc_host<cora::half>(n);
  for (std::size_t i = 0; i < n; ++i) {
    hx[i] = cora::half(dist(rng));
    hy[i] = cora::half(dist(rng));
  }
  auto x = dev.alloc<cora::half>(n), y = dev.alloc<cora::half>(n), z = dev.alloc<cora::half>(n);
  cora::stream s = dev.make_stream();
  (void)s.copy(x, hx);
  (void)s.copy(y, hy);
  co_await mixed_kernels::add_custom(s, {.grid = 8}, x, y, z);  // typed launcher, no load call
  co_await s.copy(hz, z);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (hz[i].bits != cora::half(float(hx[i]) + float(hy[i])).bits) ++wrong;
  co_return wrong;
}

int main() {
  try {
    cora::runtime rt;
    const std::size_t wrong = cora::sync_wait(run(rt.default_device()));
    std::printf("mixed_launch on %s: %zu wrong of %d\n", rt.default_device().name().c_str(), wrong, 8 * 2048);
    std::printf(wrong == 0 ? "[SUCCESS] result correct\n" : "[FAILURE] result error\n");
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
