// The C API: host functions, callbacks and report threads.
#include <atomic>
#include <future>

#include "support/acl_c_api.h"
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_callback_test : public acl_test {
 protected:
  // A report thread: subscribes to `stream`, then calls aclrtProcessReport until told to stop.
  class reporter {
   public:
    explicit reporter(aclrtStream stream) : stream_(stream) {
      std::promise<uint64_t> id;
      auto f = id.get_future();
      thread_ = std::thread([this, id = std::move(id)]() mutable {
        id.set_value(report_thread_id());
        subscribed_.wait();
        while (!stop_.load()) {
          const aclError e = aclrtProcessReport(10);
          if (e == ACL_SUCCESS) ++processed_;
          else if (e != ACL_ERROR_RT_REPORT_TIMEOUT) last_error_ = e;
        }
      });
      id_ = f.get();
      sub_result_ = aclrtSubscribeReport(id_, stream_);
      subscribed_.release();
    }
    ~reporter() { stop(); }
    void stop() {
      if (!thread_.joinable()) return;
      stop_ = true;
      thread_.join();
      (void)aclrtUnSubscribeReport(id_, stream_);
    }
    uint64_t id() const { return id_; }
    aclError subscribe_result() const { return sub_result_; }
    int processed() const { return processed_.load(); }
    aclError last_error() const { return last_error_.load(); }

   private:
    struct gate {
      std::promise<void> p;
      std::shared_future<void> f = p.get_future().share();
      void wait() { f.wait(); }
      void release() { p.set_value(); }
    } subscribed_;
    aclrtStream stream_;
    std::thread thread_;
    uint64_t id_ = 0;
    aclError sub_result_ = -1;
    std::atomic<bool> stop_{false};
    std::atomic<int> processed_{0};
    std::atomic<aclError> last_error_{ACL_SUCCESS};
  };
};
CORA_ACL_SUITE(acl_callback_test);

struct host_func_probe {
  const uint32_t* pinned;      // read by the host function: written by the copy before it
  uint32_t seen = 0;
  std::atomic<int> calls{0};
};

void probe_host_func_noop(void*) {}

void probe_host_func(void* arg) {
  auto* p = static_cast<host_func_probe*>(arg);
  p->seen = *p->pinned;
  ++p->calls;
}

