#include "cora/graph.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/io_context.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_device.hpp"
#include "core/state.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

int stress_scale() {
  const char* s = std::getenv("CORA_STRESS_SCALE");
  return s ? std::max(1, std::atoi(s)) : 100;
}

class graph_test : public device_test {
 protected:
  static constexpr std::size_t n = 4096;

  // Inputs and outputs of the add pipeline: hz = hx + hy through device memory.
  struct pipeline {
    device_buffer<float> x, y, z;
    host_buffer<float> hx, hy, hz;
  };
  pipeline make_pipeline() {
    pipeline p{dev().alloc<float>(n), dev().alloc<float>(n), dev().alloc<float>(n),
               dev().alloc_host<float>(n), dev().alloc_host<float>(n), dev().alloc_host<float>(n)};
    for (std::size_t i = 0; i < n; ++i) {
      p.hx[i] = static_cast<float>(i) * 0.37f;
      p.hy[i] = 1.0f / static_cast<float>(i + 1);
      p.hz[i] = -1.0f;
    }
    return p;
  }
  // The pipeline's ops, on `s` (eager or capturing).
  void enqueue(stream& s, pipeline& p) {
    (void)s.copy(p.x, p.hx);
    (void)s.copy(p.y, p.hy);
    (void)s.fill(p.z, 0x5a);
    (void)s.launch(kernels().kernel("add_f32"), {.grid = 6}, p.x, p.y, p.z, std::uint64_t{n});
    (void)s.copy(p.hz, p.z);
  }
  static bool same_bits(const host_buffer<float>& a, const host_buffer<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
  }
};
CORA_DEVICE_SUITE(graph_test);

TEST_P(graph_test, CapturedPipelineMatchesTheEagerRun) {
  auto s = dev().make_stream();
  auto eager = make_pipeline();
  enqueue(s, eager);
  s.synchronize().wait();

  auto p = make_pipeline();
  graph g = s.capture([&](stream& cs) { enqueue(cs, p); }).wait();
  ASSERT_EQ(g.size(), 5u);
  EXPECT_EQ(g.kind(g.node(3)), graph_node_kind::launch);
  // Capturing ran nothing.
  s.synchronize().wait();
  EXPECT_EQ(p.hz[7], -1.0f);

  graph_exec exec = g.instantiate();
  exec.launch(s).wait();
  EXPECT_TRUE(same_bits(p.hz, eager.hz));
  EXPECT_EQ(p.hz[10], eager.hx[10] + eager.hy[10]);
}

TEST_P(graph_test, CaptureIsAwaitableInATask) {
  auto s = dev().make_stream();
  auto eager = make_pipeline();
  enqueue(s, eager);
  s.synchronize().wait();
  auto p = make_pipeline();
  sync_wait([&]() -> task<void> {
    graph g = co_await s.capture([&](stream& cs) { enqueue(cs, p); });
    graph_exec exec = g.instantiate();
    co_await exec.launch(s);
    co_await exec.launch(s);  // replays are idempotent here
  }());
  EXPECT_TRUE(same_bits(p.hz, eager.hz));
}

TEST_P(graph_test, ExplicitGraphMatchesTheEagerRun) {
  auto s = dev().make_stream();
  auto eager = make_pipeline();
  enqueue(s, eager);
  s.synchronize().wait();

  auto p = make_pipeline();
  graph g(dev());
  const graph_node cx = g.add_copy(p.x.data(), p.hx.data(), p.x.size_bytes());
  const graph_node cy = g.add_copy(p.y.data(), p.hy.data(), p.y.size_bytes());
  const graph_node fz = g.add_fill(p.z.data(), 0x5a, p.z.size_bytes());
  const graph_node add =
      g.add_launch({cx, cy, fz}, kernels().kernel("add_f32"), {.grid = 6}, p.x, p.y, p.z, std::uint64_t{n});
  g.add_copy(add, p.hz.data(), p.z.data(), p.z.size_bytes());
  graph_exec exec = g.instantiate();
  exec.launch(s).wait();
  EXPECT_TRUE(same_bits(p.hz, eager.hz));
}

