#include "cora/runtime.hpp"

#include <cstdlib>
#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "core/state.hpp"

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

struct env_var {
  env_var(const char* n, const char* v) : name(n) {
    const char* old = std::getenv(n);
    if (old) saved = old;
    had = old != nullptr;
    ::setenv(n, v, 1);
  }
  ~env_var() {
    if (had)
      ::setenv(name, saved.c_str(), 1);
    else
      ::unsetenv(name);
  }
  const char* name;
  std::string saved;
  bool had = false;
};

TEST(runtime, AlwaysHasTheCpuDeviceLast) {
  runtime rt;
  ASSERT_GE(rt.device_count(), 1u);
  auto& last = rt.device(rt.device_count() - 1);
  EXPECT_EQ(last.backend(), backend_kind::cpu);
  EXPECT_GT(last.properties().compute_units, 0u);
  EXPECT_GT(last.properties().total_memory, 0u);
  EXPECT_FALSE(last.name().empty());
  EXPECT_EQ(last.index(), rt.device_count() - 1);
}

TEST(runtime, CpuBackendSelectionHasOnlyCpuDevices) {
  env_var e("CORA_BACKEND", "cpu");
  runtime rt;
  for (std::size_t i = 0; i < rt.device_count(); ++i) EXPECT_EQ(rt.device(i).backend(), backend_kind::cpu);
}

TEST(runtime, InvalidEnvironmentValuesAreRejected) {
  {
    env_var e("CORA_BACKEND", "tpu");
    EXPECT_CORA_ERROR(runtime(), errc::invalid_argument);
  }
  {
    env_var e("CORA_COMPLETION", "sometimes");
    EXPECT_CORA_ERROR(runtime(), errc::invalid_argument);
  }
  {
    env_var e("CORA_DEVICE", "-1");
    EXPECT_CORA_ERROR(runtime(), errc::invalid_argument);
  }
}

TEST(runtime, DefaultDeviceFollowsCoraDevice) {
  env_var b("CORA_BACKEND", "cpu");
  runtime_options o;
  o.cpu_devices = 3;
  {
    env_var d("CORA_DEVICE", "2");
    runtime rt(o);
    EXPECT_EQ(rt.default_device().index(), 2u);
  }
  {
    env_var d("CORA_DEVICE", "3");
    EXPECT_CORA_ERROR(runtime(o), errc::no_device);
  }
}

TEST(runtime, CompletionPolicyFromTheEnvironment) {
  env_var c("CORA_COMPLETION", "spin");
  runtime rt;
  EXPECT_EQ(rt.options().completion, completion_policy::spin);
  EXPECT_STREQ(to_string(rt.options().completion), "spin");
}

TEST(runtime, ComputeUnitsAreConfigurable) {
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  o.cpu_compute_units = 3;
  runtime rt(o);
  EXPECT_EQ(rt.device(0).properties().compute_units, 3u);
}

TEST(runtime, DeviceOutOfRangeIsNoDevice) {
  runtime rt;
  EXPECT_CORA_ERROR(rt.device(rt.device_count()), errc::no_device);
}

TEST(runtime, ReportsItsBackends) {
  runtime rt;
  auto b = rt.backends();
  ASSERT_EQ(b.size(), 2u);
  bool cpu = false;
  for (auto& s : b)
    if (s.name == "cpu") cpu = s.available;
  EXPECT_TRUE(cpu);
}

TEST(runtime, ObjectsOutliveTheRuntimeAndFailCleanly) {
  stream s;
  device_buffer<float> buf;
  {
    runtime_options o;
    o.use_environment = false;
    o.backend = backend_selection::cpu;
    runtime rt(o);
    s = rt.device(0).make_stream();
    buf = rt.device(0).alloc<float>(16);
  }
  EXPECT_CORA_ERROR(s.fill(buf, 0).wait(), errc::runtime_shut_down);
  buf.reset();
  s = stream();
}

// Defect: stream.device() returned a reference into the destroyed runtime.
TEST(runtime, StreamDeviceStaysValidAfterTheRuntime) {
  stream s;
  std::string name;
  {
    runtime_options o;
    o.use_environment = false;
    o.backend = backend_selection::cpu;
    runtime rt(o);
    s = rt.device(0).make_stream();
    name = rt.device(0).name();
    EXPECT_EQ(&s.device(), &rt.device(0));
  }
  device& d = s.device();
  EXPECT_EQ(d.name(), name);
  EXPECT_EQ(d.index(), 0u);
  EXPECT_CORA_ERROR(d.make_stream(), errc::runtime_shut_down);
  EXPECT_CORA_ERROR(d.alloc<float>(4), errc::runtime_shut_down);
  std::error_code ec;
  d.synchronize().wait(ec);
  EXPECT_FALSE(ec) << ec.message();
}

