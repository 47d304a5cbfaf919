// Several devices in one runtime: each device's streams, memory and binaries are its own;
// memory of one device is copied by the other's streams; an event of one device orders a
// stream of the other; a handle of one device used with the other is an error, never a crash.
// The CPU instance models two devices (cpu_devices = 2); the CUDA instance needs two GPUs.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

// A runtime with two devices of the backend under test, shared by the program's tests.
runtime* two_device_runtime(backend b) {
  static std::unique_ptr<runtime> rts[2];
  static bool tried[2] = {};
  const int i = b == backend::cpu ? 0 : 1;
  if (!tried[i]) {
    tried[i] = true;
    runtime_options o;
    o.use_environment = false;
    o.backend = b == backend::cpu ? backend_selection::cpu : backend_selection::cuda;
    o.cpu_devices = 2;
    try {
      rts[i] = std::make_unique<runtime>(o);
    } catch (const error&) {
    }
  }
  return rts[i].get();
}

class multi_device_test : public ::testing::TestWithParam<backend> {
 protected:
  void SetUp() override {
    rt_ = two_device_runtime(GetParam());
    const std::size_t n = rt_ ? rt_->device_count() : 0;
    if (n < 2)
      GTEST_SKIP() << "needs two " << (GetParam() == backend::cpu ? "CPU" : "CUDA")
                   << " devices; found " << n;
  }
  cora::device& dev(std::size_t i) { return rt_->device(i); }
  cora::binary& kernels(std::size_t i) {
    static std::map<std::pair<backend, std::size_t>, cora::binary> loaded;
    auto& b = loaded[{GetParam(), i}];
    if (!b) b = dev(i).load_binary(kernel_file("test_kernels.corabin")).wait();
    return b;
  }
  runtime* rt_ = nullptr;
};
CORA_DEVICE_SUITE(multi_device_test);

TEST_P(multi_device_test, EachDeviceRunsItsOwnWorkAtTheSameTime) {
  const std::size_t n = 1 << 16;
  struct per_device {
    stream s;
    device_buffer<float> x, y, z;
    host_buffer<float> h;
  };
  std::vector<per_device> work;
  for (std::size_t d = 0; d < 2; ++d) {
    auto& dv = dev(d);
    per_device p{dv.make_stream(), dv.alloc<float>(n), dv.alloc<float>(n), dv.alloc<float>(n),
                 dv.alloc_host<float>(n)};
    for (std::size_t i = 0; i < n; ++i) p.h[i] = static_cast<float>(i + d);
    work.push_back(std::move(p));
  }
  // Enqueue everything on both devices first, then wait: the two streams run side by side.
  std::vector<pending<void>> done;
  for (std::size_t d = 0; d < 2; ++d) {
    auto& p = work[d];
    (void)p.s.copy(p.x, p.h);
    (void)p.s.copy(p.y, p.h);
    (void)p.s.launch(kernels(d).kernel("add_f32"), {.grid = 8}, p.x, p.y, p.z, std::uint64_t{n});
    done.push_back(p.s.copy(p.h, p.z));
  }
  for (auto& f : done) f.wait();
  for (std::size_t d = 0; d < 2; ++d)
    for (std::size_t i = 0; i < n; i += 997)
      ASSERT_EQ(work[d].h[i], 2.0f * static_cast<float>(i + d)) << "device " << d << " element " << i;
}

TEST_P(multi_device_test, DevicesAreDistinct) {
  EXPECT_NE(&dev(0), &dev(1));
  EXPECT_EQ(dev(0).index(), 0u);
  EXPECT_EQ(dev(1).index(), 1u);
  auto a = dev(0).alloc<std::uint32_t>(16), b = dev(1).alloc<std::uint32_t>(16);
  EXPECT_NE(static_cast<void*>(a.data()), static_cast<void*>(b.data()));
}

TEST_P(multi_device_test, KernelLoadedOnOneDeviceIsAnErrorOnTheOther) {
  auto s = dev(1).make_stream();
  try {
    s.launch(kernels(0).kernel("empty"), {}).wait();
    ADD_FAILURE() << "a kernel of device 0 launched on device 1";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::wrong_device)) << e.what();
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
  // The stream stays usable: the failed launch was never enqueued.
  s.launch(kernels(1).kernel("empty"), {}).wait();
}

TEST_P(multi_device_test, MemoryOfOneDeviceAsAKernelArgumentOnTheOtherIsAnError) {
  auto s = dev(1).make_stream();
  auto foreign = dev(0).alloc<std::uint32_t>(64);
  EXPECT_CORA_ERROR(s.launch(kernels(1).kernel("iota_u32"), {}, foreign, std::uint64_t{64}).wait(),
                         errc::wrong_device);
  EXPECT_CORA_ERROR(
      s.launch(kernels(1).kernel("iota_u32"), {}, foreign.data(), std::uint64_t{64}).wait(),
      errc::wrong_device);
  s.synchronize().wait();
}

TEST_P(multi_device_test, StreamsCopyBetweenTheDevicesMemoryInBothDirections) {
  const std::size_t n = 1 << 20;
  auto src = dev(0).alloc<std::uint32_t>(n);
  auto mid = dev(1).alloc<std::uint32_t>(n);
  auto back = dev(0).alloc<std::uint32_t>(n);
  auto h = dev(0).alloc_host<std::uint32_t>(n);
  auto s0 = dev(0).make_stream(), s1 = dev(1).make_stream();
  s0.launch(kernels(0).kernel("iota_u32"), {.grid = 16}, src, std::uint64_t{n}).wait();
  s1.copy(mid, src).wait();   // device 0 -> device 1 on a stream of device 1
  s0.fill(back, 0xff).wait();
  s0.copy(back, mid).wait();  // device 1 -> device 0 on a stream of device 0
  s0.copy(h, back).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], static_cast<std::uint32_t>(i)) << i;
}