TEST_P(graph_test, TilingKernelMatchesTheEagerRun) {
  auto bin = dev().load_binary(kernel_file("add_custom_tiling.corabin")).wait();
  auto k = bin.kernel("add_custom");
  constexpr std::size_t len = 8 * 2048;
  auto x = dev().alloc<half>(len), y = dev().alloc<half>(len), z1 = dev().alloc<half>(len),
       z2 = dev().alloc<half>(len);
  auto tiling = dev().alloc<std::int32_t>(2);
  auto hx = dev().alloc_host<half>(len), hy = dev().alloc_host<half>(len), h1 = dev().alloc_host<half>(len),
       h2 = dev().alloc_host<half>(len);
  auto ht = dev().alloc_host<std::int32_t>(2);
  for (std::size_t i = 0; i < len; ++i) {
    hx[i] = half(static_cast<float>(i % 97) * 0.25f);
    hy[i] = half(static_cast<float>(i % 13) - 6.0f);
  }
  ht[0] = static_cast<std::int32_t>(len);
  ht[1] = 8;
  auto s = dev().make_stream();
  const launch_config cfg{.grid = 8};
  (void)s.copy(x, hx);
  (void)s.copy(y, hy);
  (void)s.copy(tiling, ht);
  (void)s.launch(k, cfg, x, y, z1, tiling.data(), tiling.data() + 1);
  s.copy(h1, z1).wait();

  graph g = s.capture([&](stream& cs) {
               (void)cs.launch(k, cfg, x, y, z2, tiling.data(), tiling.data() + 1);
               (void)cs.copy(h2, z2);
             }).wait();
  g.instantiate().launch(s).wait();
  EXPECT_EQ(std::memcmp(h1.data(), h2.data(), h1.size_bytes()), 0);
  EXPECT_EQ(float(h2[100]), float(hx[100]) + float(hy[100]));
}

TEST_P(graph_test, ReplaysWithNewArgumentsEveryTime) {
  constexpr std::size_t m = 256;
  auto s = dev().make_stream();
  auto x = dev().alloc<float>(m);
  auto in = dev().alloc_host<float>(m), out = dev().alloc_host<float>(m);
  auto scale = kernels().kernel("scale_7");
  graph g = s.capture([&](stream& cs) {
               (void)cs.copy(x, in);
               (void)cs.launch(scale, {.grid = 2}, x, 1.0f, std::uint64_t{m});
               (void)cs.copy(out, x);
             }).wait();
  const graph_node launch_node = g.node(1);
  graph_exec exec = g.instantiate();
  const int replays = 100 * stress_scale();
  for (int r = 0; r < replays; ++r) {
    const float factor = static_cast<float>(r % 9) - 4.0f;
    for (std::size_t i = 0; i < m; ++i) in[i] = static_cast<float>(r + i);
    exec.set_launch_args(launch_node, x, factor, std::uint64_t{m});
    exec.launch(s).wait();
    for (std::size_t i = 0; i < m; ++i)
      ASSERT_EQ(out[i], static_cast<float>(r + i) * factor) << "replay " << r << ", element " << i;
  }
}

