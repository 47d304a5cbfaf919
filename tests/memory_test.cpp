// Memory and resources never make a caller wait for the device, and never hand memory that
// in-flight work still uses to someone else (DESIGN rule 7).
#include "cora/memory.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_memory.hpp"
#include "core/state.hpp"
#include "support/alloc_counter.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

using namespace std::chrono_literals;

// Each test has a runtime of its own: memory counts that no other test's late frees (its work
// still draining) can move.
class memory_test : public device_test {
 protected:
  void SetUp() override {
    device_test::SetUp();
    if (IsSkipped()) return;
    own_ = own_runtime();
  }
  void TearDown() override {
    kernels_ = cora::binary();
    own_.reset();
  }
  cora::device& dev() { return own_->device(0); }
  cora::binary& kernels() {
    if (!kernels_) kernels_ = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
    return kernels_;
  }

  // A kernel that holds its stream until release(): `done` stays 0 while it spins. The
  // flags are pinned host memory the kernel reads and writes directly.
  struct spinner {
    host_buffer<std::uint32_t> go, done;
    cora::stream stream;
    pending<void> run;
    void release() { __atomic_store_n(&go[0], 1u, __ATOMIC_RELEASE); }
    std::uint32_t state() const { return __atomic_load_n(&done[0], __ATOMIC_ACQUIRE); }
  };
  std::unique_ptr<runtime> own_runtime(runtime_options o = {}) {
    o.use_environment = false;
    o.backend = GetParam() == backend::cpu ? backend_selection::cpu : backend_selection::cuda;
    return std::make_unique<runtime>(o);
  }
  spinner spin() {
    spinner sp;
    sp.go = dev().alloc_host<std::uint32_t>(1);
    sp.done = dev().alloc_host<std::uint32_t>(1);
    sp.go[0] = 0;
    sp.done[0] = 0;
    sp.stream = dev().make_stream();
    // 20 s at most: a test that fails to release it still ends.
    sp.run = sp.stream.launch(kernels().kernel("spin_until_set"), {}, sp.go.data(), sp.done.data(),
                              std::uint64_t{20'000'000});
    return sp;
  }
  std::unique_ptr<runtime> own_;
  cora::binary kernels_;
};
CORA_DEVICE_SUITE(memory_test);

// Each call is made on the thread that launched a kernel that spins until told to stop; the
// kernel's done flag, still 0 afterwards, shows that no call waited for it.
TEST_P(memory_test, NoResourceCallWaitsForAnUnrelatedKernel) {
  auto unused = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  auto other = dev().make_stream();
  auto sp = spin();

  {
    auto d = dev().alloc<float>(1 << 20);
    EXPECT_NE(d.data(), nullptr);
  }  // dropping it
  {
    auto h = dev().alloc_host<float>(1 << 18);
    h[0] = 1;
  }
  void* raw = dev().malloc(4096);
  dev().free(raw);
  void* raw_host = dev().malloc_host(4096);
  dev().free_host(raw_host);
  {
    auto s = dev().make_stream();
    auto e = dev().make_event();
  }  // stream and event destroyed
  unused = cora::binary();  // the last handle of a binary no launch uses
  {
    // A small copy that brings its own buffers, on another stream, waited for.
    auto h = dev().alloc_host<std::uint8_t>(4096);
    auto d = dev().alloc<std::uint8_t>(4096);
    for (std::size_t i = 0; i < 4096; ++i) h[i] = static_cast<std::uint8_t>(i);
    (void)other.copy(d, h);
    auto back = dev().alloc_host<std::uint8_t>(4096);
    other.copy(back, d).wait();
    EXPECT_EQ(back[4095], static_cast<std::uint8_t>(4095));
  }
  (void)dev().memory_stats();
  dev().trim_memory();

  EXPECT_EQ(sp.state(), 0u) << "a call waited for the spinning kernel";
  sp.release();
  sp.run.wait();
  EXPECT_EQ(sp.state(), 1u);
}

