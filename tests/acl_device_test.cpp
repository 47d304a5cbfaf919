// The C API: aclInit / aclFinalize, devices, device synchronization, aclGetRecentErrMsg.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <sys/syscall.h>
#include <unistd.h>

#include <asio/error.hpp>

#include "support/acl_c_api.h"
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

// --- without a fixture: the life cycle itself ------------------------------------------------------

TEST(acl_init_test, RepeatedInitAndFinalizeReturnTheirCodes) {
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclInit(nullptr), ACL_ERROR_REPEAT_INITIALIZE);  // counted, and reported
  EXPECT_NE(aclGetRecentErrMsg(), nullptr);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);  // one call releases everything
  EXPECT_EQ(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE);
  // Initializing again after a finalize starts over.
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  uint32_t count = 0;
  EXPECT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
  EXPECT_GE(count, 1u);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
}

// Issue 18, item 9: errors are mapped by meaning, whatever their category. A wait aborted by
// aclFinalize carries asio's operation_aborted; it gave ACL_ERROR_RT_INTERNAL_ERROR (507000).
TEST(acl_error_mapping_test, AbortedWaitsAreTaskAborts) {
  EXPECT_EQ(cora::acl::to_acl(asio::error::operation_aborted), ACL_ERROR_RT_DEVICE_TASK_ABORT);
  EXPECT_EQ(cora::acl::to_acl(std::make_error_code(std::errc::operation_canceled)), ACL_ERROR_RT_DEVICE_TASK_ABORT);
  EXPECT_EQ(cora::acl::to_acl(std::error_code(ECANCELED, std::system_category())), ACL_ERROR_RT_DEVICE_TASK_ABORT);
  EXPECT_EQ(cora::acl::to_acl(std::make_error_code(std::errc::timed_out)), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_EQ(cora::acl::to_acl(std::make_error_code(std::errc::not_enough_memory)), ACL_ERROR_RT_MEMORY_ALLOCATION);
  EXPECT_EQ(cora::acl::to_acl(std::error_code(ENOENT, std::system_category())), ACL_ERROR_RT_FILE_OPEN);
  EXPECT_EQ(cora::acl::to_acl(cora::errc::runtime_shut_down), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(cora::acl::to_acl(std::error_code()), ACL_SUCCESS);
}

// A thread blocked in aclrtSynchronizeStream while another finalizes gets CANN's task-abort
// code (107022), never an internal error. The kernel waits for a flag nobody sets, so the
// work cannot finish first; the finalize comes once the thread sleeps in the call. On the CPU
// device, whose shutdown stops running kernels (a GPU's kernel runs on, and a wait on it
// returns with its result).
TEST(acl_error_mapping_test, SynchronizeAbortedByFinalize) {
  ::setenv("CORA_CPU_DEVICES", "1", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  const auto cpu = acl_devices_of(backend::cpu);
  ASSERT_FALSE(cpu.empty());
  ASSERT_EQ(aclrtSetDevice(cpu.front()), ACL_SUCCESS);
  aclrtBinHandle bin = nullptr;
  ASSERT_EQ(aclrtBinaryLoadFromFile(kernel_file("test_kernels.corabin").c_str(), nullptr, &bin), ACL_SUCCESS);
  aclrtFuncHandle spin = nullptr;
  ASSERT_EQ(aclrtBinaryGetFunction(bin, "spin_until_set", &spin), ACL_SUCCESS);
  void* go = nullptr;
  void* done = nullptr;
  ASSERT_EQ(aclrtMallocHost(&go, 4), ACL_SUCCESS);
  ASSERT_EQ(aclrtMallocHost(&done, 4), ACL_SUCCESS);
  std::memset(go, 0, 4);
  std::memset(done, 0, 4);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  uint64_t limit_us = 2'000'000;  // bounds the kernel if the finalize does not abort the wait
  void* args[] = {&go, &done, &limit_us};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(spin, 1, s, nullptr, args), ACL_SUCCESS);
  std::atomic<pid_t> tid{0};
  aclError got = -1;
  std::thread t([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    got = aclrtSynchronizeStream(s);
  });
  while (tid == 0) std::this_thread::yield();
  // Sleeping (state S) in the call: a wait spins briefly before it sleeps.
  const std::string stat = "/proc/self/task/" + std::to_string(tid.load()) + "/stat";
  auto sleeping = [&] {
    std::ifstream f(stat);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');
    return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'S';
  };
  // A liveness bound only (a loaded machine or a sanitizer slows the way into the sleep): up to
  // 1 s, well inside the kernel's 2 s. Seen asleep once is enough: the wait sleeps in steps,
  // so a second look may find it awake between two of them, still inside the call.
  bool slept = false;
  for (int i = 0; i < 20'000 && !(slept = sleeping()); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  ASSERT_TRUE(slept) << "the synchronizing thread never slept";
  ASSERT_EQ(__atomic_load_n(static_cast<std::uint32_t*>(done), __ATOMIC_ACQUIRE), 0u);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
  t.join();
  EXPECT_EQ(got, ACL_ERROR_RT_DEVICE_TASK_ABORT);
}

TEST(acl_init_test, FinalizeWithoutInitIsARepeatFinalize) { EXPECT_EQ(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE); }

TEST(acl_init_test, CallsBeforeInitAreUninitialized) {
  uint32_t count = 0;
  EXPECT_EQ(aclrtGetDeviceCount(&count), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE);
  aclrtStream s = nullptr;
  EXPECT_EQ(aclrtCreateStream(&s), ACL_ERROR_UNINITIALIZE);
  void* p = nullptr;
  EXPECT_EQ(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclrtFree(reinterpret_cast<void*>(0x1000)), ACL_ERROR_UNINITIALIZE);
  const char* msg = aclGetRecentErrMsg();
  ASSERT_NE(msg, nullptr);
  EXPECT_NE(std::string(msg).find("aclrtFree"), std::string::npos) << msg;
}

TEST(acl_init_test, ConfigFileMustBeReadable) {
  EXPECT_EQ(aclInit("/nonexistent/acl.json"), ACL_ERROR_INVALID_FILE);
  const auto path = std::filesystem::temp_directory_path() / "cora_acl_test_config.json";
  {
    std::ofstream f(path);
    f << "{}\n";
  }
  EXPECT_EQ(aclInit(path.c_str()), ACL_SUCCESS);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
  std::filesystem::remove(path);
  EXPECT_EQ(aclInit(""), ACL_SUCCESS);  // an empty path means none
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
}

TEST(acl_init_test, HandlesDieWithFinalize) {
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(aclrtMalloc(&p, 256, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  // Wrong teardown order: everything after aclFinalize is uninitialized...
  EXPECT_EQ(aclrtFree(p), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_ERROR_UNINITIALIZE);
  // ...and after a new aclInit the old handles and the old binding are gone.
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_INVALID_HANDLE);
  int32_t id = -1;
  EXPECT_EQ(aclrtGetDevice(&id), ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
}

TEST(acl_init_test, RecentErrorMessageIsPerThread) {
  on_thread([] { EXPECT_EQ(aclGetRecentErrMsg(), nullptr); });  // nothing failed there yet
  EXPECT_EQ(aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE);
  const std::string mine = aclGetRecentErrMsg();
  EXPECT_NE(mine.find("aclrtSetDevice"), std::string::npos) << mine;
  on_thread([] {
    EXPECT_EQ(aclrtGetDeviceCount(nullptr), ACL_ERROR_INVALID_PARAM);
    const std::string theirs = aclGetRecentErrMsg();
    EXPECT_NE(theirs.find("aclrtGetDeviceCount"), std::string::npos) << theirs;
  });
  EXPECT_EQ(std::string(aclGetRecentErrMsg()), mine);
}

// --- devices -----------------------------------------------------------------------------------

class acl_device_test : public acl_test {};
CORA_ACL_SUITE(acl_device_test);

TEST_P(acl_device_test, CountAndCurrentDevice) {
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
  EXPECT_GT(count, static_cast<uint32_t>(dev_));
  int32_t id = -1;
  ASSERT_EQ(aclrtGetDevice(&id), ACL_SUCCESS);
  EXPECT_EQ(id, dev_);
  EXPECT_EQ(aclrtGetDevice(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetDeviceCount(nullptr), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_device_test, InvalidDeviceIds) {
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetDevice(-1), ACL_ERROR_RT_INVALID_DEVICEID);
  EXPECT_EQ(aclrtSetDevice(static_cast<int32_t>(count)), ACL_ERROR_RT_INVALID_DEVICEID);
  EXPECT_EQ(aclrtResetDevice(static_cast<int32_t>(count)), ACL_ERROR_RT_INVALID_DEVICEID);
  EXPECT_EQ(aclrtResetDeviceForce(-3), ACL_ERROR_RT_INVALID_DEVICEID);
}

TEST_P(acl_device_test, BindingIsPerThread) {
  on_thread([&] {
    int32_t id = -1;
    EXPECT_EQ(aclrtGetDevice(&id), ACL_ERROR_RT_CONTEXT_NULL);  // this thread set nothing
    aclrtStream s = nullptr;
    EXPECT_EQ(aclrtCreateStream(&s), ACL_ERROR_RT_CONTEXT_NULL);
    void* p = nullptr;
    EXPECT_EQ(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL);
    ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
    ASSERT_EQ(aclrtGetDevice(&id), ACL_SUCCESS);
    EXPECT_EQ(id, dev_);
    EXPECT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);  // the main thread's reference remains
  });
  int32_t id = -1;
  EXPECT_EQ(aclrtGetDevice(&id), ACL_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
}

TEST_P(acl_device_test, ResetReleasesAtTheLastReference) {
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);  // two references now
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);  // still alive
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);     // last: releases the device's streams
  int32_t id = -1;
  EXPECT_EQ(aclrtGetDevice(&id), ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtResetDevice(dev_), ACL_ERROR_RT_CONTEXT_NULL);  // nothing left to reset
  // Setting it again gives a fresh context.
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_device_test, ResetForceIgnoresTheCountOnce) {
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);  // three references
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev), ACL_SUCCESS);
  ASSERT_EQ(aclrtResetDeviceForce(dev_), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_ERROR_RT_INVALID_HANDLE);  // released with the device
  EXPECT_EQ(aclrtResetDeviceForce(dev_), ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(aclrtResetDevice(dev_), ACL_ERROR_RT_CONTEXT_NULL);
}

TEST_P(acl_device_test, ResetWaitsForTheDevicesWork) {
  auto flag = dmalloc(sizeof(uint32_t));
  ASSERT_EQ(aclrtMemset(flag, 4, 0, 4), ACL_SUCCESS);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  uint64_t us = 100000;
  void* args[] = {&us, &flag};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, s, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);  // the kernel finished before the reset returned
}