TEST_P(graph_test, ArgumentChangesRacingLaunchesAreSeenWhole) {
  constexpr std::size_t m = 64;
  auto s = dev().make_stream();
  auto x = dev().alloc<float>(m);
  auto in = dev().alloc_host<float>(m), out = dev().alloc_host<float>(m);
  for (std::size_t i = 0; i < m; ++i) in[i] = static_cast<float>(i + 1);
  graph g = s.capture([&](stream& cs) {
               (void)cs.copy(x, in);
               (void)cs.launch(kernels().kernel("scale_7"), {.grid = 2}, x, 2.0f, std::uint64_t{m});
               (void)cs.copy(out, x);
             }).wait();
  graph_exec exec = g.instantiate();
  std::atomic<bool> stop{false};
  std::thread changer([&] {
    for (int i = 0; !stop; ++i) exec.set_launch_args(g.node(1), x, i % 2 ? 3.0f : 2.0f, std::uint64_t{m});
  });
  const int launches = 5 * stress_scale();
  for (int r = 0; r < launches; ++r) {
    exec.launch(s).wait();
    const float factor = out[0] / in[0];
    ASSERT_TRUE(factor == 2.0f || factor == 3.0f) << factor;
    for (std::size_t i = 0; i < m; ++i) ASSERT_EQ(out[i], in[i] * factor) << "launch " << r << ", element " << i;
  }
  stop = true;
  changer.join();
}

TEST_P(graph_test, SetLaunchArgsIsCheckedLikeALaunch) {
  auto s = dev().make_stream();
  auto x = dev().alloc<float>(16);
  graph g(dev());
  const graph_node copy = g.add_fill(x.data(), 0, x.size_bytes());
  const graph_node l = g.add_launch(copy, kernels().kernel("scale_7"), {}, x, 2.0f, std::uint64_t{16});
  graph_exec exec = g.instantiate();
  EXPECT_CORA_ERROR(exec.set_launch_args(l, x, 2.0f), errc::argument_mismatch);
  EXPECT_CORA_ERROR(exec.set_launch_args(l, x, 2.0, std::uint64_t{16}), errc::argument_mismatch);
  int on_host = 0;
  EXPECT_CORA_ERROR(exec.set_launch_args(l, reinterpret_cast<float*>(&on_host), 2.0f, std::uint64_t{16}),
                    errc::invalid_pointer);
  EXPECT_CORA_ERROR(exec.set_launch_args(copy, x, 2.0f, std::uint64_t{16}), errc::invalid_argument);
  EXPECT_CORA_ERROR(exec.set_copy(l, x.data(), x.data(), 4), errc::invalid_argument);
  exec.launch(s).wait();
}

TEST_P(graph_test, SetCopyRedirectsACopyNode) {
  auto s = dev().make_stream();
  auto a = dev().alloc<std::uint32_t>(64), b = dev().alloc<std::uint32_t>(64);
  auto h = dev().alloc_host<std::uint32_t>(64);
  graph g(dev());
  const graph_node fa = g.add_fill(a.data(), 0x11, a.size_bytes());
  const graph_node fb = g.add_fill(b.data(), 0x22, b.size_bytes());
  const graph_node back = g.add_copy({fa, fb}, h.data(), a.data(), a.size_bytes());
  graph_exec exec = g.instantiate();
  exec.launch(s).wait();
  EXPECT_EQ(h[5], 0x11111111u);
  exec.set_copy(back, h.data(), b.data(), b.size_bytes());
  exec.launch(s).wait();
  EXPECT_EQ(h[5], 0x22222222u);
  EXPECT_CORA_ERROR(exec.set_copy(back, h.data(), b.data(), b.size_bytes() + 4), errc::out_of_range);
}

TEST_P(graph_test, UpdateInPlaceOrByInstantiatingAnew) {
  auto s = dev().make_stream();
  auto a = dev().alloc<std::uint8_t>(32);
  auto h = dev().alloc_host<std::uint8_t>(32);
  auto build = [&](std::uint8_t value, bool extra) {
    graph g(dev());
    graph_node f = g.add_fill(a.data(), value, 32);
    if (extra) f = g.add_fill(f, a.data(), static_cast<std::uint8_t>(value + 1), 16);
    g.add_copy(f, h.data(), a.data(), 32);
    return g;
  };
  graph_exec exec = build(1, false).instantiate();
  exec.launch(s).wait();
  EXPECT_EQ(h[31], 1);
  EXPECT_EQ(exec.update(build(7, false)), graph_update::in_place);
  exec.launch(s).wait();
  EXPECT_EQ(h[31], 7);
  EXPECT_EQ(exec.update(build(9, true)), graph_update::reinstantiated);
  exec.launch(s).wait();
  EXPECT_EQ(h[0], 10);
  EXPECT_EQ(h[31], 9);
}