// The driver's module load waits for the device's running kernels: load_binary hands it to a
// cora thread, so the call returns while an unrelated kernel spins, and its binary comes once
// the driver lets the load through.
TEST_P(memory_test, LoadBinaryReturnsWhileAKernelRuns) {
  std::vector<std::byte> bytes;
  {
    std::ifstream in(kernel_file("test_kernels.corabin"), std::ios::binary);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.resize(c.size());
    std::memcpy(bytes.data(), c.data(), c.size());
  }
  ASSERT_FALSE(bytes.empty());
  auto sp = spin();
  auto from_memory = dev().load_binary(std::span<const std::byte>(bytes));
  auto from_file = dev().load_binary(kernel_file("test_kernels.corabin"));
  EXPECT_EQ(sp.state(), 0u) << "load_binary waited for the spinning kernel";
  // Copies on another stream over a spread of time: a load that holds the driver meanwhile
  // would hold them too.
  auto other = dev().make_stream();
  auto h = dev().alloc_host<std::uint8_t>(4096);
  auto d = dev().alloc<std::uint8_t>(4096);
  for (int i = 0; i < 200; ++i) {
    h[0] = static_cast<std::uint8_t>(i);
    (void)other.copy(d, h);
    other.copy(h, d).wait();
    ASSERT_EQ(h[0], static_cast<std::uint8_t>(i));
  }
  EXPECT_EQ(sp.state(), 0u) << "a copy waited behind a load";
  sp.release();
  sp.run.wait();
  EXPECT_EQ(sp.state(), 1u);
  EXPECT_TRUE(static_cast<bool>(from_memory.wait().kernel("add_f32")));
  EXPECT_TRUE(static_cast<bool>(from_file.wait().kernel("add_f32")));
}

// A kernel's first lookup resolves it in the driver (its code, parameters and attributes); a
// lookup made while an unrelated kernel spins does not wait for it.
TEST_P(memory_test, FirstLookupsDoNotWaitForAnUnrelatedKernel) {
  auto b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  auto sp = spin();
  for (const char* name : {"empty", "add_f32", "iota_u32"}) {
    EXPECT_TRUE(static_cast<bool>(b.kernel(name))) << name;
    EXPECT_EQ(sp.state(), 0u) << "the first lookup of " << name << " waited for the spinning kernel";
  }
  sp.release();
  sp.run.wait();
  EXPECT_EQ(sp.state(), 1u);
}

// device_state::run_when_idle, the gate of GPU loads (the CPU device does not need it, so it is
// called directly here): on an idle device it runs the call at once on the calling thread, with
// every stream's submission lock held.
TEST_P(memory_test, RunWhenIdleRunsHereOnAnIdleDevice) {
  auto s = dev().make_stream();
  s.synchronize().wait();
  const auto st = dev().state();
  bool ran = false, locked = false;
  const auto caller = std::this_thread::get_id();
  std::thread::id where;
  st->run_when_idle(
      [&] {
        ran = true;
        where = std::this_thread::get_id();
        locked = !s.state()->enqueue_mutex().try_lock();
        if (!locked) s.state()->enqueue_mutex().unlock();
      },
      true);
  EXPECT_TRUE(ran);
  EXPECT_EQ(where, caller);
  EXPECT_TRUE(locked) << "the stream's submission lock was free while the call ran";
}