// Issue 18 item 4: an op still queued on the CPU device when the runtime is destroyed completes
// (with runtime_shut_down, or its result if it ran), and a wait on it ends.
TEST(runtime, QueuedWorkCompletesAfterTheRuntimeIsDestroyed) {
  with_watchdog(std::chrono::seconds(60), [] {
    stream s;
    pending<void> running, queued, synced;
    std::promise<void> started, release;
    auto gate = release.get_future().share();
    {
      runtime_options o;
      o.use_environment = false;
      o.backend = backend_selection::cpu;
      o.cpu_compute_units = 1;
      runtime rt(o);
      s = rt.device(0).make_stream();
      auto buf = rt.device(0).alloc<std::uint32_t>(64);
      running = s.host_func([&started, gate] {
        started.set_value();
        gate.wait();
      });
      started.get_future().wait();
      queued = s.fill(buf, 1);
      synced = s.synchronize();
    }
    release.set_value();
    std::error_code ec;
    running.wait(ec);
    EXPECT_FALSE(ec) << ec.message();
    queued.wait(ec);
    EXPECT_EQ(ec, errc::runtime_shut_down);
    synced.wait(ec);
    EXPECT_EQ(ec, errc::runtime_shut_down);
  });
}

// A host function's capture can hold the last reference to its device: once the runtime and
// every other handle are gone, the CPU worker that ran the function drops it. Destroying the
// device joins its workers, so that must then happen on another thread (it ended in
// std::terminate from ~thread).
TEST(runtime, ADeviceReleasedByItsOwnWorkerIsDestroyedOnAnotherThread) {
  // Dropped on the worker, when the finished function's capture is destroyed: it first waits
  // until the test has let go of everything else.
  struct last_reference {
    last_reference(std::shared_ptr<detail::device_state> d, std::shared_future<void> gone,
                   std::atomic<bool>* worker, std::atomic<bool>* last)
        : device(std::move(d)), others_gone(std::move(gone)), on_worker(worker), was_last(last) {}
    last_reference(const last_reference&) = delete;
    std::shared_ptr<detail::device_state> device;
    std::shared_future<void> others_gone;
    std::atomic<bool>* on_worker;
    std::atomic<bool>* was_last;
    ~last_reference() {
      *on_worker = device->backend->on_own_thread();
      others_gone.wait();
      // Then this is the last reference, once the engine has let the stream go (a liveness
      // bound only).
      for (int i = 0; i < 10'000 && device.use_count() > 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      *was_last = device.use_count() == 1;
      device.reset();
    }
  };
  with_watchdog(std::chrono::seconds(60), [] {
    std::weak_ptr<detail::device_state> device;
    std::atomic<bool> on_worker{false}, was_last{false};
    std::promise<void> others_gone;
    {
      runtime_options o;
      o.use_environment = false;
      o.backend = backend_selection::cpu;
      runtime rt(o);
      device = rt.device(0).state();
      EXPECT_FALSE(rt.device(0).state()->backend->on_own_thread());
      auto s = rt.device(0).make_stream();
      s.host_func([last = std::make_shared<last_reference>(
                       rt.device(0).state(), others_gone.get_future().share(), &on_worker,
                       &was_last)] {})
          .wait();
    }
    others_gone.set_value();
    // Liveness only: the device goes once its last holder let go.
    for (int t = 0; t < 10'000 && !device.expired(); ++t)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(device.expired());
    EXPECT_TRUE(on_worker) << "the capture was destroyed on one of the device's own threads";
    EXPECT_TRUE(was_last) << "the capture held the device's last reference";
  });
}

TEST(runtime, CpuDevicesComeFromTheEnvironment) {
  env_var backend("CORA_BACKEND", "cpu");
  env_var devices("CORA_CPU_DEVICES", "3");
  runtime rt;
  ASSERT_EQ(rt.device_count(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rt.device(i).backend(), backend_kind::cpu);
    EXPECT_EQ(rt.device(i).properties().ordinal, i);
  }
}

TEST(runtime, BadCpuDeviceCountIsRefused) {
  env_var backend("CORA_BACKEND", "cpu");
  for (const char* bad : {"0", "-1", "two", "65"}) {
    env_var devices("CORA_CPU_DEVICES", bad);
    EXPECT_CORA_ERROR(runtime(), errc::invalid_argument);
  }
}

}  // namespace
}  // namespace cora::test