TEST_P(graph_test, HostCallsRunInDependencyOrder) {
  auto s = dev().make_stream();
  std::vector<int> seen;
  std::mutex m;
  auto note = [&](int i) {
    return [&, i] {
      std::lock_guard lock(m);
      seen.push_back(i);
    };
  };
  graph g(dev());
  const graph_node a = g.add_host_call(note(1));
  const graph_node b = g.add_host_call(a, note(2));
  const graph_node c = g.add_host_call(a, note(3));
  const graph_node j = g.add_empty({b, c});
  g.add_host_call(j, note(4));
  graph_exec exec = g.instantiate();
  exec.launch(s).wait();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen.front(), 1);
  EXPECT_EQ(seen.back(), 4);
  EXPECT_CORA_ERROR(g.add_empty({graph_node{99}}), errc::out_of_range);
}

TEST_P(graph_test, ForksAndJoinsAcrossTwoStreams) {
  auto s1 = dev().make_stream(), s2 = dev().make_stream();
  auto p = make_pipeline();
  auto scale = kernels().kernel("scale_7");
  event forked = dev().make_event(), joined = dev().make_event();
  s1.begin_capture();
  (void)s1.copy(p.x, p.hx);
  (void)s1.copy(p.y, p.hy);
  (void)s1.record(forked);
  (void)s2.wait(forked);  // s2 joins the capture
  EXPECT_TRUE(s2.capturing());
  (void)s2.launch(scale, {.grid = 3}, p.y, 2.0f, std::uint64_t{n});
  (void)s2.record(joined);
  (void)s1.launch(scale, {.grid = 3}, p.x, 3.0f, std::uint64_t{n});
  (void)s1.wait(joined);  // joined back
  (void)s1.launch(kernels().kernel("add_f32"), {.grid = 4}, p.x, p.y, p.z, std::uint64_t{n});
  (void)s1.copy(p.hz, p.z);
  graph g = s1.end_capture();
  EXPECT_FALSE(s1.capturing());
  EXPECT_FALSE(s2.capturing());
  EXPECT_EQ(g.size(), 6u);
  g.instantiate().launch(s1).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(p.hz[i], p.hx[i] * 3.0f + p.hy[i] * 2.0f) << i;
  // s2 works normally again.
  s2.fill(p.z, 0).wait();
}

TEST_P(graph_test, AForkThatIsNotJoinedBackAbandonsTheCapture) {
  auto s1 = dev().make_stream(), s2 = dev().make_stream();
  auto x = dev().alloc<std::uint32_t>(8);
  event forked = dev().make_event();
  s1.begin_capture();
  (void)s1.fill(x, 1);
  (void)s1.record(forked);
  (void)s2.wait(forked);
  (void)s2.fill(x, 2);
  EXPECT_CORA_ERROR(s1.end_capture(), errc::illegal_in_capture);
  EXPECT_FALSE(s2.capturing());
  s2.fill(x, 3).wait();
}