// With a kernel in flight, the call waits for it (on no thread), then runs on a cora thread;
// the caller returns at once.
TEST_P(memory_test, RunWhenIdleWaitsForTheWorkInFlight) {
  auto sp = spin();
  const auto st = dev().state();
  // Shared with the call, which may outlive a failed test.
  struct seen {
    std::atomic<bool> ran{false};
    std::atomic<std::uint32_t> kernel_state{0};
    std::promise<std::thread::id> where;
  };
  auto seen_by_call = std::make_shared<seen>();
  auto where_f = seen_by_call->where.get_future();
  st->run_when_idle(
      [seen_by_call, done = sp.done.data()] {
        seen_by_call->kernel_state = __atomic_load_n(done, __ATOMIC_ACQUIRE);
        seen_by_call->ran = true;
        seen_by_call->where.set_value(std::this_thread::get_id());
      },
      true);
  EXPECT_FALSE(seen_by_call->ran.load()) << "the call ran while the kernel was in flight";
  EXPECT_EQ(sp.state(), 0u);
  sp.release();
  sp.run.wait();
  // A liveness bound only: the call follows the kernel's end.
  ASSERT_EQ(where_f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_NE(where_f.get(), std::this_thread::get_id());
  const std::uint32_t kernel_state_then = seen_by_call->kernel_state.load();
  EXPECT_EQ(kernel_state_then, 1u) << "the call ran before the kernel had finished";
}

// Asked for by a host function that then waits for it, the call does not wait for the host
// function's own stream (that wait would never end): it runs once the tries for an idle device
// give up.
TEST_P(memory_test, RunWhenIdleFromAHostFunctionThatWaitsForItEnds) {
  auto s = dev().make_stream();
  const auto st = dev().state();
  auto outcome = std::make_shared<std::atomic<int>>(0);  // 1 ran, 2 timed out
  s.host_func([st, outcome] {
     auto done = std::make_shared<std::promise<void>>();
     auto f = done->get_future();
     const auto* h = detail::host_func_scope::current();
     st->run_when_idle([done] { done->set_value(); }, true, h ? h->stream : nullptr);
     // A liveness bound only.
     *outcome = f.wait_for(std::chrono::seconds(20)) == std::future_status::ready ? 1 : 2;
   }).wait();
  EXPECT_EQ(outcome->load(), 1) << "the call waited for the host function that waits for it";
}

// Unloading a module waits for the device's running kernels, and on CUDA it holds other
// threads' copies and launches meanwhile. A binary dropped while a kernel runs must therefore
// not be unloaded then: copies made afterwards on another stream complete while the kernel
// still spins, and the module is unloaded once the device is idle.
TEST_P(memory_test, ADroppedBinaryIsNotUnloadedWhileAKernelRuns) {
  auto dropped = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  auto other = dev().make_stream();
  auto h = dev().alloc_host<std::uint8_t>(4096);
  auto d = dev().alloc<std::uint8_t>(4096);
  auto sp = spin();
  dropped = cora::binary();
  // Copies over a spread of time: an unload started on another thread meanwhile would hold one.
  for (int i = 0; i < 200; ++i) {
    h[0] = static_cast<std::uint8_t>(i);
    (void)other.copy(d, h);
    other.copy(h, d).wait();
    ASSERT_EQ(h[0], static_cast<std::uint8_t>(i));
  }
  EXPECT_EQ(sp.state(), 0u) << "a copy waited behind the dropped binary's unload";
  sp.release();
  sp.run.wait();
  // Then it goes: a liveness check (the bound only keeps a broken build from hanging).
  const auto st = dev().state();
  for (int i = 0; i < 20'000 && st->unloads_pending() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(st->unloads_pending(), 0u);
}

// A kernel writes a pattern into B at its end; B is dropped at once. Buffers allocated and
// filled while the kernel runs must never be B's memory, and the kernel's writes land.
TEST_P(memory_test, DroppedBufferIsNotReusedWhileAKernelStillWritesIt) {
  constexpr std::size_t n = 4096;
  constexpr std::uint32_t pattern = 0x5eed1234u;
  auto s = dev().make_stream();
  auto go = dev().alloc_host<std::uint32_t>(1);
  go[0] = 0;
  auto seen = dev().alloc_host<std::uint32_t>(n);
  auto b = dev().alloc<std::uint32_t>(n);
  const auto b_addr = reinterpret_cast<std::uintptr_t>(b.data());
  const auto in_use = dev().memory_in_use();
  auto k = s.launch(kernels().kernel("spin_then_fill"), {.block = 1}, go.data(), b, std::uint64_t{n},
                    pattern, std::uint64_t{20'000'000});
  auto copied = s.copy(seen, b);  // ordered after the kernel
  b.reset();
  // Still counted: the kernel and the copy hold it.
  EXPECT_EQ(dev().memory_in_use(), in_use);

  auto other = dev().make_stream();
  std::vector<device_buffer<std::uint32_t>> fresh;
  for (int i = 0; i < 16; ++i) {
    auto f = dev().alloc<std::uint32_t>(n);
    const auto a = reinterpret_cast<std::uintptr_t>(f.data());
    EXPECT_TRUE(a + n * 4 <= b_addr || a >= b_addr + n * 4) << "B's memory was handed out again";
    other.fill(f, 0).wait();
    if (i % 2) fresh.push_back(std::move(f));  // half kept, half dropped at once
  }
  __atomic_store_n(&go[0], 1u, __ATOMIC_RELEASE);
  k.wait();
  copied.wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], pattern) << "the kernel's write " << i;
  auto back = dev().alloc_host<std::uint32_t>(n);
  for (auto& f : fresh) {
    other.copy(back, f).wait();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 0u) << "a new buffer got the pattern";
  }
  s.synchronize().wait();
  other.synchronize().wait();
  EXPECT_EQ(dev().memory_in_use(), in_use - n * 4 + fresh.size() * n * 4);
}

