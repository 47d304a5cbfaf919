// The steady state of an awaited pipeline allocates nothing (DESIGN section 4, rule 10): a
// counting operator new sees every heap allocation of every thread of the process (callers,
// pollers, the engine thread, the device's workers) while warm pipelines run.
#include <execinfo.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "cora/cora.hpp"
#include "support/device_fixture.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<std::size_t> allocations{0};
// CORA_ALLOC_TRACE=N prints the call stacks of the first N counted allocations.
std::atomic<int> traces_left{0};

void* counted(std::size_t n, std::size_t align) {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    if (traces_left.fetch_sub(1, std::memory_order_relaxed) > 0) {
      counting.store(false, std::memory_order_relaxed);  // backtrace() may allocate
      void* frames[24];
      const int depth = ::backtrace(frames, 24);
      std::fprintf(stderr, "allocation of %zu bytes:\n", n);
      ::backtrace_symbols_fd(frames, depth, 2);
      counting.store(true, std::memory_order_relaxed);
    }
  }
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace cora::test {
namespace {

TEST(alloc_count, WarmAwaitedPipelinesAllocateNothingOnTheCpuDevice) {
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  // Spin: the waits complete on the caller's context, whatever the load of the machine. Under
  // the hybrid policy a wait that parks is handed back by the engine thread through
  // asio::post on an any_io_executor, which heap-allocates each post made off the context's
  // own threads: that hand-back is not allocation-free yet.
  o.completion = completion_policy::spin;
  o.cpu_compute_units = 2;
  runtime rt(o);
  auto& dev = rt.device(0);
  auto bin = dev.load_binary(kernel_file("test_kernels.corabin")).wait();
  const kernel add = bin.kernel("add_f32");
  constexpr std::size_t n = 256;
  auto x = dev.alloc<float>(n), y = dev.alloc<float>(n), z = dev.alloc<float>(n);
  auto hx = dev.alloc_host<float>(n), hz = dev.alloc_host<float>(n);
  for (std::size_t i = 0; i < n; ++i) hx[i] = static_cast<float>(i);
  auto s = dev.make_stream();

  // One copy-launch-copy pipeline: the first two ops enqueued, the last one awaited.
  auto pipelines = [&](int count) -> task<void> {
    for (int i = 0; i < count; ++i) {
      (void)s.copy(x, hx);
      (void)s.launch(add, {.grid = 2}, x, x, z, std::uint64_t{n});
      co_await s.copy(hz, z);
    }
  };
  asio::io_context ctx(1);
  auto run = [&](int count) {
    spawn(ctx, pipelines(count), asio::detached);
    ctx.restart();
    ctx.run();
  };
  run(2000);  // warm-up: pools, rings and caches reach their steady size
  ASSERT_EQ(hz[5], 10.0f);
  if (const char* t = std::getenv("CORA_ALLOC_TRACE")) traces_left = std::atoi(t);
  // The spawn itself (a task frame, its owner) is not the steady state: started before counting.
  spawn(ctx, pipelines(1000), asio::detached);
  ctx.restart();
  allocations = 0;
  counting = true;
  ctx.run();
  counting = false;
  EXPECT_EQ(allocations.load(), 0u) << "heap allocations in 1000 warm pipelines (" << 3000
                                    << " ops); CORA_ALLOC_TRACE=N prints where";
  EXPECT_EQ(hz[7], 14.0f);
}

}  // namespace
}  // namespace cora::test
