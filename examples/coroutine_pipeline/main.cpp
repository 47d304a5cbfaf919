// Several copy -> launch -> copy pipelines in flight at once, each a cora::task on its own
// stream, all driven by sync_wait on the calling thread.
#include <cstdio>
#include <numeric>
#include <vector>

#include <cora/cora.hpp>

cora::task<double> pipeline(cora::device& dev, const cora::kernel& add, int id, std::size_t n, int rounds) {
  cora::stream s = dev.make_stream();
  auto x = dev.alloc<float>(n), y = dev.alloc<float>(n), z = dev.alloc<float>(n);
  auto hx = dev.alloc_host<float>(n), hz = dev.alloc_host<float>(n);
  double checksum = 0;
  for (int r = 0; r < rounds; ++r) {
    std::iota(hx.begin(), hx.end(), static_cast<float>(id * 1000 + r));
    (void)s.copy(x, hx);                          // enqueued, not awaited
    (void)s.copy(y, hx);
    (void)s.launch(add, {.grid = 8}, x, y, z, std::uint64_t{n});
    co_await s.copy(hz, z);                 // resumes once the result is back on the host
    for (std::size_t i = 0; i < n; ++i)
      if (hz[i] != 2 * hx[i]) throw std::runtime_error("wrong result in pipeline " + std::to_string(id));
    checksum += hz[n - 1];
  }
  co_return checksum;
}

cora::task<void> run_all(cora::device& dev, const char* kernels_path) {
  cora::binary bin = co_await dev.load_binary(kernels_path);
  cora::kernel add = bin.kernel("add_f32");
  std::vector<cora::task<double>> pipelines;
  for (int id = 0; id < 8; ++id) pipelines.push_back(pipeline(dev, add, id, 1 << 14, 50));
  std::vector<double> sums = co_await cora::when_all(std::move(pipelines));
  std::printf("8 pipelines x 50 rounds done on %s, checksum %.0f\n", dev.name().c_str(),
              std::accumulate(sums.begin(), sums.end(), 0.0));
}

int main(int argc, char** argv) {
  const char* kernels = argc > 1 ? argv[1] : CORA_EXAMPLE_KERNELS_DIR "/test_kernels.corabin";
  try {
    cora::runtime rt;
    cora::sync_wait(run_all(rt.default_device(), kernels));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