// A typed launch on its own holds the memory its pointer arguments name, passed as a buffer
// or as a raw pointer (the two ways a typed launch finds the allocation): dropped while the
// kernel waits, it stays counted until the stream has seen the kernel end.
TEST_P(memory_test, ATypedLaunchAloneHoldsTheMemoryOfItsArguments) {
  constexpr std::size_t n = 4096;
  for (const bool raw : {false, true}) {
    SCOPED_TRACE(raw ? "raw pointer" : "buffer");
    auto s = dev().make_stream();
    auto go = dev().alloc_host<std::uint32_t>(1);
    go[0] = 0;
    auto b = dev().alloc<std::uint32_t>(n);
    const auto in_use = dev().memory_in_use();
    const auto k = kernels().kernel("spin_then_fill");
    auto launched = raw ? s.launch(k, {.block = 1}, go.data(), b.data(), std::uint64_t{n}, 7u,
                                   std::uint64_t{20'000'000})
                        : s.launch(k, {.block = 1}, go.data(), b, std::uint64_t{n}, 7u,
                                   std::uint64_t{20'000'000});
    b.reset();
    EXPECT_EQ(dev().memory_in_use(), in_use);  // the kernel is still waiting for `go`
    __atomic_store_n(&go[0], 1u, __ATOMIC_RELEASE);
    launched.wait();
    s.synchronize().wait();
    EXPECT_EQ(dev().memory_in_use(), in_use - n * 4);
  }
}

// The same through a coroutine whose wait loses a race against a timer: it returns, dropping
// its buffer, while the kernel runs on (rule 6).
TEST_P(memory_test, CancelledWaitDropsItsBufferSafely) {
  using namespace asio::experimental::awaitable_operators;
  constexpr std::size_t n = 4096;
  constexpr std::uint32_t pattern = 0xfeedf00du;
  auto s = dev().make_stream();
  auto go = dev().alloc_host<std::uint32_t>(1);
  go[0] = 0;
  std::uintptr_t b_addr = 0;
  pending<void> kernel_done;
  bool timer_won = false;
  asio::io_context ctx;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto b = dev().alloc<std::uint32_t>(n);
        b_addr = reinterpret_cast<std::uintptr_t>(b.data());
        auto k = s.launch(kernels().kernel("spin_then_fill"), {.block = 1}, go.data(), b,
                          std::uint64_t{n}, pattern, std::uint64_t{20'000'000});
        kernel_done = s.synchronize();
        asio::steady_timer timer(ctx, 10ms);
        auto r = co_await (k.async_wait(asio::use_awaitable) || timer.async_wait(asio::use_awaitable));
        timer_won = r.index() == 1;
        co_return;  // drops b
      },
      asio::detached);
  ctx.run();
  ASSERT_TRUE(timer_won);
  auto other = dev().make_stream();
  std::vector<device_buffer<std::uint32_t>> fresh;
  for (int i = 0; i < 8; ++i) {
    fresh.push_back(dev().alloc<std::uint32_t>(n));
    const auto a = reinterpret_cast<std::uintptr_t>(fresh.back().data());
    EXPECT_TRUE(a + n * 4 <= b_addr || a >= b_addr + n * 4) << "B's memory was handed out again";
    other.fill(fresh.back(), 0).wait();
  }
  __atomic_store_n(&go[0], 1u, __ATOMIC_RELEASE);
  kernel_done.wait();
  auto back = dev().alloc_host<std::uint32_t>(n);
  for (auto& f : fresh) {
    other.copy(back, f).wait();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 0u) << "a new buffer got the pattern";
  }
}