TEST_P(acl_device_test, WrongTeardownOrderGivesInvalidHandles) {
  aclrtBinHandle bin = load();
  aclrtFuncHandle fn = function(bin, "add_f32");
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtResetDeviceForce(dev_), ACL_SUCCESS);  // before unloading and destroying
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  EXPECT_EQ(aclrtBinaryUnLoad(bin), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_ERROR_RT_INVALID_HANDLE);
  aclrtArgsHandle args = nullptr;
  EXPECT_EQ(aclrtKernelArgsInit(fn, &args), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_device_test, SynchronizeDeviceWaitsForEveryStream) {
  aclrtStream a = nullptr, b = nullptr;
  ASSERT_EQ(aclrtCreateStream(&a), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateStream(&b), ACL_SUCCESS);
  auto flags = dmalloc(3 * sizeof(uint32_t));
  ASSERT_EQ(aclrtMemset(flags, 12, 0, 12), ACL_SUCCESS);
  uint64_t us = 50000;
  void* fa = flags;
  void* fb = static_cast<uint32_t*>(flags) + 1;
  void* fc = static_cast<uint32_t*>(flags) + 2;
  void* args_a[] = {&us, &fa};
  void* args_b[] = {&us, &fb};
  void* args_c[] = {&us, &fc};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, a, nullptr, args_a), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, b, nullptr, args_b), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, nullptr, nullptr, args_c), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flags, 3), (std::vector<uint32_t>{1, 1, 1}));
}

