#include "cora/stream.hpp"

#include "cora/runtime.hpp"

#include <numeric>
#include <thread>
#include <vector>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

/// The memory of a value wait's or write's word: device memory on the CPU device, pinned host
/// memory on CUDA, whose stream memory operations do not take memory from cora's device pool.
template <class T>
struct value_word {
  device_buffer<T> d;
  host_buffer<T> h;
  T* data() const noexcept { return d ? d.data() : h.data(); }
};

class stream_test : public device_test {
 protected:
  template <class T>
  value_word<T> word() {
    value_word<T> w;
    if (GetParam() == backend::cuda)
      w.h = dev().alloc_host<T>(1);
    else
      w.d = dev().alloc<T>(1);
    auto s = dev().make_stream();
    s.write_value(w.data(), T{0}).wait();
    return w;
  }
  /// The word's value once the work that wrote it has completed.
  template <class T>
  T read(const value_word<T>& w) {
    if (w.h) return __atomic_load_n(w.h.data(), __ATOMIC_ACQUIRE);
    auto h = dev().alloc_host<T>(1);
    dev().make_stream().copy(h.data(), w.d.data(), sizeof(T)).wait();
    return h[0];
  }
};
CORA_DEVICE_SUITE(stream_test);

TEST_P(stream_test, CopiesRoundTripThroughDeviceMemory) {
  auto s = dev().make_stream();
  const std::size_t n = 100000;
  auto h = dev().alloc_host<std::uint32_t>(n);
  auto back = dev().alloc_host<std::uint32_t>(n);
  std::iota(h.begin(), h.end(), 7u);
  auto d = dev().alloc<std::uint32_t>(n);
  (void)s.copy(d, h);
  s.copy(back, d).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], i + 7);
}

TEST_P(stream_test, TypedLaunchComputesOnTheDevice) {
  auto s = dev().make_stream();
  const std::size_t n = 1 << 16;
  auto x = dev().alloc<float>(n), y = dev().alloc<float>(n), z = dev().alloc<float>(n);
  auto hx = dev().alloc_host<float>(n), hz = dev().alloc_host<float>(n);
  for (std::size_t i = 0; i < n; ++i) hx[i] = static_cast<float>(i);
  (void)s.copy(x, hx);
  (void)s.copy(y, hx);
  (void)s.launch(kernels().kernel("add_f32"), {.grid = 16}, x, y, z, std::uint64_t{n});
  s.copy(hz, z).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hz[i], 2.0f * static_cast<float>(i));
}

}  // namespace
}  // namespace cora::test

namespace cora::test {
namespace {

TEST_P(stream_test, CopiesInEveryDirection) {
  auto s = dev().make_stream();
  std::vector<std::uint8_t> pageable(1000);
  for (std::size_t i = 0; i < pageable.size(); ++i) pageable[i] = static_cast<std::uint8_t>(i);
  auto d1 = dev().alloc<std::uint8_t>(1000), d2 = dev().alloc<std::uint8_t>(1000);
  auto pinned = dev().alloc_host<std::uint8_t>(1000);
  std::vector<std::uint8_t> out(1000);
  (void)s.copy(d1.data(), pageable.data(), 1000);  // H2D from pageable memory
  pageable.assign(1000, 0);                  // the source was read before copy() returned
  (void)s.copy(d2, d1);                             // D2D
  (void)s.copy(pinned, d2);                         // D2H into pinned memory
  (void)s.copy(out.data(), pinned.data(), 1000);    // H2H
  s.synchronize().wait();
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<std::uint8_t>(i));
}

TEST_P(stream_test, FillSetsBytes) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(64);
  (void)s.fill(d, 0xab);
  std::uint32_t h[64];
  s.copy(h, d.data(), sizeof(h)).wait();
  for (auto v : h) ASSERT_EQ(v, 0xababababu);
}

// A dropped stream whose work is done serves the next make_stream (where the device pools
// its streams), and starts afresh there: waits on it still wait for their own ops.
TEST_P(stream_test, DrainedStreamsServeAgainFromAFreshStart) {
  constexpr std::size_t n = 1 << 16;
  auto d = dev().alloc<std::uint8_t>(n);
  auto h = dev().alloc_host<std::uint8_t>(n);
  void* previous = nullptr;
  int reused = 0;
  for (int round = 0; round < 40; ++round) {
    auto s = dev().make_stream();
    if (previous && s.native_handle() == previous) ++reused;
    const auto value = static_cast<std::uint8_t>(round + 1);
    (void)s.fill(d, value);
    s.copy(h, d).wait();
    for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(h[i], value) << "round " << round << ", byte " << i;
    previous = s.native_handle();
  }
  // The pool's refill on a cora thread may slip a new stream in now and then.
  if (previous) {
    EXPECT_GE(reused, 30) << "drained streams should serve the next rounds";
  }
}

