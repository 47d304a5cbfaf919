// The C API: streams.
#include "support/acl_c_api.h"
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_stream_test : public acl_test {
 protected:
  // Launches `slow` (one block, `us` microseconds) that sets *flag when done.
  void launch_slow(aclrtStream s, void* flag, uint64_t us) {
    void* args[] = {&us, &flag};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, s, nullptr, args), ACL_SUCCESS)
        << aclGetRecentErrMsg();
  }
  void* zeroed_flag() {
    void* f = dmalloc(sizeof(uint32_t));
    EXPECT_EQ(aclrtMemset(f, 4, 0, 4), ACL_SUCCESS);
    return f;
  }
  // A zeroed 64-bit word for aclrtValueWait/Write: device memory on the CPU device, pinned host
  // memory on CUDA, whose stream memory operations do not take cora's pool memory.
  void* value_word() {
    void* p = nullptr;
    if (cuda()) {
      EXPECT_EQ(aclrtMallocHost(&p, 8), ACL_SUCCESS) << aclGetRecentErrMsg();
      if (p) __atomic_store_n(static_cast<uint64_t*>(p), uint64_t{0}, __ATOMIC_RELEASE);
    } else {
      p = dmalloc(8);
      EXPECT_EQ(aclrtMemset(p, 8, 0, 8), ACL_SUCCESS);
    }
    return p;
  }
  // The word's value once the tasks that wrote it have completed.
  uint64_t read_word(const void* p) {
    if (cuda()) return __atomic_load_n(static_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
    return download<uint64_t>(p, 1)[0];
  }
};
CORA_ACL_SUITE(acl_stream_test);