TEST_P(multi_device_test, AnEventOfOneDeviceOrdersAStreamOfTheOther) {
  auto a = dev(0).make_stream(), b = dev(1).make_stream();
  auto ev = dev(0).make_event();
  auto flag = dev(0).alloc<std::uint32_t>(1);
  auto h = dev(1).alloc_host<std::uint32_t>(1);
  a.fill(flag, 0).wait();
  (void)a.launch(kernels(0).kernel("slow"), {}, std::uint64_t{30000}, flag);  // flag = 1 at the end
  (void)a.record(ev);
  (void)b.wait(ev);
  b.copy(h, flag).wait();
  EXPECT_EQ(h[0], 1u) << "device 1 read the flag before device 0's work finished";
}

TEST_P(multi_device_test, CoroutinesAwaitBothDevices) {
  auto s0 = dev(0).make_stream(), s1 = dev(1).make_stream();
  auto f0 = dev(0).alloc<std::uint32_t>(1), f1 = dev(1).alloc<std::uint32_t>(1);
  auto h = dev(0).alloc_host<std::uint32_t>(2);
  auto body = [&]() -> task<std::uint32_t> {
    // Both launches are in flight before the first await.
    auto a = s0.launch(kernels(0).kernel("slow"), {}, std::uint64_t{5000}, f0);
    auto b = s1.launch(kernels(1).kernel("slow"), {}, std::uint64_t{5000}, f1);
    co_await a;
    co_await b;
    co_await s0.copy(h.data(), f0.data(), sizeof(std::uint32_t));
    co_await s1.copy(h.data() + 1, f1.data(), sizeof(std::uint32_t));
    co_return h[0] + h[1];
  };
  EXPECT_EQ(sync_wait(body()), 2u);
}

TEST_P(multi_device_test, EventsOfTwoDevicesHaveNoElapsedTime) {
  auto s0 = dev(0).make_stream(), s1 = dev(1).make_stream();
  auto a = dev(0).make_event(), b = dev(1).make_event();
  s0.record(a).wait();
  s1.record(b).wait();
  EXPECT_CORA_ERROR(event::elapsed(a, b), errc::wrong_device);
}

TEST_P(multi_device_test, RecordingAnEventOnTheOtherDevicesStreamIsAnError) {
  auto ev = dev(0).make_event();
  auto s = dev(1).make_stream();
  EXPECT_CORA_ERROR(s.record(ev).wait(), errc::wrong_device);
}

// One GPU and the CPU device in one runtime: memory, kernels and events do not cross backends,
// and saying so is an error rather than a fault.
class gpu_and_cpu_device_test : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::unique_ptr<runtime> rt = [] {
      runtime_options o;
      o.use_environment = false;
      o.backend = backend_selection::any;
      try {
        return std::make_unique<runtime>(o);
      } catch (const error&) {
        return std::unique_ptr<runtime>();
      }
    }();
    rt_ = rt.get();
    if (!rt_ || rt_->device(0).backend() != backend_kind::cuda)
      CORA_NO_DEVICE(backend::cuda, rt_ ? "the runtime lists no CUDA device" : "the runtime did not start");
    gpu_ = &rt_->device(0);
    cpu_ = &rt_->device(rt_->device_count() - 1);
    if (cpu_->backend() != backend_kind::cpu) GTEST_SKIP() << "the runtime has no CPU device";
  }
  runtime* rt_ = nullptr;
  cora::device* gpu_ = nullptr;
  cora::device* cpu_ = nullptr;
};

TEST_F(gpu_and_cpu_device_test, CopiesAcrossBackendsAreRefused) {
  auto g = gpu_->alloc<std::uint32_t>(16);
  auto c = cpu_->alloc<std::uint32_t>(16);
  auto gs = gpu_->make_stream(), cs = cpu_->make_stream();
  EXPECT_CORA_ERROR(gs.copy(g, c).wait(), errc::wrong_device);
  EXPECT_CORA_ERROR(cs.copy(c, g).wait(), errc::wrong_device);
  // Pinned host memory is shared: both devices copy through it.
  auto h = gpu_->alloc_host<std::uint32_t>(16);
  for (std::uint32_t i = 0; i < 16; ++i) h[i] = i * 3;
  cs.copy(c, h).wait();
  gs.copy(g, h).wait();
  for (std::uint32_t i = 0; i < 16; ++i) h[i] = 0;
  gs.copy(h, g).wait();
  for (std::uint32_t i = 0; i < 16; ++i) EXPECT_EQ(h[i], i * 3);
}

TEST_F(gpu_and_cpu_device_test, KernelsAndEventsDoNotCrossBackends) {
  auto cpu_kernels = cpu_->load_binary(kernel_file("test_kernels.corabin")).wait();
  auto gs = gpu_->make_stream();
  EXPECT_CORA_ERROR(gs.launch(cpu_kernels.kernel("empty"), {}).wait(), errc::wrong_device);
  auto cs = cpu_->make_stream();
  auto ev = cpu_->make_event();
  cs.record(ev).wait();
  EXPECT_CORA_ERROR(gs.wait(ev).wait(), errc::not_supported);
  gs.synchronize().wait();
}

}  // namespace
}  // namespace cora::test