TEST_P(stream_test, OpsCompleteInCallOrder) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(1);
  std::vector<pending<void>> ps;
  for (std::uint8_t v = 1; v <= 50; ++v) ps.push_back(s.fill(d, v));
  std::uint32_t h = 0;
  s.copy(&h, d.data(), 4).wait();
  EXPECT_EQ(h, 0x32323232u);
  for (auto& p : ps) EXPECT_TRUE(p.ready());
}

TEST_P(stream_test, NullPointerIsInvalid) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(16);
  EXPECT_CORA_ERROR(s.copy(nullptr, d.data(), 16).wait(), errc::invalid_pointer);
  EXPECT_CORA_ERROR(s.copy(d.data(), nullptr, 16).wait(), errc::invalid_pointer);
  EXPECT_CORA_ERROR(s.fill(nullptr, 0, 16).wait(), errc::invalid_pointer);
}

TEST_P(stream_test, FreedDeviceMemoryIsNoLiveAllocation) {
  if (GetParam() == backend::cuda) GTEST_SKIP() << "the CUDA driver cannot tell freed device memory from host memory";
  auto s = dev().make_stream();
  void* p = dev().malloc(256);
  dev().free(p);
  std::uint8_t h[16] = {};
  EXPECT_CORA_ERROR(s.copy(p, h, 16).wait(), errc::invalid_pointer);
}

TEST_P(stream_test, RangePastTheEndOfAnAllocationIsOutOfRange) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(100);
  std::vector<std::uint8_t> h(200);
  EXPECT_CORA_ERROR(s.copy(d.data(), h.data(), 101).wait(), errc::out_of_range);
  EXPECT_CORA_ERROR(s.copy(h.data(), d.data() + 50, 51).wait(), errc::out_of_range);
  EXPECT_CORA_ERROR(s.fill(d.data() + 99, 0, 2).wait(), errc::out_of_range);
  auto small = dev().alloc_host<std::uint8_t>(10);
  EXPECT_CORA_ERROR(s.copy(small, d).wait(), errc::out_of_range);
}

TEST_P(stream_test, ZeroByteCopyCompletesAtOnce) {
  auto s = dev().make_stream();
  auto p = s.copy(nullptr, nullptr, 0);
  EXPECT_TRUE(p.ready());
  p.wait();
}

TEST_P(stream_test, TrapFailsTheStreamUntilSynchronizeReportsIt) {
  CORA_SKIP_FAULTS_ON_GPU();
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  auto flags = dev().alloc<std::uint32_t>(4);
  auto trap = s.launch(kernels().kernel("trap"), {.grid = 2}, flags);
  auto after = s.fill(flags, 0);
  try {
    trap.wait();
    FAIL() << "the trap was not reported";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::kernel_fault));
    EXPECT_NE(std::string(e.what()).find("trap"), std::string::npos) << e.what();
  }
  // A later op on the same stream is affected too.
  EXPECT_CORA_ERROR(after.wait(), errc::kernel_fault);
  // Other streams keep working.
  auto h = dev().alloc_host<std::uint32_t>(4);
  (void)other.fill(flags, 7);
  other.copy(h, flags).wait();
  EXPECT_EQ(h[0], 0x07070707u);
  // synchronize reports the fault once, then the stream is usable again.
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::kernel_fault);
  (void)s.fill(flags, 1);
  s.copy(h, flags).wait();
  EXPECT_EQ(h[0], 0x01010101u);
}

TEST_P(stream_test, DroppedFailureSurfacesAtTheNextWait) {
  auto s = dev().make_stream();
  (void)s.copy(nullptr, nullptr, 4);  // fails validation; the pending is dropped
  auto d = dev().alloc<std::uint8_t>(4);
  EXPECT_CORA_ERROR(s.fill(d, 0).wait(), errc::invalid_pointer);
  std::error_code ec;
  s.synchronize().wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_pointer));
  s.synchronize().wait();  // reported once: cleared
}

