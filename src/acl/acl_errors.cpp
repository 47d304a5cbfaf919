// Errors: the thread's last error, exception-info callbacks and their getters, task ids, the
// device error details, and device state callbacks.
#include <pthread.h>

#include <algorithm>

#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

struct callbacks {
  std::mutex mutex;
  aclrtExceptionInfoCallback legacy = nullptr;  // aclrtSetExceptionInfoCallback
  std::vector<aclrtExceptionInfoCallback> registered;
  struct device_cb {
    std::string name;
    aclrtDeviceStateCallback fn;
    void* args;
  };
  std::vector<device_cb> device_state;
  std::unordered_map<std::size_t, aclError> device_faults;  // last task failure per device
};
callbacks& cbs() {
  static auto* c = new callbacks;  // never destroyed: reported from any thread until exit
  return *c;
}

}  // namespace

namespace cora::acl {

void report_task_failure(aclError code, std::size_t device, std::int32_t stream_id) noexcept {
  try {
    std::vector<aclrtExceptionInfoCallback> fns;
    {
      auto& c = cbs();
      std::lock_guard lock(c.mutex);
      c.device_faults[device] = code;
      if (c.legacy) fns.push_back(c.legacy);
      fns.insert(fns.end(), c.registered.begin(), c.registered.end());
    }
    rtExceptionInfo info;
    info.task_id = last_task();
    info.stream_id = static_cast<std::uint32_t>(stream_id);
    info.thread_id = static_cast<std::uint32_t>(pthread_self());
    info.device_id = static_cast<std::uint32_t>(device);
    info.error_code = static_cast<std::uint32_t>(code);
    for (auto fn : fns) fn(&info);
  } catch (...) {
  }
}

void device_state_changed(std::int32_t device, aclrtDeviceState state) noexcept {
  try {
    std::vector<callbacks::device_cb> fns;
    {
      auto& c = cbs();
      std::lock_guard lock(c.mutex);
      fns = c.device_state;
    }
    for (auto& f : fns) f.fn(device, state, f.args);
  } catch (...) {
  }
}

}  // namespace cora::acl

extern "C" {

aclError aclrtPeekAtLastError(aclrtLastErrLevel level) {
  if (enum_value(level) != ACL_RT_THREAD_LEVEL) return ACL_ERROR_INVALID_PARAM;  // leaves the last error
  return last_error(false);
}

aclError aclrtGetLastError(aclrtLastErrLevel level) {
  if (enum_value(level) != ACL_RT_THREAD_LEVEL) return ACL_ERROR_INVALID_PARAM;
  return last_error(true);
}

aclError aclrtSetExceptionInfoCallback(aclrtExceptionInfoCallback callback) {
  auto& c = cbs();
  std::lock_guard lock(c.mutex);
  c.legacy = callback;  // NULL clears it
  return ACL_SUCCESS;
}

aclError aclrtExceptionInfoCallbackRegister(aclrtExceptionInfoCallback callback) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(callback, "callback is NULL");
    auto& c = cbs();
    std::lock_guard lock(c.mutex);
    if (std::find(c.registered.begin(), c.registered.end(), callback) != c.registered.end())
      return fail(ACL_ERROR_INVALID_PARAM, api, "the callback is registered already");
    c.registered.push_back(callback);
    return ACL_SUCCESS;
  });
}

aclError aclrtExceptionInfoCallbackUnregister(aclrtExceptionInfoCallback callback) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(callback, "callback is NULL");
    auto& c = cbs();
    std::lock_guard lock(c.mutex);
    auto it = std::find(c.registered.begin(), c.registered.end(), callback);
    if (it == c.registered.end()) return fail(ACL_ERROR_INVALID_PARAM, api, "the callback is not registered");
    c.registered.erase(it);
    return ACL_SUCCESS;
  });
}

uint32_t aclrtGetTaskIdFromExceptionInfo(const aclrtExceptionInfo* info) { return info ? info->task_id : 0xffffffffu; }
uint32_t aclrtGetStreamIdFromExceptionInfo(const aclrtExceptionInfo* info) {
  return info ? info->stream_id : 0xffffffffu;
}
uint32_t aclrtGetThreadIdFromExceptionInfo(const aclrtExceptionInfo* info) {
  return info ? info->thread_id : 0xffffffffu;
}
uint32_t aclrtGetDeviceIdFromExceptionInfo(const aclrtExceptionInfo* info) {
  return info ? info->device_id : 0xffffffffu;
}
uint32_t aclrtGetErrorCodeFromExceptionInfo(const aclrtExceptionInfo* info) {
  return info ? info->error_code : 0xffffffffu;
}

aclError aclrtGetArgsFromExceptionInfo(const aclrtExceptionInfo* info, void** devArgsPtr, uint32_t* devArgsLen) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(info && devArgsPtr && devArgsLen, "info, devArgsPtr or devArgsLen is NULL");
  // cora reports a fault per stream, not per task: the faulting task's arguments are unknown.
  return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "the failed task's arguments are not recorded");
}

aclError aclrtGetFuncHandleFromExceptionInfo(const aclrtExceptionInfo* info, aclrtFuncHandle* func) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(info && func, "info or func is NULL");
  return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "the failed task's function is not recorded");
}

aclError aclrtGetThreadLastTaskId(uint32_t* taskId) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(taskId, "taskId is NULL");
  *taskId = last_task();
  return ACL_SUCCESS;
}

aclError aclrtGetErrorVerbose(int32_t deviceId, aclrtErrorInfo* errorInfo) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(errorInfo, "errorInfo is NULL");
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      if (aclError e = check_device_locked(st, api, deviceId)) return e;
    }
    *errorInfo = aclrtErrorInfo{};
    auto& c = cbs();
    std::lock_guard lock(c.mutex);
    auto it = c.device_faults.find(static_cast<std::size_t>(deviceId));
    if (it == c.device_faults.end()) {
      errorInfo->errorType = ACL_RT_NO_ERROR;
      return ACL_SUCCESS;
    }
    // A kernel that faulted or timed out is the AI Core's counterpart; no repair is possible.
    errorInfo->errorType = it->second == ACL_ERROR_RT_LOST_HEARTBEAT ? ACL_RT_ERROR_OTHERS : ACL_RT_ERROR_AICORE;
    errorInfo->hasDetail = errorInfo->errorType == ACL_RT_ERROR_AICORE;
    errorInfo->detail.aicoreErrType = ACL_RT_AICORE_ERROR_SW;
    errorInfo->tryRepair = 0;
    return ACL_SUCCESS;
  });
}

aclError aclrtRegDeviceStateCallback(const char* regName, aclrtDeviceStateCallback callback, void* args) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(regName && *regName, "regName is NULL or empty");
    auto& c = cbs();
    std::lock_guard lock(c.mutex);
    auto it = std::find_if(c.device_state.begin(), c.device_state.end(),
                           [&](const callbacks::device_cb& d) { return d.name == regName; });
    if (!callback) {  // a NULL callback unregisters the name
      if (it != c.device_state.end()) c.device_state.erase(it);
      return ACL_SUCCESS;
    }
    if (it != c.device_state.end())
      *it = {regName, callback, args};
    else
      c.device_state.push_back({regName, callback, args});
    return ACL_SUCCESS;
  });
}

}  // extern "C"
