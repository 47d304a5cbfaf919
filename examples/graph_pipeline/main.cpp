// A copy -> launch -> copy pipeline captured once and replayed as one awaitable op: each round
// writes new input into pinned host memory (a graph's copy reads its source when it runs),
// changes the kernel's scale factor with set_launch_args, and awaits one replay.
#include <cstdio>
#include <stdexcept>
#include <string>

#include <cora/cora.hpp>

cora::task<void> run(cora::device& dev, const char* kernels_path) {
  constexpr std::size_t n = 1 << 14;
  constexpr int rounds = 200;
  cora::binary bin = co_await dev.load_binary(kernels_path);
  cora::kernel scale = bin.kernel("scale_7");  // x[i] *= factor
  cora::stream s = dev.make_stream();
  auto x = dev.alloc<float>(n);
  auto in = dev.alloc_host<float>(n), out = dev.alloc_host<float>(n);

  // Capture: the ops are checked and recorded, nothing runs. Node i is the i-th op.
  cora::graph g = co_await s.capture([&](cora::stream& cs) {
    (void)cs.copy(x, in);
    (void)cs.launch(scale, {.grid = 8}, x, 1.0f, std::uint64_t{n});
    (void)cs.copy(out, x);
  });
  const cora::graph_node launch = g.node(1);
  cora::graph_exec exec = g.instantiate();

  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 1000 + r);
    const float factor = static_cast<float>(r % 5 + 1);
    exec.set_launch_args(launch, x, factor, std::uint64_t{n});  // checked like a launch
    co_await exec.launch(s);                                     // the whole pipeline, one op
    for (std::size_t i = 0; i < n; ++i)
      if (out[i] != in[i] * factor) throw std::runtime_error("wrong result in round " + std::to_string(r));
  }
  std::printf("%d replays of a 3-op graph on %s\n[SUCCESS] result correct\n", rounds, dev.name().c_str());
}

int main(int argc, char** argv) {
  const char* kernels = argc > 1 ? argv[1] : CORA_EXAMPLE_KERNELS_DIR "/test_kernels.corabin";
  try {
    cora::runtime rt;
    cora::sync_wait(run(rt.default_device(), kernels));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