// A timer races a kernel that runs until released (`||`), beside coroutines that allocate and
// free their own buffers on the same threads. The race ends with the timer while the kernel
// still runs: no allocation or free on those threads waited for the kernel.
TEST_P(memory_test, TimerWinsARaceBesideCoroutinesThatAllocate) {
  using namespace asio::experimental::awaitable_operators;
  asio::io_context ctx;
  std::atomic<std::uint32_t> state_at_timer{99};
  std::atomic<int> rounds{0};
  std::atomic<bool> stop{false};
  {
    // The 17 streams below (the spinner's and the coroutines' 16) exist before the kernel runs
    // and wait in the device's pool: a CUDA context may wait for running kernels when it
    // creates a stream beyond its first few dozen (two runtimes share this one), which this
    // test is not about.
    std::vector<cora::stream> made;
    for (int c = 0; c < 17; ++c) made.push_back(dev().make_stream());
  }
  auto sp = spin();
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(ctx, 10ms);
        co_await (sp.run.async_wait(asio::use_awaitable) || timer.async_wait(asio::use_awaitable));
        state_at_timer = sp.state();
        stop = true;
      },
      asio::detached);
  // 16 streams: within the device's pool of created streams (a CUDA context may wait for the
  // device when it creates streams beyond its first few dozen).
  for (int c = 0; c < 16; ++c)
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          auto s = dev().make_stream();
          while (!stop) {
            auto d = dev().alloc<float>(1 << 14);
            auto h = dev().alloc_host<float>(1 << 14);
            co_await s.fill(d, 0).async_wait(asio::use_awaitable);
            co_await s.copy(h, d).async_wait(asio::use_awaitable);
            ++rounds;
          }
        },
        asio::detached);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { ctx.run(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(state_at_timer.load(), 0u) << "the timer's branch finished only after the kernel";
  EXPECT_GT(rounds.load(), 0);
  sp.release();
  sp.run.wait();
}

// stream.free ties the free to the stream's tail: the memory stays in use until the stream's
// earlier work completes, and the call does not wait for it.
TEST_P(memory_test, StreamFreeWaitsForTheStreamNotTheCaller) {
  auto sp = spin();
  auto b = dev().alloc<std::uint32_t>(1024);
  const auto in_use = dev().memory_in_use();
  sp.stream.free(std::move(b));
  EXPECT_FALSE(b);
  EXPECT_EQ(dev().memory_in_use(), in_use);
  EXPECT_EQ(sp.state(), 0u);
  sp.release();
  sp.stream.synchronize().wait();
  EXPECT_EQ(dev().memory_in_use(), in_use - 1024 * 4);
}

// stream.alloc completes without waiting for the stream's earlier work; stream.free pairs with it.
TEST_P(memory_test, StreamAllocDoesNotWaitForEarlierWork) {
  auto sp = spin();
  auto b = sp.stream.alloc<std::uint32_t>(256).wait();
  ASSERT_TRUE(b);
  EXPECT_EQ(b.size(), 256u);
  EXPECT_EQ(sp.state(), 0u);
  (void)sp.stream.fill(b, 7);
  sp.stream.free(std::move(b));
  try {
    (void)sp.stream.alloc<std::uint32_t>(0).wait();
    ADD_FAILURE() << "a 0-element allocation succeeded";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
  sp.release();
  sp.run.wait();
}

// Freed memory is refused by later ops even while in-flight work still holds it.
TEST_P(memory_test, DroppedBufferIsRefusedByLaterOps) {
  auto sp = spin();
  auto b = dev().alloc<std::uint32_t>(16);
  auto* p = b.data();
  (void)sp.stream.fill(b, 0);
  b.reset();
  auto s = dev().make_stream();
  std::error_code ec;
  try {
    s.fill(p, 0, 64).wait();
  } catch (const error& e) {
    ec = e.code();
  }
  EXPECT_EQ(ec, make_error_code(errc::invalid_pointer));
  sp.release();
  sp.run.wait();
}

// Alloc/free cycles leave nothing behind.
TEST_P(memory_test, TenThousandCyclesLeaveTheStatsWhereTheyWere) {
  auto rt = own_runtime();
  auto& d0 = rt->device(0);
  auto s = d0.make_stream();
  s.synchronize().wait();
  const auto before = d0.memory_stats();
  for (int i = 0; i < 10000; ++i) {
    auto d = d0.alloc<std::uint32_t>(64 + i % 512);
    auto h = d0.alloc_host<std::uint32_t>(64 + i % 512);
    if (i % 16 == 0) {
      (void)s.fill(d, 1);
      (void)s.copy(h, d);
    }
  }
  s.synchronize().wait();
  const auto after = d0.memory_stats();
  EXPECT_EQ(after.device_in_use, before.device_in_use);
  EXPECT_EQ(after.pinned_in_use, before.pinned_in_use);
  EXPECT_GE(after.pinned_reserved, after.pinned_in_use);
}

// What ops keep alive (a launch's module and kernel, the allocations it uses) is stored in a
// ring of small entries and released through a per-thread list: once both are warm, keeping
// and releasing allocate nothing. (Backends may allocate per op on their own: the CPU device's
// queue does; this checks the keep-alive storage itself.)
TEST_P(memory_test, KeepAliveStorageAllocatesNothingOnceWarm) {
  if (!cora::test::heap_counting()) GTEST_SKIP() << "heap allocations are not counted in this build";
  auto a = dev().alloc<float>(64), b = dev().alloc<float>(64);
  auto k = kernels().kernel("add_f32");
  auto s = dev().make_stream();
  s.launch(k, {}, a, a, b, std::uint64_t{64}).wait();  // loads the module where lazy
  std::shared_ptr<cora::backend::module> module;
  {
    std::error_code ec;
    module = k.state()->binary->module_for_launch(ec);
    ASSERT_FALSE(ec);
  }
  auto& dev_state = *dev().state();
  const auto entry = [&] {
    detail::op_keep e;
    e.module = module;
    e.kernel = k.state();
    for (float* p : {a.data(), b.data()}) {
      detail::memory_region r;
      detail::alloc_ref ref;
      dev_state.find_allocation(p, r, &ref);
      e.add(std::move(ref));
    }
    return e;
  };
  detail::keep_ring ring;
  const auto cycle = [&](int n) {
    for (int i = 0; i < n; ++i) ring.push(static_cast<std::uint64_t>(i), entry());
    detail::keep_drop drop;
    while (!ring.empty()) ring.pop_into(drop.next());
    drop.release();
  };
  cycle(1000);  // warms the ring and this thread's release list
  const auto before = cora::test::heap_allocations();
  cycle(1000);
  EXPECT_EQ(cora::test::heap_allocations() - before, 0u);
  // Every reference went: dropping the buffers frees them at once.
  const auto in_use = dev().memory_in_use();
  a.reset();
  EXPECT_EQ(dev().memory_in_use(), in_use - 64 * sizeof(float));
}

// runtime_options limits: beyond them, allocation fails with out_of_memory.
TEST_P(memory_test, PoolLimitsAreEnforced) {
  runtime_options o;
  o.device_memory_limit = 1 << 20;
  o.pinned_memory_limit = 12 << 20;
  auto rt = own_runtime(o);
  auto& d = rt->device(0);
  auto a = d.alloc<std::uint8_t>(600 << 10);
  std::error_code ec;
  void* p = d.malloc(600 << 10, ec);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ec, make_error_code(errc::out_of_memory));
  a.reset();
  p = d.malloc(600 << 10, ec);  // the limit counts what is in use, not what was
  EXPECT_FALSE(ec);
  d.free(p);

  // The pool starts with a 4 MiB slab; a 5 MiB request gets a 6 MiB slab of its own, and a
  // second one would take the reservation to 16 MiB.
  auto h = d.alloc_host<std::uint8_t>(5 << 20);
  void* q = d.malloc_host(5 << 20, ec);
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(ec, make_error_code(errc::out_of_memory));
  EXPECT_LE(d.memory_stats().pinned_reserved, std::size_t{12} << 20);
}

// A freed pinned block is kept for the next allocation of its size; kept blocks go back to
// the slabs when an allocation finds nothing that fits, so keeping never makes a later
// allocation fail under the pinned limit.
TEST_P(memory_test, KeptPinnedBlocksAreReusedAndGiveWayToLargerRequests) {
  runtime_options o;
  o.pinned_memory_limit = 8 << 20;
  auto rt = own_runtime(o);
  auto& d = rt->device(0);
  const void* first = nullptr;
  {
    auto h = d.alloc_host<std::uint8_t>(12 << 10);
    first = h.data();
  }
  {
    auto again = d.alloc_host<std::uint8_t>(12 << 10);
    EXPECT_EQ(static_cast<const void*>(again.data()), first);
  }
  // 3 MiB of small blocks in the first 4 MiB slab, all freed (and kept)...
  std::vector<host_buffer<std::uint8_t>> small;
  for (int i = 0; i < 48; ++i) small.push_back(d.alloc_host<std::uint8_t>(64 << 10));
  small.clear();
  // ...must not stop 3.5 MiB from fitting in a slab: a slab of its own would pass the limit
  // (4 MiB first slab + 4 MiB grown ahead of need + 4 MiB).
  std::error_code ec;
  void* big = d.malloc_host((7 << 20) / 2, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_NE(big, nullptr);
  if (big) d.free_host(big);
  EXPECT_LE(d.memory_stats().pinned_reserved, std::size_t{8} << 20);
}

TEST_P(memory_test, MemoryStatsFollowAllocations) {
  auto rt = own_runtime();
  auto& d0 = rt->device(0);
  const auto before = d0.memory_stats();
  auto d = d0.alloc<std::uint8_t>(1 << 20);
  auto h = d0.alloc_host<std::uint8_t>(1 << 16);
  const auto during = d0.memory_stats();
  EXPECT_GE(during.device_in_use, before.device_in_use + (1 << 20));
  EXPECT_GE(during.pinned_in_use, before.pinned_in_use + (1 << 16));
  EXPECT_GE(during.pinned_reserved, during.pinned_in_use);
  if (GetParam() == backend::cuda) {
    EXPECT_GE(during.device_reserved, std::size_t{1} << 20);
  }
  d.reset();
  h.reset();
  const auto after = d0.memory_stats();
  EXPECT_EQ(after.device_in_use, before.device_in_use);
  EXPECT_EQ(after.pinned_in_use, before.pinned_in_use);
}

// On CUDA a freed block serves the next allocation of its size class without a driver call
// (a pool allocation needs a round trip on the internal stream); trim_memory gives the kept
// blocks back to the pool and the pool's memory to the system.
TEST_P(memory_test, FreedDeviceMemoryIsReusedAndTrimmed) {
  auto rt = own_runtime();
  auto& d0 = rt->device(0);
  const void* first = nullptr;
  {
    auto b = d0.alloc<std::uint8_t>(3 << 18);
    first = b.data();
  }
  auto again = d0.alloc<std::uint8_t>((3 << 18) - 100);  // the same size class
  const bool cuda = GetParam() == backend::cuda;
  if (cuda) {
    EXPECT_EQ(static_cast<const void*>(again.data()), first);
  }
  again.reset();
  const auto kept = d0.memory_stats();
  EXPECT_EQ(kept.device_in_use, 0u);
  if (cuda) {
    EXPECT_GE(kept.device_reserved, std::size_t{3} << 18);
  }
  d0.trim_memory(0);
  const auto trimmed = d0.memory_stats();
  EXPECT_EQ(trimmed.device_in_use, 0u);
  if (cuda) {
    EXPECT_LT(trimmed.device_reserved, kept.device_reserved);
  }
  // Still usable after the trim.
  auto after = d0.alloc<std::uint8_t>(3 << 18);
  EXPECT_NE(after.data(), nullptr);
}

// When a blocking wait returns, what its op held is released, even when another thread's
// poll took the op's keep-alives: the buffers of the op are out of use at once.
TEST_P(memory_test, BlockingWaitReturnsAfterTheOpsBuffersAreReleased) {
  auto s = dev().make_stream();
  const auto base = dev().memory_stats();
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop.load(std::memory_order_relaxed)) (void)s.idle();
  });
  int late = 0;
  for (int i = 0; i < 2000; ++i) {
    pending<void> done;
    {
      auto h = dev().alloc_host<std::uint8_t>(4096);
      auto d = dev().alloc<std::uint8_t>(4096);
      (void)s.copy(d, h);
      done = s.copy(h, d);
    }  // dropped: the copies keep them
    done.wait();
    const auto now = dev().memory_stats();
    if (now.device_in_use != base.device_in_use || now.pinned_in_use != base.pinned_in_use) ++late;
  }
  stop = true;
  poller.join();
  EXPECT_EQ(late, 0) << "waits that returned before their op's buffers were released";
}