TEST_P(acl_callback_test, HostFuncRunsInStreamOrder) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  uint32_t* pinned = nullptr;
  ASSERT_EQ(aclrtMallocHost(reinterpret_cast<void**>(&pinned), 4), ACL_SUCCESS);
  *pinned = 0;
  const uint32_t value = 0xc0ffee;
  void* d = upload(std::vector<uint32_t>{value});
  void* flag = dmalloc(4);
  uint64_t us = 50000;
  void* args[] = {&us, &flag};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, s, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpyAsync(pinned, 4, d, 4, ACL_MEMCPY_DEVICE_TO_HOST, s), ACL_SUCCESS);
  host_func_probe probe{pinned};
  ASSERT_EQ(aclrtLaunchHostFunc(s, probe_host_func, &probe), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(probe.calls.load(), 1);
  EXPECT_EQ(probe.seen, value);  // the copy before it had completed
  EXPECT_EQ(aclrtLaunchHostFunc(s, nullptr, &probe), ACL_ERROR_INVALID_PARAM);
  int bogus = 0;
  EXPECT_EQ(aclrtLaunchHostFunc(&bogus, probe_host_func, &probe), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

struct callback_probe {
  std::atomic<uint64_t> thread{0};
  std::atomic<int> calls{0};
  std::atomic<int> order{0};
};

void probe_callback(void* arg) {
  auto* p = static_cast<callback_probe*>(arg);
  p->thread = report_thread_id();
  p->order = ++p->calls;
}

void slow_callback(void* arg) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  probe_callback(arg);
}

TEST_P(acl_callback_test, CallbacksRunOnTheReportThread) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  reporter r(s);
  ASSERT_EQ(r.subscribe_result(), ACL_SUCCESS);
  callback_probe a, b;
  ASSERT_EQ(aclrtLaunchCallback(probe_callback, &a, ACL_CALLBACK_NO_BLOCK, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchCallback(probe_callback, &b, ACL_CALLBACK_BLOCK, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  // A blocking callback holds the stream until it has run, so both ran by now.
  EXPECT_EQ(b.calls.load(), 1);
  EXPECT_EQ(b.thread.load(), r.id());
  for (int i = 0; i < 500 && a.calls.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(a.calls.load(), 1);
  EXPECT_EQ(a.thread.load(), r.id());
  r.stop();
  EXPECT_EQ(r.last_error(), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_callback_test, BlockingCallbackHoldsLaterWork) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  reporter r(s);
  ASSERT_EQ(r.subscribe_result(), ACL_SUCCESS);
  callback_probe slow;
  ASSERT_EQ(aclrtLaunchCallback(slow_callback, &slow, ACL_CALLBACK_BLOCK, s), ACL_SUCCESS);
  // A host function after it sees the callback done.
  struct after_probe {
    callback_probe* cb;
    int seen = -1;
  } after{&slow};
  ASSERT_EQ(aclrtLaunchHostFunc(
                s, [](void* p) { static_cast<after_probe*>(p)->seen = static_cast<after_probe*>(p)->cb->calls.load(); },
                &after),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(after.seen, 1);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);  // unsubscribes; the reporter's own unsubscribe then fails quietly
}

TEST_P(acl_callback_test, SubscriptionMisuse) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  callback_probe p;
  EXPECT_EQ(aclrtLaunchCallback(probe_callback, &p, ACL_CALLBACK_BLOCK, s), ACL_ERROR_RT_STREAM_NO_CB_REG);
  EXPECT_EQ(aclrtLaunchCallback(nullptr, &p, ACL_CALLBACK_BLOCK, s), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(acl_c_launch_callback(probe_callback, &p, 2, s), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtProcessReport(100), ACL_ERROR_RT_THREAD_SUBSCRIBE);  // this thread serves nothing
  EXPECT_EQ(aclrtProcessReport(0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtProcessReport(-2), ACL_ERROR_INVALID_PARAM);
  const uint64_t me = report_thread_id();
  ASSERT_EQ(aclrtSubscribeReport(me, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtSubscribeReport(me, s), ACL_ERROR_RT_STREAM_SUBSCRIBE);      // one thread per stream
  EXPECT_EQ(aclrtSubscribeReport(me + 1, s), ACL_ERROR_RT_STREAM_SUBSCRIBE);
  EXPECT_EQ(aclrtProcessReport(5), ACL_ERROR_RT_REPORT_TIMEOUT);              // nothing to report
  EXPECT_EQ(aclrtUnSubscribeReport(me + 1, s), ACL_ERROR_RT_STREAM_SUBSCRIBE); // not that thread
  int bogus = 0;
  EXPECT_EQ(aclrtSubscribeReport(me, &bogus), ACL_ERROR_RT_INVALID_HANDLE);
  // The subscribed thread may also be the caller: a non-blocking callback waits for it.
  ASSERT_EQ(aclrtLaunchCallback(probe_callback, &p, ACL_CALLBACK_NO_BLOCK, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(p.calls.load(), 0);  // queued, not run: only aclrtProcessReport runs it
  ASSERT_EQ(aclrtProcessReport(5000), ACL_SUCCESS);
  EXPECT_EQ(p.calls.load(), 1);
  EXPECT_EQ(p.thread.load(), me);
  EXPECT_EQ(aclrtUnSubscribeReport(me, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtUnSubscribeReport(me, s), ACL_ERROR_RT_STREAM_SUBSCRIBE);
  EXPECT_EQ(aclrtProcessReport(5), ACL_ERROR_RT_THREAD_SUBSCRIBE);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_callback_test, UnsubscribeReleasesABlockedStream) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  const uint64_t me = report_thread_id();
  ASSERT_EQ(aclrtSubscribeReport(me, s), ACL_SUCCESS);
  callback_probe p;
  ASSERT_EQ(aclrtLaunchCallback(probe_callback, &p, ACL_CALLBACK_BLOCK, s), ACL_SUCCESS);
  aclrtStreamStatus status;
  for (int i = 0; i < 100; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(aclrtStreamQuery(s, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_STREAM_STATUS_NOT_READY);  // held by the undelivered callback
  ASSERT_EQ(aclrtUnSubscribeReport(me, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);  // released: the callback is dropped
  EXPECT_EQ(p.calls.load(), 0);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_callback_test, DefaultStreamCanBeSubscribed) {
  reporter r(nullptr);
  ASSERT_EQ(r.subscribe_result(), ACL_SUCCESS);
  callback_probe p;
  ASSERT_EQ(aclrtLaunchCallback(probe_callback, &p, ACL_CALLBACK_BLOCK, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_EQ(p.calls.load(), 1);
  EXPECT_EQ(p.thread.load(), r.id());
}

// --- aclrtSubscribeHostFunc: host functions run by a thread of the program ------------------------

void count_call(void* arg) { ++*static_cast<std::atomic<int>*>(arg); }

TEST_P(acl_callback_test, SubscribedThreadRunsHostFunctions) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  std::atomic<int> calls{0};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> runner_id{0};
  std::atomic<aclError> bad{ACL_SUCCESS};
  std::promise<uint64_t> id;
  auto idf = id.get_future();
  std::promise<void> go;
  auto gof = go.get_future();
  std::thread runner([&] {
    id.set_value(report_thread_id());
    gof.wait();
    while (!stop) {
      const aclError e = aclrtProcessHostFunc(10);
      if (e != ACL_SUCCESS && e != ACL_ERROR_RT_REPORT_TIMEOUT) bad = e;
    }
  });
  runner_id = idf.get();
  ASSERT_EQ(aclrtSubscribeHostFunc(runner_id, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtSubscribeHostFunc(runner_id, s), ACL_ERROR_RT_STREAM_SUBSCRIBE);  // twice
  go.set_value();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(aclrtLaunchHostFunc(s, count_call, &calls), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(calls.load(), 3);  // ran, by the subscribed thread, before the stream went on
  stop = true;
  runner.join();
  EXPECT_EQ(bad.load(), ACL_SUCCESS);
  ASSERT_EQ(aclrtUnSubscribeHostFunc(runner_id, s), ACL_SUCCESS);
  EXPECT_EQ(aclrtUnSubscribeHostFunc(runner_id, s), ACL_ERROR_RT_STREAM_SUBSCRIBE);  // twice
  // Unsubscribed: host functions run on cora's threads again.
  ASSERT_EQ(aclrtLaunchHostFunc(s, count_call, &calls), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(calls.load(), 4);
  // This thread runs no stream's host functions.
  EXPECT_EQ(aclrtProcessHostFunc(1), ACL_ERROR_RT_THREAD_SUBSCRIBE);
  EXPECT_EQ(aclrtProcessHostFunc(-5), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

// --- errors ----------------------------------------------------------------------------------

std::atomic<int> exception_calls{0};
std::atomic<uint32_t> exception_device{0xffffffffu}, exception_code{0}, exception_stream{0};
void on_exception(aclrtExceptionInfo* info) {
  ++exception_calls;
  exception_device = aclrtGetDeviceIdFromExceptionInfo(info);
  exception_code = aclrtGetErrorCodeFromExceptionInfo(info);
  exception_stream = aclrtGetStreamIdFromExceptionInfo(info);
}

TEST_P(acl_callback_test, LastErrorIsPerThread) {
  EXPECT_EQ(aclrtCreateStream(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);  // peeking keeps it
  aclError other = -1;
  on_thread([&] { other = aclrtGetLastError(ACL_RT_THREAD_LEVEL); });
  EXPECT_EQ(other, ACL_SUCCESS);  // another thread's last error is its own
  EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS);  // getting clears it
  EXPECT_EQ(aclrtGetLastError(static_cast<aclrtLastErrLevel>(1)), ACL_ERROR_INVALID_PARAM);
  uint32_t before = 0, after = 0;
  ASSERT_EQ(aclrtGetThreadLastTaskId(&before), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchHostFunc(nullptr, probe_host_func_noop, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetThreadLastTaskId(&after), ACL_SUCCESS);
  EXPECT_NE(after, before);
  EXPECT_EQ(aclrtGetThreadLastTaskId(nullptr), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

TEST_P(acl_callback_test, ExceptionCallbacksSeeTaskFailures) {
  aclrtErrorInfo info{};
  ASSERT_EQ(aclrtGetErrorVerbose(dev_, &info), ACL_SUCCESS);
  EXPECT_EQ(aclrtGetErrorVerbose(1000, &info), ACL_ERROR_RT_INVALID_DEVICEID);
  EXPECT_EQ(aclrtExceptionInfoCallbackRegister(nullptr), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclrtExceptionInfoCallbackRegister(on_exception), ACL_SUCCESS);
  EXPECT_EQ(aclrtExceptionInfoCallbackRegister(on_exception), ACL_ERROR_INVALID_PARAM);
  isolated_fault([&] {
    exception_calls = 0;
    aclrtStream s = nullptr;
    ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
    int32_t sid = -1;
    ASSERT_EQ(aclrtStreamGetId(s, &sid), ACL_SUCCESS);
    auto out = dmalloc(64);
    void* targs[] = {&out};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, s, nullptr, targs), ACL_SUCCESS);
    EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
    EXPECT_EQ(exception_calls.load(), 1);
    EXPECT_EQ(exception_device.load(), static_cast<uint32_t>(dev_));
    EXPECT_EQ(exception_code.load(), static_cast<uint32_t>(ACL_ERROR_RT_AICORE_EXCEPTION));
    EXPECT_EQ(exception_stream.load(), static_cast<uint32_t>(sid));
    aclrtErrorInfo e{};
    ASSERT_EQ(aclrtGetErrorVerbose(dev_, &e), ACL_SUCCESS);
    EXPECT_EQ(e.errorType, ACL_RT_ERROR_AICORE);
    EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_RT_AICORE_EXCEPTION);
  });
  ASSERT_EQ(aclrtExceptionInfoCallbackUnregister(on_exception), ACL_SUCCESS);
  EXPECT_EQ(aclrtExceptionInfoCallbackUnregister(on_exception), ACL_ERROR_INVALID_PARAM);
}

struct device_log {
  std::mutex m;
  std::vector<std::pair<int32_t, aclrtDeviceState>> seen;
};
void on_device_state(int32_t d, aclrtDeviceState st, void* args) {
  auto* log = static_cast<device_log*>(args);
  std::lock_guard lock(log->m);
  log->seen.emplace_back(d, st);
}

TEST_P(acl_callback_test, DeviceStateCallbacks) {
  device_log log;
  ASSERT_EQ(aclrtRegDeviceStateCallback("log", on_device_state, &log), ACL_SUCCESS);
  EXPECT_EQ(aclrtRegDeviceStateCallback("", on_device_state, &log), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtRegDeviceStateCallback("log", nullptr, nullptr), ACL_SUCCESS);
  ASSERT_EQ(log.seen.size(), 4u);
  EXPECT_EQ(log.seen[0], std::make_pair(dev_, ACL_RT_DEVICE_STATE_RESET_PRE));
  EXPECT_EQ(log.seen[1], std::make_pair(dev_, ACL_RT_DEVICE_STATE_RESET_POST));
  EXPECT_EQ(log.seen[2], std::make_pair(dev_, ACL_RT_DEVICE_STATE_SET_PRE));
  EXPECT_EQ(log.seen[3], std::make_pair(dev_, ACL_RT_DEVICE_STATE_SET_POST));
}

}  // namespace
}  // namespace cora::test