TEST_P(stream_test, DestroyingAStreamWithWorkInFlightLetsTheWorkFinish) {
  auto flag = dev().alloc<std::uint32_t>(1);
  auto h = dev().alloc_host<std::uint32_t>(1);
  auto done = dev().make_event();
  {
    auto s = dev().make_stream();
    (void)s.fill(flag, 0);
    (void)s.launch(kernels().kernel("slow"), {}, std::uint64_t{20000}, flag);
    (void)s.record(done);
  }  // the stream handle is gone, its work is not
  // Read the flag after the kernel through the event, not by polling it while the kernel
  // writes it (a data race, which ThreadSanitizer reports on the CPU device).
  auto s2 = dev().make_stream();
  (void)s2.wait(done);
  s2.copy(h, flag).wait();
  EXPECT_EQ(h[0], 1u);
}

TEST_P(stream_test, StreamsRunConcurrently) {
  if (dev().properties().compute_units < 2) GTEST_SKIP() << "one compute unit";
  auto a = dev().make_stream(), b = dev().make_stream();
  auto flags = dev().alloc<std::uint32_t>(2);
  const auto t0 = std::chrono::steady_clock::now();
  auto pa = a.launch(kernels().kernel("slow"), {}, std::uint64_t{100000}, flags.data());
  auto pb = b.launch(kernels().kernel("slow"), {}, std::uint64_t{100000}, flags.data() + 1);
  pa.wait();
  pb.wait();
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 190.0) << "two 100 ms kernels on two streams ran one after the other";
}

TEST_P(stream_test, HostFunctionRunsInStreamOrder) {
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint32_t>(1);
  auto h = dev().alloc_host<std::uint32_t>(1);
  (void)s.fill(d, 5);
  (void)s.copy(h, d);
  std::uint32_t seen = 0;
  s.host_func([&] { seen = h[0]; }).wait();
  EXPECT_EQ(seen, 0x05050505u);
}

TEST_P(stream_test, StopOnFailureSkipsTheOpsBehindAFailedOneUntilSynchronize) {
  auto s = dev().make_stream();
  std::error_code ec;
  s.stop_on_failure(true, ec);
  if (GetParam() == backend::cuda) {  // a GPU stream cannot hold back work handed to the driver
    EXPECT_EQ(ec, make_error_code(errc::not_supported));
    return;
  }
  ASSERT_FALSE(ec) << ec.message();
  auto other = dev().make_stream();
  auto out = dev().alloc<std::uint32_t>(2);
  auto mark = dev().alloc<std::uint32_t>(1);
  auto h = dev().alloc_host<std::uint32_t>(1);
  other.fill(mark, 0).wait();
  auto trap = s.launch(kernels().kernel("trap"), {.grid = 2}, out);
  auto behind = s.fill(mark, 9);
  auto behind2 = s.host_func([] {});
  EXPECT_CORA_ERROR(trap.wait(), errc::kernel_fault);
  EXPECT_CORA_ERROR(behind.wait(), errc::kernel_fault);
  EXPECT_CORA_ERROR(behind2.wait(), errc::kernel_fault);
  other.copy(h, mark).wait();
  EXPECT_EQ(h[0], 0u) << "an op behind the failed one ran";
  // Enqueued after the failure, before the synchronize that reports it: not run either.
  auto late = s.fill(mark, 8);
  EXPECT_CORA_ERROR(late.wait(), errc::kernel_fault);
  other.copy(h, mark).wait();
  EXPECT_EQ(h[0], 0u);
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::kernel_fault);
  // Reported: the stream runs again.
  (void)s.fill(mark, 1);
  s.copy(h, mark).wait();
  EXPECT_EQ(h[0], 0x01010101u);

  // Continue on failure (the default): the op behind the trap runs.
  s.stop_on_failure(false);
  (void)s.launch(kernels().kernel("trap"), {.grid = 2}, out);
  (void)s.fill(mark, 9);
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::kernel_fault);
  other.copy(h, mark).wait();
  EXPECT_EQ(h[0], 0x09090909u);
}

// --- memory-value waits and writes ---------------------------------------------------------

TEST_P(stream_test, WaitValueHoldsLaterWorkUntilTheWordSatisfiesIt) {
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  auto word = this->word<std::uint64_t>();
  auto flag = this->word<std::uint32_t>();
  auto waited = s.wait_value(word.data(), std::uint64_t{5}, wait_condition::geq);
  auto after = s.write_value(flag.data(), std::uint32_t{1});
  other.write_value(word.data(), std::uint64_t{3}).wait();  // 3 < 5: still waiting
  EXPECT_FALSE(s.idle());
  EXPECT_EQ(read(flag), 0u);  // the write behind the wait has not run
  other.write_value(word.data(), std::uint64_t{7}).wait();
  waited.wait();
  after.wait();
  EXPECT_EQ(read(flag), 1u);
}