TEST_P(acl_device_test, SynchronizeDeviceReportsAFault) {
  isolated_fault([&] {
    auto out = dmalloc(64);
    aclrtFuncHandle empty = kernel("empty");
    void* args[] = {&out};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, nullptr, nullptr, args), ACL_SUCCESS);
    EXPECT_EQ(aclrtSynchronizeDevice(), ACL_ERROR_RT_AICORE_EXCEPTION);
    EXPECT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS);  // reported once
    // The CPU device goes on; a GPU is lost, and new work fails at once.
    EXPECT_EQ(aclrtLaunchKernelWithArgsArray(empty, 1, nullptr, nullptr, nullptr),
              cuda() ? ACL_ERROR_RT_LOST_HEARTBEAT : ACL_SUCCESS);
  });
}

TEST_P(acl_device_test, SynchronizeDeviceWithTimeout) {
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(-2), ACL_ERROR_RT_PARAM_INVALID);
  auto flag = dmalloc(sizeof(uint32_t));
  ASSERT_EQ(aclrtMemset(flag, 4, 0, 4), ACL_SUCCESS);
  uint64_t us = 300000;
  void* args[] = {&us, &flag};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, nullptr, nullptr, args), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(1), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(-1), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(1000), ACL_SUCCESS);  // nothing left
}

