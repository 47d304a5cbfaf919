// The C API: events.
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_event_test : public acl_test {
 protected:
  void launch_slow(aclrtStream s, void* flag, uint64_t us) {
    void* args[] = {&us, &flag};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, s, nullptr, args), ACL_SUCCESS)
        << aclGetRecentErrMsg();
  }
};
CORA_ACL_SUITE(acl_event_test);

TEST_P(acl_event_test, CreateAndDestroy) {
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_ERROR_RT_INVALID_HANDLE);  // double destroy
  EXPECT_EQ(aclrtRecordEvent(ev, nullptr), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtCreateEvent(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyEvent(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtRecordEvent(nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtSynchronizeEvent(nullptr), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_event_test, Flags) {
  aclrtEvent ev = nullptr;
  EXPECT_EQ(aclrtCreateEventWithFlag(&ev, 0x4), ACL_ERROR_INVALID_PARAM);  // no such flag
  for (uint32_t f : {ACL_EVENT_CAPTURE_STREAM_PROGRESS, ACL_EVENT_DEVICE_USE_ONLY, ACL_EVENT_EXTERNAL, ACL_EVENT_IPC})
    EXPECT_EQ(aclrtCreateEventWithFlag(&ev, f | ACL_EVENT_SYNC), ACL_ERROR_RT_FEATURE_NOT_SUPPORT) << f;
  ASSERT_EQ(aclrtCreateEventWithFlag(&ev, ACL_EVENT_SYNC), ACL_SUCCESS);
  aclrtEvent timeline = nullptr;
  ASSERT_EQ(aclrtCreateEventWithFlag(&timeline, ACL_EVENT_TIME_LINE), ACL_SUCCESS);
  // Only ACL_EVENT_SYNC events can be waited for by a stream.
  EXPECT_EQ(aclrtStreamWaitEvent(nullptr, timeline), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtRecordEvent(ev, nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtStreamWaitEvent(nullptr, ev), ACL_SUCCESS);
  // Only timestamped events can be timed.
  ASSERT_EQ(aclrtRecordEvent(timeline, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  float ms = 0;
  EXPECT_EQ(aclrtEventElapsedTime(&ms, ev, timeline), ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyEvent(timeline), ACL_SUCCESS);
}

TEST_P(acl_event_test, RecordQuerySynchronize) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  ASSERT_EQ(aclrtQueryEventStatus(ev, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_COMPLETE);  // nothing captured yet
  EXPECT_EQ(aclrtQueryEventStatus(ev, nullptr), ACL_ERROR_INVALID_PARAM);

  void* flag = dmalloc(4);
  ASSERT_EQ(aclrtMemset(flag, 4, 0, 4), ACL_SUCCESS);
  launch_slow(s, flag, 200000);
  ASSERT_EQ(aclrtRecordEvent(ev, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtQueryEventStatus(ev, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_NOT_READY);
  ASSERT_EQ(aclrtSynchronizeEvent(ev), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);  // the captured work is done
  ASSERT_EQ(aclrtQueryEventStatus(ev, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_COMPLETE);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_event_test, SynchronizeWithTimeout) {
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(ev, -2), ACL_ERROR_RT_PARAM_INVALID);
  void* flag = dmalloc(4);
  ASSERT_EQ(aclrtMemset(flag, 4, 0, 4), ACL_SUCCESS);
  launch_slow(nullptr, flag, 300000);
  ASSERT_EQ(aclrtRecordEvent(ev, nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(ev, 1), ACL_ERROR_RT_EVENT_SYNC_TIMEOUT);
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(ev, 60000), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);
}

TEST_P(acl_event_test, ElapsedTimeCoversTheWorkBetween) {
  aclrtEvent start = nullptr, end = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&start), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateEvent(&end), ACL_SUCCESS);
  float ms = -1;
  EXPECT_EQ(aclrtEventElapsedTime(&ms, start, end), ACL_ERROR_RT_EVENT_NOT_COMPLETE);  // never recorded
  EXPECT_EQ(aclrtEventElapsedTime(nullptr, start, end), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtEventElapsedTime(&ms, nullptr, end), ACL_ERROR_INVALID_PARAM);
  void* flag = dmalloc(4);
  ASSERT_EQ(aclrtRecordEvent(start, nullptr), ACL_SUCCESS);
  launch_slow(nullptr, flag, 20000);
  ASSERT_EQ(aclrtRecordEvent(end, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtEventElapsedTime(&ms, start, end), ACL_SUCCESS) << aclGetRecentErrMsg();
  EXPECT_GE(ms, 19.0f);  // the kernel alone takes 20 ms
}

TEST_P(acl_event_test, StreamWaitEventOrdersStreams) {
  aclrtStream producer = nullptr, consumer = nullptr;
  ASSERT_EQ(aclrtCreateStream(&producer), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateStream(&consumer), ACL_SUCCESS);
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
  // producer: slow kernel, then z = x + y; consumer waits, then copies z out.
  void* flag = dmalloc(4);
  auto b = make_add(1 << 14);
  launch_slow(producer, flag, 100000);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 4, producer, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtRecordEvent(ev, producer), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamWaitEvent(consumer, ev), ACL_SUCCESS);
  void* copy = dmalloc(b.n * sizeof(float));
  ASSERT_EQ(aclrtMemcpyAsync(copy, b.n * sizeof(float), b.z, b.n * sizeof(float), ACL_MEMCPY_DEVICE_TO_DEVICE,
                             consumer),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(consumer), ACL_SUCCESS);
  const auto z = download<float>(copy, b.n);
  for (std::uint64_t i = 0; i < b.n; ++i) ASSERT_EQ(z[i], 3.0f * static_cast<float>(i)) << i;
  ASSERT_EQ(aclrtSynchronizeStream(producer), ACL_SUCCESS);
  EXPECT_EQ(aclrtStreamWaitEvent(consumer, nullptr), ACL_ERROR_INVALID_PARAM);
  int not_an_event = 0;
  EXPECT_EQ(aclrtStreamWaitEvent(consumer, &not_an_event), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_event_test, FaultBeforeTheEventSurfacesAtItsSynchronize) {
  isolated_fault([&] {
    aclrtEvent ev = nullptr;
    ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
    void* out = dmalloc(64);
    void* args[] = {&out};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, nullptr, nullptr, args), ACL_SUCCESS);
    ASSERT_EQ(aclrtRecordEvent(ev, nullptr), ACL_SUCCESS);
    EXPECT_EQ(aclrtSynchronizeEvent(ev), ACL_ERROR_RT_AICORE_EXCEPTION);
    EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_AICORE_EXCEPTION);  // the stream reports it too
  });
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // aclrtQueryEvent is tested too
TEST_P(acl_event_test, ExtendedForms) {
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEventExWithFlag(&ev, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE), ACL_SUCCESS);
  EXPECT_EQ(aclrtCreateEventExWithFlag(nullptr, 0), ACL_ERROR_INVALID_PARAM);
  aclrtEventWaitStatus ws = ACL_EVENT_WAIT_STATUS_COMPLETE;
  ASSERT_EQ(aclrtQueryEventWaitStatus(ev, &ws), ACL_SUCCESS);
  EXPECT_EQ(ws, ACL_EVENT_WAIT_STATUS_NOT_READY);  // never recorded
  uint64_t ts = 0;
  EXPECT_EQ(aclrtEventGetTimestamp(ev, &ts), ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID);  // no record yet
  auto flag = dmalloc(4);
  ASSERT_EQ(aclrtMemset(flag, 4, 0, 4), ACL_SUCCESS);
  aclrtEvent start = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&start), ACL_SUCCESS);
  ASSERT_EQ(aclrtRecordEventWithFlag(start, nullptr, ACL_EVENT_RECORD_DEFAULT), ACL_SUCCESS);
  launch_slow(nullptr, flag, 200000);
  ASSERT_EQ(aclrtRecordEventWithFlag(ev, nullptr, ACL_EVENT_RECORD_DEFAULT), ACL_SUCCESS);
  EXPECT_EQ(aclrtRecordEventWithFlag(ev, nullptr, 7), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtRecordEventWithFlag(ev, nullptr, ACL_EVENT_RECORD_EXTERNAL), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  aclrtEventStatus st = ACL_EVENT_STATUS_COMPLETE;
  ASSERT_EQ(aclrtQueryEvent(ev, &st), ACL_SUCCESS);
  EXPECT_EQ(st, ACL_EVENT_STATUS_NOT_READY);
  ASSERT_EQ(aclrtSynchronizeEvent(ev), ACL_SUCCESS);
  ASSERT_EQ(aclrtQueryEvent(ev, &st), ACL_SUCCESS);
  EXPECT_EQ(st, ACL_EVENT_STATUS_COMPLETE);
  ASSERT_EQ(aclrtQueryEventWaitStatus(ev, &ws), ACL_SUCCESS);
  EXPECT_EQ(ws, ACL_EVENT_WAIT_STATUS_COMPLETE);
  uint64_t t0 = 0, t1 = 0;
  ASSERT_EQ(aclrtEventGetTimestamp(start, &t0), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtEventGetTimestamp(ev, &t1), ACL_SUCCESS);
  EXPECT_GE(t1, t0 + 190000);  // microseconds: the 200 ms kernel ran between the two records
  // A reset event is unrecorded again.
  ASSERT_EQ(aclrtResetEvent(ev, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtQueryEventWaitStatus(ev, &ws), ACL_SUCCESS);
  EXPECT_EQ(ws, ACL_EVENT_WAIT_STATUS_NOT_READY);
  uint32_t id1 = 0, id2 = 0, avail = 0, avail2 = 0;
  ASSERT_EQ(aclrtGetEventId(ev, &id1), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetEventId(start, &id2), ACL_SUCCESS);
  EXPECT_NE(id1, id2);
  ASSERT_EQ(aclrtGetEventAvailNum(&avail), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyEvent(start), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetEventAvailNum(&avail2), ACL_SUCCESS);
  EXPECT_EQ(avail2, avail + 1);
  EXPECT_EQ(aclrtGetEventId(start, &id2), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtEventGetTimestamp(ev, nullptr), ACL_ERROR_INVALID_PARAM);
  aclrtEvent plain = nullptr;
  ASSERT_EQ(aclrtCreateEventWithFlag(&plain, ACL_EVENT_SYNC), ACL_SUCCESS);
  EXPECT_EQ(aclrtEventGetTimestamp(plain, &ts), ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID);
  EXPECT_EQ(aclrtDestroyEvent(plain), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_SUCCESS);
}

#pragma GCC diagnostic pop

class acl_event_two_devices : public acl_two_device_test {};
CORA_ACL_SUITE(acl_event_two_devices);

TEST_P(acl_event_two_devices, RecordOnAnotherDevicesStreamIsRefused) {
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(devices_[1]), ACL_SUCCESS);
  aclrtStream other = nullptr;
  ASSERT_EQ(aclrtCreateStream(&other), ACL_SUCCESS);
  EXPECT_EQ(aclrtRecordEvent(ev, other), ACL_ERROR_RT_STREAM_CONTEXT);
  EXPECT_EQ(aclrtDestroyStream(other), ACL_SUCCESS);
}

}  // namespace
}  // namespace cora::test