TEST_P(stream_test, WaitValueConditionsAreCudasAndCanns) {
  auto s = dev().make_stream();
  auto w32 = word<std::uint32_t>();
  auto w64 = word<std::uint64_t>();
  auto set32 = [&](std::uint32_t v) { s.write_value(w32.data(), v).wait(); };
  auto set64 = [&](std::uint64_t v) { s.write_value(w64.data(), v).wait(); };
  // Each condition, on a word that already satisfies it: the wait completes.
  set32(1);
  s.wait_value(w32.data(), 0xffffffffu, wait_condition::geq).wait();  // cyclic: 1 - (-1) = 2 >= 0
  s.wait_value(w32.data(), 1u, wait_condition::eq).wait();
  s.wait_value(w32.data(), 3u, wait_condition::and_nonzero).wait();
  s.wait_value(w32.data(), 0xfffffff0u, wait_condition::nor_nonzero).wait();  // ~(1 | 0xfffffff0) = 0xe
  set64(std::uint64_t{1} << 40);
  EXPECT_EQ(read(w64), std::uint64_t{1} << 40);  // one 64-bit store
  s.wait_value(w64.data(), std::uint64_t{1} << 40, wait_condition::eq).wait();
  s.wait_value(w64.data(), std::uint64_t{1} << 39, wait_condition::geq).wait();
  s.wait_value(w64.data(), (std::uint64_t{1} << 40) | 1, wait_condition::and_nonzero).wait();
  s.wait_value(w64.data(), 0, wait_condition::nor_nonzero).wait();

  // Each condition, on a word that does not satisfy it yet: the stream waits, then goes on.
  auto other = dev().make_stream();
  struct step {
    wait_condition c;
    std::uint32_t operand, before, after;
  };
  for (const step& st : {step{wait_condition::geq, 10, 9, 10}, step{wait_condition::geq, 0xfffffff0u, 0xffffffe0u, 2},
                         step{wait_condition::eq, 4, 5, 4}, step{wait_condition::and_nonzero, 6, 1, 4},
                         step{wait_condition::nor_nonzero, 0xfffffff0u, 0xffffffffu, 0xfffffff7u}}) {
    set32(st.before);
    auto p = s.wait_value(w32.data(), st.operand, st.c);
    EXPECT_FALSE(s.idle()) << "condition " << static_cast<int>(st.c) << " held on " << st.before;
    other.write_value(w32.data(), st.after).wait();
    p.wait();
  }
}

TEST_P(stream_test, WaitValueSeesAHostStoreToPinnedMemory) {
  auto s = dev().make_stream();
  auto h = dev().alloc_host<std::uint32_t>(1);
  h[0] = 0;
  auto p = s.wait_value(h.data(), 1u, wait_condition::eq);
  EXPECT_FALSE(s.idle());
  __atomic_store_n(h.data(), 1u, __ATOMIC_RELEASE);
  p.wait();
}

TEST_P(stream_test, WaitValueRefusesWordsTheDeviceCannotWatch) {
  auto s = dev().make_stream();
  auto w = dev().alloc<std::uint64_t>(2);
  EXPECT_CORA_ERROR(s.wait_value(static_cast<const std::uint64_t*>(nullptr), 0).wait(), errc::invalid_pointer);
  const auto* odd = reinterpret_cast<const std::uint64_t*>(reinterpret_cast<const char*>(w.data()) + 4);
  EXPECT_CORA_ERROR(s.wait_value(odd, 0).wait(), errc::invalid_pointer);
  std::uint64_t pageable = 0;
  EXPECT_CORA_ERROR(s.wait_value(&pageable, 0).wait(), errc::invalid_pointer);
  EXPECT_CORA_ERROR(s.write_value(&pageable, 1).wait(), errc::invalid_pointer);
  EXPECT_CORA_ERROR(s.wait_value(w.data(), 0, static_cast<wait_condition>(4)).wait(), errc::invalid_argument);
  s.synchronize().wait();
}