class acl_two_devices : public acl_two_device_test {};
CORA_ACL_SUITE(acl_two_devices);

TEST_P(acl_two_devices, ThreadsBindDifferentDevices) {
  const int32_t other = devices_[1];
  on_thread([&] {
    ASSERT_EQ(aclrtSetDevice(other), ACL_SUCCESS);
    int32_t id = -1;
    ASSERT_EQ(aclrtGetDevice(&id), ACL_SUCCESS);
    EXPECT_EQ(id, other);
  });
  int32_t id = -1;
  ASSERT_EQ(aclrtGetDevice(&id), ACL_SUCCESS);
  EXPECT_EQ(id, dev_);
  // Switching the binding keeps both references.
  ASSERT_EQ(aclrtSetDevice(other), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetDevice(&id), ACL_SUCCESS);
  EXPECT_EQ(id, other);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
}

TEST_P(acl_device_test, DeviceAndSystemQueries) {
  aclrtRunMode mode = ACL_DEVICE;
  ASSERT_EQ(aclrtGetRunMode(&mode), ACL_SUCCESS);
  EXPECT_EQ(mode, ACL_HOST);
  const char* soc = aclrtGetSocName();
  ASSERT_NE(soc, nullptr);
  EXPECT_GT(std::strlen(soc), 0u);
  int64_t v = 0;
  ASSERT_EQ(aclrtGetDeviceInfo(static_cast<uint32_t>(dev_), ACL_DEV_ATTR_AICORE_CORE_NUM, &v), ACL_SUCCESS);
  EXPECT_GT(v, 0);
  ASSERT_EQ(aclrtGetDeviceInfo(static_cast<uint32_t>(dev_), ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE, &v), ACL_SUCCESS);
  size_t free_mem = 0, total = 0;
  ASSERT_EQ(aclrtGetMemInfo(ACL_HBM_MEM, &free_mem, &total), ACL_SUCCESS);
  EXPECT_EQ(static_cast<size_t>(v), total);
  EXPECT_EQ(aclrtGetDeviceInfo(static_cast<uint32_t>(dev_), static_cast<aclrtDevAttr>(1000), &v), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetDeviceInfo(static_cast<uint32_t>(dev_), ACL_DEV_ATTR_NPU_ARCH, &v), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtGetDeviceInfo(9999, ACL_DEV_ATTR_AICORE_CORE_NUM, &v), ACL_ERROR_RT_INVALID_DEVICEID);
  ASSERT_EQ(aclGetDeviceCapability(static_cast<uint32_t>(dev_), ACL_DEVICE_INFO_AI_CORE_NUM, &v), ACL_SUCCESS);
  EXPECT_GT(v, 0);
  int32_t cap = -1;
  ASSERT_EQ(aclrtGetDeviceCapability(dev_, ACL_FEATURE_SYSTEM_MEMQ_EVENT_CROSS_DEV, &cap), ACL_SUCCESS);
  EXPECT_EQ(cap, ACL_DEV_FEATURE_NOT_SUPPORT);
  aclrtDeviceStatus status = ACL_RT_DEVICE_STATUS_END;
  ASSERT_EQ(aclrtQueryDeviceStatus(dev_, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_RT_DEVICE_STATUS_NORMAL);
  aclrtUtilizationInfo u{};
  ASSERT_EQ(aclrtGetDeviceUtilizationRate(dev_, &u), ACL_SUCCESS);
  EXPECT_GE(u.memoryUtilization, 0);
  EXPECT_LE(u.memoryUtilization, 100);
  uint32_t limit = 0;
  ASSERT_EQ(aclrtGetDeviceResLimit(dev_, ACL_RT_DEV_RES_VECTOR_CORE, &limit), ACL_SUCCESS);
  EXPECT_GT(limit, 0u);
  EXPECT_EQ(aclrtSetDeviceResLimit(dev_, ACL_RT_DEV_RES_VECTOR_CORE, 1), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtResetDeviceResLimit(dev_), ACL_SUCCESS);
  EXPECT_EQ(acl_c_get_device_res_limit(dev_, 5, &limit), ACL_ERROR_INVALID_PARAM);
  int32_t peer = 7;
  EXPECT_EQ(aclrtDeviceCanAccessPeer(&peer, dev_, dev_), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDeviceCanAccessPeer(&peer, dev_, 9999), ACL_ERROR_RT_INVALID_DEVICEID);
}

TEST_P(acl_device_test, DeviceIdentifiers) {
  int32_t id = -1;
  ASSERT_EQ(aclrtGetLogicDevIdByUserDevId(dev_, &id), ACL_SUCCESS);
  EXPECT_EQ(id, dev_);
  ASSERT_EQ(aclrtGetPhyDevIdByLogicDevId(dev_, &id), ACL_SUCCESS);
  EXPECT_EQ(id, dev_);
  EXPECT_EQ(aclrtGetUserDevIdByPhyDevId(9999, &id), ACL_ERROR_RT_INVALID_DEVICEID);
  EXPECT_EQ(aclrtGetPhyDevIdByUserDevId(dev_, nullptr), ACL_ERROR_INVALID_PARAM);
  aclrtUuid uuid{};
  char bus[64] = {};
  if (!cuda()) {
    EXPECT_EQ(aclrtDeviceGetUuid(dev_, &uuid), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_EQ(aclrtDeviceGetPCIBusId(dev_, bus, sizeof bus), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    return;
  }
  ASSERT_EQ(aclrtDeviceGetUuid(dev_, &uuid), ACL_SUCCESS);
  bool nonzero = false;
  for (char b : uuid.bytes) nonzero |= b != 0;
  EXPECT_TRUE(nonzero);
  ASSERT_EQ(aclrtDeviceGetPCIBusId(dev_, bus, sizeof bus), ACL_SUCCESS);
  EXPECT_EQ(aclrtDeviceGetPCIBusId(dev_, bus, 2), ACL_ERROR_INVALID_PARAM);
  int32_t found = -1;
  ASSERT_EQ(aclrtDeviceGetByPCIBusId(bus, &found), ACL_SUCCESS);
  EXPECT_EQ(found, dev_);
  EXPECT_EQ(aclrtDeviceGetByPCIBusId("0000:ff:ff.7", &found), ACL_ERROR_RT_INVALID_DEVICEID);
}

TEST(acl_system_test, VersionsAttributesAndDataTypes) {
  char version[ACL_PKG_VERSION_MAX_SIZE] = {};
  char runtime[] = "runtime", bogus[] = "nope";
  ASSERT_EQ(aclsysGetVersionStr(runtime, version), ACL_SUCCESS);
  EXPECT_GT(std::strlen(version), 0u);
  int32_t num = 0;
  ASSERT_EQ(aclsysGetVersionNum(runtime, &num), ACL_SUCCESS);
  EXPECT_EQ(aclsysGetVersionStr(bogus, version), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclsysGetVersionNum(nullptr, &num), ACL_ERROR_INVALID_PARAM);
  int32_t major = 0, minor = 0, patch = -1;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ASSERT_EQ(aclrtGetVersion(&major, &minor, &patch), ACL_SUCCESS);
#pragma GCC diagnostic pop
  EXPECT_EQ(major, ACL_MAJOR_VERSION);
  EXPECT_EQ(minor, ACL_MINOR_VERSION);
  const aclCannAttr* attrs = nullptr;
  size_t n = 0;
  ASSERT_EQ(aclGetCannAttributeList(&attrs, &n), ACL_SUCCESS);
  ASSERT_GT(n, 0u);
  for (size_t i = 0; i < n; ++i) {
    int32_t v = -1;
    EXPECT_EQ(aclGetCannAttribute(attrs[i], &v), ACL_SUCCESS);
    EXPECT_EQ(v, 1);
  }
  int32_t jit = -1;
  ASSERT_EQ(aclGetCannAttribute(ACL_CANN_ATTR_JIT_COMPILE, &jit), ACL_SUCCESS);
  EXPECT_EQ(jit, 0);
  EXPECT_EQ(aclGetCannAttribute(static_cast<aclCannAttr>(3), &jit), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclDataTypeSize(ACL_FLOAT), 4u);
  EXPECT_EQ(aclDataTypeSize(ACL_FLOAT16), 2u);
  EXPECT_EQ(aclDataTypeSize(ACL_INT64), 8u);
  EXPECT_EQ(aclDataTypeSize(ACL_COMPLEX128), 16u);
  EXPECT_EQ(aclDataTypeSize(ACL_DT_UNDEFINED), 0u);
  EXPECT_EQ(aclFloat16ToFloat(aclFloatToFloat16(1.5f)), 1.5f);
  EXPECT_EQ(aclFloatToFloat16(1.0f), 0x3c00);
  EXPECT_EQ(aclFloat16ToFloat(0xc000), -2.0f);
  int buf = 0;
  aclDataBuffer* db = aclCreateDataBuffer(&buf, sizeof(buf));
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(aclGetDataBufferAddr(db), &buf);
  EXPECT_EQ(aclGetDataBufferSizeV2(db), sizeof(buf));
  EXPECT_EQ(aclDestroyDataBuffer(db), ACL_SUCCESS);
  aclrtRunMode mode;
  EXPECT_EQ(aclrtGetRunMode(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetRunMode(&mode), ACL_SUCCESS);
}

TEST(acl_init_test, FinalizeReferenceCountsInits) {
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclInit(nullptr), ACL_ERROR_REPEAT_INITIALIZE);  // two references
  uint64_t refs = 9;
  ASSERT_EQ(aclFinalizeReference(&refs), ACL_SUCCESS);
  EXPECT_EQ(refs, 1u);
  uint32_t count = 0;
  EXPECT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);  // still initialized
  ASSERT_EQ(aclFinalizeReference(&refs), ACL_SUCCESS);
  EXPECT_EQ(refs, 0u);
  EXPECT_EQ(aclrtGetDeviceCount(&count), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclFinalizeReference(nullptr), ACL_ERROR_REPEAT_FINALIZE);
}

}  // namespace
}  // namespace cora::test
