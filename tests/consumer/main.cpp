// Negates a vector on the default device and checks it.
#include <cstdio>

#include <cora/cora.hpp>

cora::task<int> run(cora::device& dev) {
  auto bin = co_await dev.load_binary(CONSUMER_KERNELS);
  auto s = dev.make_stream();
  const std::size_t n = 1000;
  auto h = dev.alloc_host<std::int32_t>(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<std::int32_t>(i);
  auto d = dev.alloc<std::int32_t>(n);
  s.copy(d, h);
  s.launch(bin.kernel("negate_i32"), {.grid = 4}, d, std::uint64_t{n});
  co_await s.copy(h, d);
  for (std::size_t i = 0; i < n; ++i)
    if (h[i] != -static_cast<std::int32_t>(i)) co_return 1;
  co_return 0;
}

int main() {
  cora::runtime rt;
  const int rc = cora::sync_wait(run(rt.default_device()));
  std::printf("consumer: %s on %s\n", rc == 0 ? "ok" : "WRONG RESULT", rt.default_device().name().c_str());
  return rc;
}