TEST_P(acl_stream_test, CreateUseDestroy) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_NE(s, nullptr);
  auto b = make_add(4096);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 4, s, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, MisuseCodes) {
  EXPECT_EQ(aclrtCreateStream(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyStream(nullptr), ACL_ERROR_INVALID_PARAM);  // the default stream stays
  EXPECT_EQ(aclrtDestroyStreamForce(nullptr), ACL_ERROR_INVALID_PARAM);
  int not_a_stream = 0;
  EXPECT_EQ(aclrtDestroyStream(&not_a_stream), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtSynchronizeStream(&not_a_stream), ACL_ERROR_RT_INVALID_HANDLE);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_ERROR_RT_INVALID_HANDLE);  // double destroy
  EXPECT_EQ(aclrtDestroyStreamForce(s), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_INVALID_HANDLE);  // use after destroy
  aclrtStreamStatus status;
  EXPECT_EQ(aclrtStreamQuery(s, &status), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtStreamQuery(nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_stream_test, CreateWithConfig) {
  aclrtStream s = nullptr;
  EXPECT_EQ(aclrtCreateStreamWithConfig(nullptr, 0, 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtCreateStreamWithConfig(&s, 8, 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtCreateStreamWithConfig(&s, 3, 0), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  for (uint32_t flag : {ACL_STREAM_PERSISTENT, ACL_STREAM_HUGE, ACL_STREAM_CPU_SCHEDULE, ACL_STREAM_DEVICE_USE_ONLY})
    EXPECT_EQ(aclrtCreateStreamWithConfig(&s, 0, flag | ACL_STREAM_FAST_LAUNCH), ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
        << flag;
  ASSERT_EQ(aclrtCreateStreamWithConfig(&s, 0, ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC), ACL_SUCCESS);
  auto flag = zeroed_flag();
  launch_slow(s, flag, 1000);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, CreateV2WithAConfigHandle) {
  aclrtStreamConfigHandle* cfg = aclrtCreateStreamConfigHandle();
  ASSERT_NE(cfg, nullptr);
  uint32_t prio = 0;
  size_t flag = ACL_STREAM_FAST_LAUNCH;
  EXPECT_EQ(aclrtSetStreamConfigOpt(cfg, ACL_RT_STREAM_PRIORITY, &prio, sizeof(prio)), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetStreamConfigOpt(cfg, ACL_RT_STREAM_FLAG, &flag, sizeof(flag)), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetStreamConfigOpt(cfg, ACL_RT_STREAM_FLAG, &flag, 1), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(acl_c_set_stream_config_opt(cfg, 9, &flag, sizeof(flag)), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtSetStreamConfigOpt(nullptr, ACL_RT_STREAM_FLAG, &flag, sizeof(flag)), ACL_ERROR_INVALID_PARAM);
  aclrtStream s = nullptr;
  EXPECT_EQ(aclrtCreateStreamV2(&s, nullptr), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclrtCreateStreamV2(&s, cfg), ACL_SUCCESS);
  uint32_t got = 99;
  ASSERT_EQ(aclrtStreamGetPriority(s, &got), ACL_SUCCESS);
  EXPECT_EQ(got, 0u);
  ASSERT_EQ(aclrtStreamGetFlags(s, &got), ACL_SUCCESS);
  EXPECT_EQ(got, ACL_STREAM_FAST_LAUNCH);
  int32_t id = -1, id2 = -1;
  ASSERT_EQ(aclrtStreamGetId(s, &id), ACL_SUCCESS);
  aclrtStream s2 = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s2), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamGetId(s2, &id2), ACL_SUCCESS);
  EXPECT_NE(id, id2);
  prio = 3;  // cora's streams have one priority
  ASSERT_EQ(aclrtSetStreamConfigOpt(cfg, ACL_RT_STREAM_PRIORITY, &prio, sizeof(prio)), ACL_SUCCESS);
  EXPECT_EQ(aclrtCreateStreamV2(&s2, cfg), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtDestroyStreamConfigHandle(cfg), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStreamConfigHandle(nullptr), ACL_ERROR_INVALID_PARAM);
  int32_t least = -1, greatest = -1;
  ASSERT_EQ(aclrtDeviceGetStreamPriorityRange(&least, &greatest), ACL_SUCCESS);
  EXPECT_EQ(least, 0);
  EXPECT_EQ(greatest, 0);
  EXPECT_EQ(aclrtStreamGetPriority(s, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  EXPECT_EQ(aclrtStreamGetFlags(s, &got), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_stream_test, FailureModeAndAttributes) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetStreamFailureMode(s, ACL_CONTINUE_ON_FAILURE), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetStreamFailureMode(s, 7), ACL_ERROR_INVALID_PARAM);  // no such mode
  int stale = 0;
  EXPECT_EQ(aclrtSetStreamFailureMode(&stale, ACL_CONTINUE_ON_FAILURE), ACL_ERROR_RT_INVALID_HANDLE);
  aclrtStreamAttrValue v{};
  ASSERT_EQ(aclrtGetStreamAttribute(s, ACL_STREAM_ATTR_FAILURE_MODE, &v), ACL_SUCCESS);
  EXPECT_EQ(v.failureMode, ACL_CONTINUE_ON_FAILURE);
  v.failureMode = ACL_CONTINUE_ON_FAILURE;
  EXPECT_EQ(aclrtSetStreamAttribute(s, ACL_STREAM_ATTR_FAILURE_MODE, &v), ACL_SUCCESS);
  v.userCustomTag = 5;
  EXPECT_EQ(aclrtSetStreamAttribute(s, ACL_STREAM_ATTR_USER_CUSTOM_TAG, &v), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtSetStreamAttribute(s, static_cast<aclrtStreamAttr>(7), &v), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetStreamAttribute(s, static_cast<aclrtStreamAttr>(0), &v), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetStreamAttribute(s, ACL_STREAM_ATTR_PRIORITY, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, StopOnFailureLeavesLaterTasksUnrun) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  if (GetParam() == backend::cuda) {
    EXPECT_EQ(aclrtSetStreamFailureMode(s, ACL_STOP_ON_FAILURE), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_NE(std::string(aclGetRecentErrMsg()).find("STOP_ON_FAILURE"), std::string::npos);
    EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
    return;
  }
  ASSERT_EQ(aclrtSetStreamFailureMode(s, ACL_STOP_ON_FAILURE), ACL_SUCCESS) << aclGetRecentErrMsg();
  aclrtStreamAttrValue v{};
  ASSERT_EQ(aclrtGetStreamAttribute(s, ACL_STREAM_ATTR_FAILURE_MODE, &v), ACL_SUCCESS);
  EXPECT_EQ(v.failureMode, ACL_STOP_ON_FAILURE);
  void* out = dmalloc(64);
  void* mark = dmalloc(8);
  ASSERT_EQ(aclrtMemset(mark, 8, 0, 8), ACL_SUCCESS);
  void* args[] = {&out};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, s, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWrite(mark, 5, 0, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
  EXPECT_EQ(download<uint64_t>(mark, 1)[0], 0u);  // the task behind the failed one did not run
  ASSERT_EQ(aclrtValueWrite(mark, 6, 0, s), ACL_SUCCESS);  // reported: the stream runs again
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(download<uint64_t>(mark, 1)[0], 6u);
  // Back to CONTINUE: the task behind a failure runs.
  v.failureMode = ACL_CONTINUE_ON_FAILURE;
  ASSERT_EQ(aclrtSetStreamAttribute(s, ACL_STREAM_ATTR_FAILURE_MODE, &v), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, s, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWrite(mark, 7, 0, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
  EXPECT_EQ(download<uint64_t>(mark, 1)[0], 7u);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, AbortDiscardsQueuedTasks) {
  void* word = value_word();
  void* mark = value_word();
  aclrtStream s = nullptr, other = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateStream(&other), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWait(word, 1, 1 /* EQ */, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWrite(mark, 5, 0, s), ACL_SUCCESS);
  if (cuda()) {
    EXPECT_EQ(aclrtStreamAbort(s), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_NE(aclGetRecentErrMsg(), nullptr);
    ASSERT_EQ(aclrtValueWrite(word, 1, 0, other), ACL_SUCCESS);
  } else {
    ASSERT_EQ(aclrtStreamAbort(s), ACL_SUCCESS) << aclGetRecentErrMsg();
    EXPECT_EQ(read_word(mark), 0u);  // the queued task was discarded
    EXPECT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);  // the abort is not reported as a failure
    ASSERT_EQ(aclrtValueWrite(mark, 6, 0, s), ACL_SUCCESS);  // the stream takes new work
    ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
    EXPECT_EQ(read_word(mark), 6u);
  }
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  int not_a_stream = 0;
  EXPECT_EQ(aclrtStreamAbort(&not_a_stream), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtDestroyStream(other), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

struct state_log {
  std::mutex m;
  std::vector<std::pair<aclrtStream, aclrtStreamState>> seen;
};
void on_stream_state(aclrtStream s, aclrtStreamState st, void* args) {
  auto* log = static_cast<state_log*>(args);
  std::lock_guard lock(log->m);
  log->seen.emplace_back(s, st);
}

TEST_P(acl_stream_test, StateCallbacksAndAvailableCount) {
  state_log log;
  EXPECT_EQ(aclrtRegStreamStateCallback(nullptr, on_stream_state, &log), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclrtRegStreamStateCallback("test", on_stream_state, &log), ACL_SUCCESS);
  uint32_t avail = 0, after = 0;
  ASSERT_EQ(aclrtGetStreamAvailableNum(&avail), ACL_SUCCESS);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetStreamAvailableNum(&after), ACL_SUCCESS);
  EXPECT_EQ(after + 1, avail);
  ASSERT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  ASSERT_EQ(aclrtRegStreamStateCallback("test", nullptr, nullptr), ACL_SUCCESS);  // unregisters
  aclrtStream s2 = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s2), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyStream(s2), ACL_SUCCESS);
  ASSERT_EQ(log.seen.size(), 2u);
  EXPECT_EQ(log.seen[0].first, s);
  EXPECT_EQ(log.seen[0].second, ACL_RT_STREAM_STATE_CREATE_POST);
  EXPECT_EQ(log.seen[1].second, ACL_RT_STREAM_STATE_DESTROY_PRE);
  EXPECT_EQ(aclrtGetStreamAvailableNum(nullptr), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_stream_test, ValueWriteAndWaitWithTimeout) {
  void* d = dmalloc(8);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  auto flag = zeroed_flag();
  launch_slow(s, flag, 20000);
  ASSERT_EQ(aclrtValueWrite(d, 0x1122334455667788ull, 0, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtValueWrite(d, 1, 1, s), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtValueWrite(nullptr, 1, 0, s), ACL_ERROR_INVALID_PARAM);
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
  ASSERT_EQ(aclrtRecordEvent(ev, s), ACL_SUCCESS);
  aclrtStream other = nullptr;
  ASSERT_EQ(aclrtCreateStream(&other), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamWaitEventWithTimeout(other, ev, 10000), ACL_SUCCESS);
  EXPECT_EQ(aclrtStreamWaitEventWithTimeout(other, ev, -2), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtStreamWaitEventWithFlag(other, ev, 0, ACL_EVENT_WAIT_EXTERNAL), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  uint64_t out = 0;
  void* host = &out;
  ASSERT_EQ(aclrtMemcpyAsync(host, 8, d, 8, ACL_MEMCPY_DEVICE_TO_HOST, other), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(other), ACL_SUCCESS);
  EXPECT_EQ(out, 0x1122334455667788ull);  // written in order after the slow kernel, read after the event
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(other), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, ValueWaitHoldsTheStreamUntilAValueWriteOfAnother) {
  void* word = value_word();
  void* flag = value_word();
  aclrtStream s = nullptr, writer = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateStream(&writer), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWait(word, 2, 0 /* GEQ */, s), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtValueWrite(flag, 1, 0, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWrite(word, 1, 0, writer), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(writer), ACL_SUCCESS);
  aclrtStreamStatus status = ACL_STREAM_STATUS_RESERVED;
  ASSERT_EQ(aclrtStreamQuery(s, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_STREAM_STATUS_NOT_READY);  // 1 < 2: still waiting
  EXPECT_EQ(read_word(flag), 0u);
  ASSERT_EQ(aclrtValueWrite(word, 2, 0, writer), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(read_word(flag), 1u);

  // EQ, AND, NOR on a word that satisfies them (it holds 2).
  ASSERT_EQ(aclrtValueWait(word, 2, 1, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWait(word, 3, 2, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWait(word, 1, 3, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);

  EXPECT_EQ(aclrtValueWait(nullptr, 0, 0, s), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtValueWait(word, 0, 4, s), ACL_ERROR_INVALID_PARAM);
  uint64_t pageable = 0;
  EXPECT_EQ(aclrtValueWait(&pageable, 0, 0, s), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtValueWait(static_cast<char*>(word) + 4, 0, 0, s), ACL_ERROR_RT_PARAM_INVALID);
  int not_a_stream = 0;
  EXPECT_EQ(aclrtValueWait(word, 0, 0, &not_a_stream), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtDestroyStream(writer), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

// aclrtMalloc's memory comes from a stream-ordered pool on CUDA, which the driver's stream memory
// operations refuse: a wait fails at once with a message that names aclrtMallocHost, and the
// stream goes on; a write lands (a stream-ordered copy). The CPU device takes both.
TEST_P(acl_stream_test, ValueWriteAndWaitOnDeviceMemory) {
  void* word = dmalloc(8);
  ASSERT_EQ(aclrtMemset(word, 8, 0, 8), ACL_SUCCESS);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtValueWrite(word, (uint64_t{1} << 33) | 4, 0, s), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(download<uint64_t>(word, 1)[0], (uint64_t{1} << 33) | 4);
  if (cuda()) {
    EXPECT_EQ(aclrtValueWait(word, 4, 2 /* AND */, s), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_NE(std::string(aclGetRecentErrMsg()).find("aclrtMallocHost"), std::string::npos) << aclGetRecentErrMsg();
  } else {
    ASSERT_EQ(aclrtValueWait(word, 4, 2 /* AND */, s), ACL_SUCCESS) << aclGetRecentErrMsg();
  }
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);  // a refused task leaves no failure behind
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, DestroyWaitsAndForceDoesNot) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  auto flag = zeroed_flag();
  launch_slow(s, flag, 50000);
  ASSERT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);  // finished before DestroyStream returned

  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  auto flag2 = zeroed_flag();
  aclrtEvent done = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&done), ACL_SUCCESS);
  launch_slow(s, flag2, 500000);
  ASSERT_EQ(aclrtRecordEvent(done, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyStreamForce(s), ACL_SUCCESS);
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
  ASSERT_EQ(aclrtQueryEventStatus(done, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_NOT_READY);  // still running: Force did not wait
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_INVALID_HANDLE);
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS);  // the device still finishes the work
  EXPECT_EQ(download<uint32_t>(flag2, 1)[0], 1u);
}

TEST_P(acl_stream_test, SynchronizeWithTimeout) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(s, -2), ACL_ERROR_RT_PARAM_INVALID);
  auto flag = zeroed_flag();
  launch_slow(s, flag, 300000);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(s, 1), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(s, -1), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(s, 0), ACL_SUCCESS);  // idle: at once
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, TimeoutDoesNotSwallowAFault) {
  isolated_fault([&] {
    aclrtStream s = nullptr;
    ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
    auto flag = zeroed_flag();
    launch_slow(s, flag, 200000);
    auto out = dmalloc(64);
    void* args[] = {&out};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, s, nullptr, args), ACL_SUCCESS);
    EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(s, 1), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
    EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
    EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  });
}

TEST_P(acl_stream_test, QueryTellsIdleFromBusy) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  aclrtStreamStatus status = ACL_STREAM_STATUS_RESERVED;
  ASSERT_EQ(aclrtStreamQuery(s, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_STREAM_STATUS_COMPLETE);
  auto flag = zeroed_flag();
  launch_slow(s, flag, 300000);
  ASSERT_EQ(aclrtStreamQuery(s, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_STREAM_STATUS_NOT_READY);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamQuery(s, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_STREAM_STATUS_COMPLETE);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_stream_test, DefaultStreamIsTheNullHandle) {
  auto b = make_add(1000);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 2, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
}

TEST_P(acl_stream_test, FaultSurfacesAtTheNextSynchronize) {
  isolated_fault([&] {
    aclrtStream s = nullptr;
    ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
    auto b = make_add(512);
    aclrtFuncHandle add = kernel("add_f32");  // looked up before the fault
    auto out = dmalloc(64);
    void* targs[] = {&out};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, s, nullptr, targs), ACL_SUCCESS);
    EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
    const std::string msg = aclGetRecentErrMsg();
    EXPECT_NE(msg.find("aclrtSynchronizeStream"), std::string::npos) << msg;
    void* args[] = {&b.x, &b.y, &b.z, &b.n};
    if (cuda()) {
      // The fault lost the GPU: new work fails at once.
      EXPECT_EQ(aclrtLaunchKernelWithArgsArray(add, 2, s, nullptr, args), ACL_ERROR_RT_LOST_HEARTBEAT);
      return;
    }
    // The CPU device reports a fault once and goes on.
    EXPECT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(add, 2, s, nullptr, args), ACL_SUCCESS);
    ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
    EXPECT_TRUE(add_done(b));
    EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  });
}

TEST_P(acl_stream_test, StreamsAreSharedByTheDevicesThreads) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  auto b = make_add(2048);
  on_thread([&] {
    ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
    void* args[] = {&b.x, &b.y, &b.z, &b.n};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 2, s, nullptr, args), ACL_SUCCESS);
    EXPECT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  });
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

class acl_stream_two_devices : public acl_two_device_test {};
CORA_ACL_SUITE(acl_stream_two_devices);

TEST_P(acl_stream_two_devices, DestroyOfAForeignStreamIsRefused) {
  aclrtStream mine = nullptr, foreign = nullptr;
  ASSERT_EQ(aclrtCreateStream(&mine), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(devices_[1]), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateStream(&foreign), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(foreign), ACL_ERROR_RT_STREAM_CONTEXT);
  EXPECT_EQ(aclrtDestroyStreamForce(foreign), ACL_ERROR_RT_STREAM_CONTEXT);
  on_thread([&] { EXPECT_EQ(aclrtDestroyStream(mine), ACL_ERROR_RT_CONTEXT_NULL); });  // no device there
  EXPECT_EQ(aclrtDestroyStream(mine), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(devices_[1]), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(foreign), ACL_SUCCESS);
}

}  // namespace
}  // namespace cora::test
