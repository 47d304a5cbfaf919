// A CANN host program, unchanged from how it is written for CANN: contexts, streams, events,
// host callbacks, ACLRT_LAUNCH_KERNEL launches and a kernel binary loaded from a file.
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclrtlaunch_add_custom.h"
#include "aclrtlaunch_scale.h"

#define CHECK_ACL(x)                                                                            \
  do {                                                                                          \
    aclError __ret = (x);                                                                       \
    if (__ret != ACL_ERROR_NONE) {                                                              \
      std::fprintf(stderr, "%s:%d aclError:%d %s\n", __FILE__, __LINE__, __ret,                 \
                   aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "");                          \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

namespace {

constexpr uint32_t kLength = 8 * 2048;
constexpr uint32_t kBlockDim = 8;
constexpr size_t kBytes = kLength * sizeof(float);

std::atomic<int> g_hostFuncCalls{0};
std::atomic<int> g_callbacks{0};
std::atomic<bool> g_stop{false};

void HostFunc(void* arg) {
  ++g_hostFuncCalls;
  *static_cast<int*>(arg) = 1;
}

void ReportCallback(void* userData) {
  ++g_callbacks;
  *static_cast<int*>(userData) = 2;
}

void* ReportThread(void*) {
  while (!g_stop) (void)aclrtProcessReport(10);
  return nullptr;
}

bool Check(const std::vector<float>& z, float factor) {
  for (uint32_t i = 0; i < kLength; ++i) {
    const float want = factor * (static_cast<float>(i) + 2.0f * static_cast<float>(i));
    if (z[i] != want) {
      std::fprintf(stderr, "z[%u] = %f, expected %f\n", i, z[i], want);
      return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  CHECK_ACL(aclInit(nullptr));
  int32_t deviceId = 0;
  CHECK_ACL(aclrtSetDevice(deviceId));
  aclrtContext context = nullptr;
  CHECK_ACL(aclrtCreateContext(&context, deviceId));
  aclrtStream stream = nullptr;
  CHECK_ACL(aclrtCreateStream(&stream));

  std::vector<float> x(kLength), y(kLength), z(kLength, 0.0f);
  for (uint32_t i = 0; i < kLength; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 2.0f * static_cast<float>(i);
  }
  void *xHost = nullptr, *zHost = nullptr;
  CHECK_ACL(aclrtMallocHost(&xHost, kBytes));
  CHECK_ACL(aclrtMallocHost(&zHost, kBytes));
  std::memcpy(xHost, x.data(), kBytes);
  void *xDevice = nullptr, *yDevice = nullptr, *zDevice = nullptr;
  CHECK_ACL(aclrtMalloc(&xDevice, kBytes, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_ACL(aclrtMalloc(&yDevice, kBytes, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_ACL(aclrtMalloc(&zDevice, kBytes, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_ACL(aclrtMemcpy(xDevice, kBytes, xHost, kBytes, ACL_MEMCPY_HOST_TO_DEVICE));
  CHECK_ACL(aclrtMemcpyAsync(yDevice, kBytes, y.data(), kBytes, ACL_MEMCPY_HOST_TO_DEVICE, stream));

  // Events around the launch, and a host function after it.
  aclrtEvent start = nullptr, end = nullptr;
  CHECK_ACL(aclrtCreateEvent(&start));
  CHECK_ACL(aclrtCreateEventWithFlag(&end, ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC));
  CHECK_ACL(aclrtRecordEvent(start, stream));
  CHECK_ACL(ACLRT_LAUNCH_KERNEL(add_custom)(kBlockDim, stream, xDevice, yDevice, zDevice, kLength));
  CHECK_ACL(aclrtRecordEvent(end, stream));
  int hostFuncRan = 0;
  CHECK_ACL(aclrtLaunchHostFunc(stream, HostFunc, &hostFuncRan));

  // A callback delivered to a report thread.
  pthread_t reporter;
  pthread_create(&reporter, nullptr, ReportThread, nullptr);
  CHECK_ACL(aclrtSubscribeReport(static_cast<uint64_t>(reporter), stream));
  int callbackRan = 0;
  CHECK_ACL(aclrtLaunchCallback(ReportCallback, &callbackRan, ACL_CALLBACK_BLOCK, stream));

  CHECK_ACL(aclrtSynchronizeEvent(end));
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  CHECK_ACL(aclrtQueryEventStatus(end, &status));
  float ms = -1.0f;
  CHECK_ACL(aclrtEventElapsedTime(&ms, start, end));
  CHECK_ACL(aclrtSynchronizeStream(stream));
  CHECK_ACL(aclrtMemcpy(zHost, kBytes, zDevice, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
  std::memcpy(z.data(), zHost, kBytes);
  if (!Check(z, 1.0f) || status != ACL_EVENT_RECORDED_STATUS_COMPLETE || ms < 0.0f || hostFuncRan != 1 ||
      callbackRan != 2) {
    std::fprintf(stderr, "first launch: status %d, %f ms, host function %d, callback %d\n", status, ms,
                 hostFuncRan, callbackRan);
    return 1;
  }
  CHECK_ACL(aclrtUnSubscribeReport(static_cast<uint64_t>(reporter), stream));
  g_stop = true;
  pthread_join(reporter, nullptr);

  // A second thread shares the context: it makes it current and launches on its own stream,
  // ordered after this thread's work by an event.
  aclrtEvent ready = nullptr;
  CHECK_ACL(aclrtCreateEvent(&ready));
  CHECK_ACL(aclrtRecordEvent(ready, stream));
  int threadResult = -1;
  std::thread worker([&] {
    threadResult = [&]() -> int {
      aclrtContext none = nullptr;
      if (aclrtGetCurrentContext(&none) == ACL_SUCCESS) return 10;  // a new thread has none
      CHECK_ACL(aclrtSetCurrentContext(context));
      aclrtStream own = nullptr;
      CHECK_ACL(aclrtCreateStream(&own));
      CHECK_ACL(aclrtStreamWaitEvent(own, ready));
      CHECK_ACL(ACLRT_LAUNCH_KERNEL(scale)(kBlockDim, own, zDevice, 2.0f, kLength));
      CHECK_ACL(aclrtSynchronizeStream(own));
      CHECK_ACL(aclrtDestroyStream(own));
      return 0;
    }();
  });
  worker.join();
  if (threadResult != 0) return 1;
  CHECK_ACL(aclrtMemcpy(z.data(), kBytes, zDevice, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
  if (!Check(z, 2.0f)) return 1;

  // The same kernel from a kernel binary file.
  aclrtBinHandle binHandle = nullptr;
  CHECK_ACL(aclrtBinaryLoadFromFile(KERNEL_BINARY, nullptr, &binHandle));
  aclrtFuncHandle funcHandle = nullptr;
  CHECK_ACL(aclrtBinaryGetFunction(binHandle, "add_custom", &funcHandle));
  uint32_t n = kLength;
  void* args[] = {&xDevice, &yDevice, &zDevice, &n};
  CHECK_ACL(aclrtLaunchKernelWithArgsArray(funcHandle, kBlockDim, stream, nullptr, args));
  CHECK_ACL(aclrtSynchronizeStream(stream));
  CHECK_ACL(aclrtMemcpy(z.data(), kBytes, zDevice, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
  if (!Check(z, 1.0f)) return 1;
  CHECK_ACL(aclrtBinaryUnLoad(binHandle));

  // What cora cannot do is refused with CANN's code and a reason, never faked.
  aclrtNotify notify = nullptr;
  if (aclrtCreateNotify(&notify, 0) != ACL_ERROR_RT_FEATURE_NOT_SUPPORT || aclGetRecentErrMsg() == nullptr) return 1;

  CHECK_ACL(aclrtDestroyEvent(start));
  CHECK_ACL(aclrtDestroyEvent(end));
  CHECK_ACL(aclrtDestroyEvent(ready));
  CHECK_ACL(aclrtFree(xDevice));
  CHECK_ACL(aclrtFree(yDevice));
  CHECK_ACL(aclrtFree(zDevice));
  CHECK_ACL(aclrtFreeHost(xHost));
  CHECK_ACL(aclrtFreeHost(zHost));
  CHECK_ACL(aclrtDestroyStream(stream));
  CHECK_ACL(aclrtDestroyContext(context));
  CHECK_ACL(aclrtResetDevice(deviceId));
  CHECK_ACL(aclFinalize());
  std::printf("cann_layout: %s, add_custom %.3f ms\n", "ok", ms);
  return 0;
}