// cora's device memory comes from a stream-ordered pool on CUDA, which the driver's stream
// memory operations refuse with a bare CUDA_ERROR_INVALID_VALUE: a wait on it is refused up
// front, saying to use pinned host memory, and the stream goes on; a write lands as a
// stream-ordered copy. The CPU device takes device memory for both.
TEST_P(stream_test, ValueOpsOnDeviceMemory) {
  auto s = dev().make_stream();
  auto w32 = dev().alloc<std::uint32_t>(1);
  auto w64 = dev().alloc<std::uint64_t>(1);
  auto h64 = dev().alloc_host<std::uint64_t>(1);
  auto h32 = dev().alloc_host<std::uint32_t>(1);
  (void)s.write_value(w64.data(), (std::uint64_t{9} << 40) | 9);
  (void)s.write_value(w32.data(), 3u);
  (void)s.copy(h64.data(), w64.data(), 8);
  s.copy(h32.data(), w32.data(), 4).wait();
  EXPECT_EQ(h64[0], (std::uint64_t{9} << 40) | 9);
  EXPECT_EQ(h32[0], 3u);
  if (GetParam() == backend::cuda) {
    auto refused = [](pending<void> p) {
      try {
        p.wait();
        ADD_FAILURE() << "a value wait on pool memory was taken";
      } catch (const error& e) {
        EXPECT_EQ(e.code(), make_error_code(errc::invalid_pointer)) << e.what();
        EXPECT_NE(std::string(e.what()).find("pinned host memory"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("alloc_host"), std::string::npos) << e.what();
      }
    };
    refused(s.wait_value(w64.data(), std::uint64_t{1}));
    refused(s.wait_value(w32.data(), 3u, wait_condition::eq));
    s.synchronize().wait();  // refused ops leave no failure behind
    return;
  }
  s.wait_value(w64.data(), (std::uint64_t{9} << 40) | 9, wait_condition::eq).wait();
  s.wait_value(w32.data(), 2u, wait_condition::and_nonzero).wait();
}

TEST_P(stream_test, AbortDiscardsTheWorkThatHasNotStarted) {
  auto s = dev().make_stream();
  auto other = dev().make_stream();
  auto word = this->word<std::uint64_t>();
  auto mark = dev().alloc<std::uint32_t>(1);
  auto h = dev().alloc_host<std::uint32_t>(1);
  other.fill(mark, 0).wait();
  auto waiting = s.wait_value(word.data(), std::uint64_t{1}, wait_condition::eq);
  auto behind = s.fill(mark, 5);
  std::error_code ec;
  s.abort(ec);
  if (GetParam() == backend::cuda) {  // a GPU stream cannot recall what the driver holds
    EXPECT_EQ(ec, make_error_code(errc::not_supported));
    other.write_value(word.data(), std::uint64_t{1}).wait();
    s.synchronize().wait();
    return;
  }
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_CORA_ERROR(waiting.wait(), errc::aborted);  // a wait in progress ends
  EXPECT_CORA_ERROR(behind.wait(), errc::aborted);
  other.copy(h, mark).wait();
  EXPECT_EQ(h[0], 0u) << "a discarded op ran";
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::aborted);

  // A running launch finishes; what is queued behind it is discarded.
  auto go = dev().alloc_host<std::uint32_t>(1);
  auto done = dev().alloc_host<std::uint32_t>(1);
  go[0] = 0;
  done[0] = 0;
  auto spin = s.launch(kernels().kernel("spin_until_set"), {}, go.data(), done.data(), std::uint64_t{30000000});
  auto queued = s.fill(mark, 6);
  s.abort();
  __atomic_store_n(go.data(), 1u, __ATOMIC_RELEASE);
  spin.wait();
  EXPECT_EQ(__atomic_load_n(done.data(), __ATOMIC_ACQUIRE), 1u);  // released, not timed out
  EXPECT_CORA_ERROR(queued.wait(), errc::aborted);
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::aborted);
  // The stream takes new work.
  (void)s.fill(mark, 1);
  s.copy(h, mark).wait();
  EXPECT_EQ(h[0], 0x01010101u);
}

// A wait whose word is never written ends when the runtime shuts down; nothing hangs.
TEST(stream_value_wait, ShutdownEndsAWaitThatNeverHolds) {
  stream s;
  pending<void> waited, behind;
  device_buffer<std::uint64_t> word;
  {
    runtime_options o;
    o.use_environment = false;
    o.backend = backend_selection::cpu;
    runtime rt(o);
    s = rt.device(0).make_stream();
    word = rt.device(0).alloc<std::uint64_t>(1);
    s.fill(word, 0).wait();
    waited = s.wait_value(word.data(), std::uint64_t{1}, wait_condition::eq);
    behind = s.fill(word, 1);
    EXPECT_FALSE(s.idle());
  }
  EXPECT_CORA_ERROR(waited.wait(), errc::runtime_shut_down);
  EXPECT_CORA_ERROR(behind.wait(), errc::runtime_shut_down);
  word.reset();
  s = stream();
}

}  // namespace
}  // namespace cora::test