TEST_P(graph_test, IllegalOpsAbandonTheCaptureNamingTheOp) {
  auto s = dev().make_stream();
  auto x = dev().alloc<std::uint32_t>(8);
  {
    s.begin_capture();
    EXPECT_CORA_ERROR(s.begin_capture(), errc::illegal_in_capture);
    (void)s.fill(x, 1);
    EXPECT_CORA_ERROR(s.synchronize().wait(), errc::illegal_in_capture);
    try {
      (void)s.end_capture();
      ADD_FAILURE() << "the capture was not abandoned";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::illegal_in_capture));
      EXPECT_NE(std::string(e.what()).find("stream.synchronize()"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s.capturing());
  }
  {
    // A wait for an event recorded outside the capture.
    event outside = dev().make_event();
    auto other = dev().make_stream();
    (void)other.fill(x, 2);
    (void)other.record(outside);
    s.begin_capture();
    EXPECT_CORA_ERROR(s.wait(outside).wait(), errc::illegal_in_capture);
    EXPECT_CORA_ERROR(s.end_capture(), errc::illegal_in_capture);
  }
  {
    // An op that fails its checks abandons the capture with its own error.
    s.begin_capture();
    int on_stack = 0;
    EXPECT_CORA_ERROR(s.launch(kernels().kernel("scale_7"), {}, reinterpret_cast<float*>(&on_stack), 1.0f,
                               std::uint64_t{1})
                          .wait(),
                      errc::invalid_pointer);
    EXPECT_CORA_ERROR(s.end_capture(), errc::invalid_pointer);
  }
  {
    // A file read enqueues its copies later, as the file is read: it cannot be captured.
    s.begin_capture();
    EXPECT_CORA_ERROR(s.read_file(x.data(), "/dev/null", 0, 4).wait(), errc::illegal_in_capture);
    EXPECT_CORA_ERROR(s.end_capture(), errc::illegal_in_capture);
  }
  {
    // A capture body that throws leaves no capture behind.
    EXPECT_THROW((void)s.capture([](stream&) { throw std::runtime_error("body"); }), std::runtime_error);
    EXPECT_FALSE(s.capturing());
  }
  EXPECT_CORA_ERROR(s.end_capture(), errc::invalid_argument);
  // The stream is usable afterwards, with no sticky error left by the capture.
  s.fill(x, 4).wait();
  s.synchronize().wait();
}

TEST_P(graph_test, FaultInsideAGraphReachesEveryWaiter) {
  CORA_SKIP_FAULTS_ON_GPU();
  auto s = dev().make_stream();
  auto out = dev().alloc<std::uint32_t>(4);
  auto after_flag = dev().alloc_host<std::uint32_t>(1);
  after_flag[0] = 0;
  graph g(dev());
  const graph_node f = g.add_fill(out.data(), 0, out.size_bytes());
  const graph_node t = g.add_launch(f, kernels().kernel("trap"), {.grid = 2}, out);
  g.add_host_call(t, [&] { after_flag[0] = 1; });
  graph_exec exec = g.instantiate();
  auto first = exec.launch(s);
  auto later = s.fill(out, 0);
  asio::io_context ctx;
  std::error_code e1, e2;
  first.async_wait(asio::bind_executor(ctx, [&](std::error_code ec) { e1 = ec; }));
  later.async_wait(asio::bind_executor(ctx, [&](std::error_code ec) { e2 = ec; }));
  ctx.run();
  EXPECT_EQ(e1, make_error_code(errc::kernel_fault));
  EXPECT_EQ(e2, make_error_code(errc::kernel_fault));
  EXPECT_EQ(after_flag[0], 0u) << "a node after the faulting one ran";
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::kernel_fault);
  // Cleared: the stream and a good graph work again.
  graph good(dev());
  good.add_fill(out.data(), 1, out.size_bytes());
  good.instantiate().launch(s).wait();
}

TEST_P(graph_test, InjectedFaultInAGraphNodeFailsTheLaunch) {
  if (GetParam() != backend::cpu) GTEST_SKIP() << "fault injection is a CPU device hook";
  auto* cpu = dynamic_cast<cora::backend::cpu::cpu_device*>(dev().state()->backend.get());
  ASSERT_NE(cpu, nullptr);
  auto s = dev().make_stream();
  auto x = dev().alloc<float>(16);
  graph g(dev());
  g.add_launch(kernels().kernel("scale_7"), {}, x, 2.0f, std::uint64_t{16});
  graph_exec exec = g.instantiate();
  cpu->faults().kernel_traps = 1;
  EXPECT_CORA_ERROR(exec.launch(s).wait(), errc::kernel_fault);
  EXPECT_CORA_ERROR(s.synchronize().wait(), errc::kernel_fault);
  exec.launch(s).wait();
}

