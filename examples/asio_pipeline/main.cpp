// cora inside plain Asio: pipelines as asio::awaitable coroutines on an io_context run by
// several threads, and a steady timer racing a slow kernel with awaitable_operators: the timer
// wins, the wait is cancelled, the kernel finishes anyway.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include <cora/cora.hpp>

using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;

asio::awaitable<void> pipeline(cora::device& dev, cora::kernel add, int rounds, std::atomic<int>& ok) {
  const std::size_t n = 4096;
  cora::stream s = dev.make_stream();
  auto x = dev.alloc<float>(n), z = dev.alloc<float>(n);
  auto h = dev.alloc_host<float>(n);
  for (int r = 0; r < rounds; ++r) {
    std::fill(h.begin(), h.end(), static_cast<float>(r));
    (void)s.copy(x, h);
    (void)s.launch(add, {.grid = 4}, x, x, z, std::uint64_t{n});
    co_await s.copy(h, z).async_wait(asio::use_awaitable);  // any Asio token works
    if (h[0] == 2.0f * r && h[n - 1] == 2.0f * r) ++ok;
  }
}

asio::awaitable<void> race(cora::device& dev, cora::kernel slow) {
  auto ex = co_await asio::this_coro::executor;
  cora::stream s = dev.make_stream();
  auto flag = dev.alloc<std::uint32_t>(1);
  (void)s.fill(flag, 0);
  asio::steady_timer timer(ex, 20ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto result = co_await (s.launch(slow, {}, std::uint64_t{300000}, flag).async_wait(asio::use_awaitable) ||
                          timer.async_wait(asio::use_awaitable));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  std::printf("race: %s won after %lld ms\n", result.index() == 1 ? "the timer" : "the kernel",
              static_cast<long long>(ms.count()));
  co_await s.synchronize().async_wait(asio::use_awaitable);  // the kernel ran on and finished
  std::uint32_t done = 0;
  co_await s.copy(&done, flag.data(), sizeof(done)).async_wait(asio::use_awaitable);
  std::printf("race: the slow kernel %s\n", done ? "completed anyway" : "did not complete");
  if (result.index() != 1 || !done) throw std::runtime_error("unexpected race result");
}

int main(int argc, char** argv) {
  const char* kernels = argc > 1 ? argv[1] : CORA_EXAMPLE_KERNELS_DIR "/test_kernels.corabin";
  try {
    cora::runtime rt;
    cora::device& dev = rt.default_device();
    cora::binary bin = dev.load_binary(kernels).wait();
    asio::io_context ctx;
    std::atomic<int> ok{0};
    const int pipelines = 16, rounds = 20;
    for (int i = 0; i < pipelines; ++i)
      asio::co_spawn(ctx, pipeline(dev, bin.kernel("add_f32"), rounds, ok), asio::detached);
    std::exception_ptr race_error;
    asio::co_spawn(ctx, race(dev, bin.kernel("slow")), [&](std::exception_ptr e) { race_error = e; });
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) threads.emplace_back([&] { ctx.run(); });
    ctx.run();
    for (auto& t : threads) t.join();
    if (race_error) std::rethrow_exception(race_error);
    std::printf("%d of %d pipeline rounds correct on %s\n", ok.load(), pipelines * rounds, dev.name().c_str());
    return ok == pipelines * rounds ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
