#include "cora/event.hpp"

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

class event_test : public device_test {};
CORA_DEVICE_SUITE(event_test);

TEST_P(event_test, MeasuresTheTimeOfRecordedWork) {
  auto s = dev().make_stream();
  auto start = dev().make_event(), end = dev().make_event();
  auto flag = dev().alloc<std::uint32_t>(1);
  (void)s.record(start);
  (void)s.launch(kernels().kernel("slow"), {}, std::uint64_t{20000}, flag);
  (void)s.record(end);
  end.synchronize().wait();
  EXPECT_TRUE(end.ready());
  const double ms = event::elapsed(start, end).count();
  EXPECT_GE(ms, 19.0);
  EXPECT_LT(ms, 2000.0);
}

TEST_P(event_test, OrdersWorkAcrossStreams) {
  auto a = dev().make_stream(), b = dev().make_stream();
  auto ev = dev().make_event();
  auto flag = dev().alloc<std::uint32_t>(1);
  auto h = dev().alloc_host<std::uint32_t>(1);
  (void)a.fill(flag, 0);
  (void)a.launch(kernels().kernel("slow"), {}, std::uint64_t{30000}, flag);  // sets flag[0] = 1 at the end
  (void)a.record(ev);
  (void)b.wait(ev);
  b.copy(h, flag).wait();
  EXPECT_EQ(h[0], 1u) << "stream b read the flag before the event's work finished";
}

TEST_P(event_test, NeverRecordedEventIsReadyAndSynchronizesAtOnce) {
  auto ev = dev().make_event();
  EXPECT_TRUE(ev.ready());
  ev.synchronize().wait();
}

TEST_P(event_test, ElapsedNeedsBothRecordedAndTimingEvents) {
  auto s = dev().make_stream();
  auto a = dev().make_event(), b = dev().make_event();
  (void)s.record(a);
  std::error_code ec;
  event::elapsed(a, b, ec);
  EXPECT_EQ(ec, make_error_code(errc::not_ready));
  auto plain = dev().make_event({.timing = false});
  (void)s.record(plain);
  s.synchronize().wait();
  EXPECT_CORA_ERROR(event::elapsed(a, plain), errc::invalid_argument);
  EXPECT_CORA_ERROR(event::elapsed(a, event()), errc::invalid_handle);
}

TEST_P(event_test, RecordingOnAnotherDevicesStreamIsRejected) {
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  o.cpu_devices = 2;
  runtime rt(o);
  auto ev = rt.device(0).make_event();
  auto s = rt.device(1).make_stream();
  EXPECT_CORA_ERROR(s.record(ev).wait(), errc::wrong_device);
}

TEST_P(event_test, EventWaitIsAwaitableAndReRecordingMovesIt) {
  auto s = dev().make_stream();
  auto ev = dev().make_event();
  auto flag = dev().alloc<std::uint32_t>(1);
  (void)s.record(ev);
  auto first = ev.synchronize();
  (void)s.launch(kernels().kernel("slow"), {}, std::uint64_t{50000}, flag);
  (void)s.record(ev);
  first.wait();  // the first record completes before the slow kernel
  EXPECT_FALSE(ev.ready());
  ev.synchronize().wait();
  EXPECT_TRUE(ev.ready());
}

}  // namespace
}  // namespace cora::test