TEST_P(graph_test, CancellingAWaitLeavesTheGraphRunning) {
  auto s = dev().make_stream();
  auto flag = dev().alloc<std::uint32_t>(1);
  std::atomic<bool> done{false};
  graph g(dev());
  const graph_node f = g.add_fill(flag.data(), 0, 4);
  const graph_node k = g.add_launch(f, kernels().kernel("slow"), {}, std::uint64_t{200000}, flag);
  g.add_host_call(k, [&] { done = true; });
  graph_exec exec = g.instantiate();
  asio::io_context ctx;
  asio::cancellation_signal sig;
  std::error_code got;
  exec.launch(s).async_wait(
      asio::bind_cancellation_slot(sig.slot(), asio::bind_executor(ctx, [&](std::error_code ec) { got = ec; })));
  asio::post(ctx, [&] { sig.emit(asio::cancellation_type::terminal); });
  ctx.run();
  EXPECT_EQ(got, asio::error::operation_aborted);
  EXPECT_FALSE(done) << "the graph had already run";
  s.synchronize().wait();
  EXPECT_TRUE(done);
}

TEST_P(graph_test, DestroyingAnExecWhileItRunsLetsItFinish) {
  auto s = dev().make_stream();
  auto flag = dev().alloc<std::uint32_t>(1);
  auto done = std::make_shared<std::atomic<bool>>(false);
  pending<void> running;
  {
    graph g(dev());
    const graph_node f = g.add_fill(flag.data(), 0, 4);
    const graph_node k = g.add_launch(f, kernels().kernel("slow"), {}, std::uint64_t{100000}, flag);
    g.add_host_call(k, [done] { *done = true; });
    graph_exec exec = g.instantiate();
    running = exec.launch(s);
  }
  EXPECT_FALSE(*done);
  running.wait();
  EXPECT_TRUE(*done);
}

TEST_P(graph_test, LaunchOnAnotherDeviceIsWrongDevice) {
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  o.cpu_devices = 2;
  runtime rt(o);
  auto b = rt.device(0).load_binary(kernel_file("test_kernels.corabin")).wait();
  auto x = rt.device(0).alloc<float>(4);
  graph g(rt.device(0));
  g.add_launch(b.kernel("scale_7"), {}, x, 1.0f, std::uint64_t{4});
  graph_exec exec = g.instantiate();
  auto s1 = rt.device(1).make_stream();
  EXPECT_CORA_ERROR(exec.launch(s1).wait(), errc::wrong_device);
  auto s0 = rt.device(0).make_stream();
  exec.launch(s0).wait();
  // A kernel of another device is refused while building too.
  graph other(rt.device(1));
  EXPECT_CORA_ERROR(other.add_launch(b.kernel("scale_7"), {}, x, 1.0f, std::uint64_t{4}), errc::wrong_device);
}

TEST_P(graph_test, ReplaysRecordOneMarkerEach) {
  auto s = dev().make_stream();
  auto x = dev().alloc<std::uint32_t>(16);
  graph g(dev());
  graph_node last = g.add_fill(x.data(), 1, x.size_bytes());
  for (int i = 0; i < 9; ++i) last = g.add_launch(last, kernels().kernel("empty"), {});
  graph_exec exec = g.instantiate();
  exec.launch(s).wait();
  const auto before = dev().state()->backend->markers_recorded();
  exec.launch(s).wait();
  EXPECT_EQ(dev().state()->backend->markers_recorded() - before, 1u);
}

}  // namespace
}  // namespace cora::test