TEST_P(memory_test, NativeHandles) {
  auto s = dev().make_stream();
  auto e = dev().make_event();
  if (GetParam() == backend::cpu) {
    EXPECT_EQ(s.native_handle(), nullptr);
    EXPECT_EQ(e.native_handle(), nullptr);
    EXPECT_EQ(dev().native_handle(), nullptr);
    EXPECT_CORA_ERROR(dev().adopt_stream(reinterpret_cast<void*>(1)), errc::not_supported);
  } else {
    EXPECT_NE(s.native_handle(), nullptr);
    EXPECT_NE(e.native_handle(), nullptr);
    EXPECT_NE(dev().native_handle(), nullptr);
  }
  EXPECT_CORA_ERROR(dev().adopt_stream(nullptr), errc::invalid_argument);
}

// The CPU device's allocator keeps the pages of small frees (a request-sized buffer allocated
// and dropped per request must not cost a TLB flush and page faults each time), gives a large
// buffer's pages back at once, and gives the kept ones back on trim.
TEST(cpu_device_memory, SmallFreesKeepTheirPagesLargeOnesGiveThemBack) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto resident_pages = [&](void* p, std::size_t bytes) {
    std::vector<unsigned char> v((bytes + page - 1) / page);
    EXPECT_EQ(::mincore(p, bytes, v.data()), 0);
    std::size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  };
  cora::backend::cpu::device_memory mem(std::size_t{64} << 20);
  std::error_code ec;
  const std::size_t small = 64 << 10, large = cora::backend::cpu::device_memory::release_threshold * 4;
  void* s = mem.allocate(small, ec);
  ASSERT_FALSE(ec);
  void* l = mem.allocate(large, ec);
  ASSERT_FALSE(ec);
  std::memset(s, 1, small);
  std::memset(l, 1, large);
  ASSERT_EQ(resident_pages(s, small), small / page);
  ASSERT_EQ(resident_pages(l, large), large / page);
  mem.deallocate(s);
  mem.deallocate(l);
  EXPECT_EQ(resident_pages(s, small), small / page);  // kept for the next allocation
  EXPECT_EQ(resident_pages(l, large), 0u);
  EXPECT_EQ(mem.in_use(), 0u);
  void* again = mem.allocate(small, ec);  // best fit from the start: the kept pages again
  ASSERT_FALSE(ec);
  EXPECT_EQ(again, s);
  mem.deallocate(again);
  mem.release_free_pages();
  EXPECT_EQ(resident_pages(s, small), 0u);
}

}  // namespace
}  // namespace cora::test
