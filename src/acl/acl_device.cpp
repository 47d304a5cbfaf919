// aclInit / aclFinalize, devices, and aclGetRecentErrMsg.
#include <chrono>
#include <fstream>
#include <thread>

#include "acl/acl_state.hpp"

using namespace cora::acl;

extern "C" {

aclError aclInit(const char* configPath) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (st.runtime) {
      ++st.init_count;
      return fail(ACL_ERROR_REPEAT_INITIALIZE, api, "already initialized");
    }
    if (configPath && *configPath) {
      // The file must exist and be readable, as CANN checks; its settings (dump, profiling,
      // default device...) have no meaning here and are not applied (docs/acl-compat.md).
      std::ifstream f(configPath);
      if (!f) return fail(ACL_ERROR_INVALID_FILE, api, std::string("cannot read '") + configPath + "'");
    }
    auto rt = std::make_shared<cora::runtime>();
    st.devices.assign(rt->device_count(), device_slot{});
    st.runtime = std::move(rt);
    st.init_count = 1;
    ++st.epoch;
    return ACL_SUCCESS;
  });
}

aclError aclFinalize(void) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    teardown td;
    {
      std::lock_guard lock(st.mutex);
      if (!st.runtime) return fail(ACL_ERROR_REPEAT_FINALIZE, api, "not initialized, or already finalized");
      for (std::size_t i = 0; i < st.devices.size(); ++i) st.release_device_locked(i, td);
      for (auto& [h, a] : st.args) td.args.push_back(std::move(a));
      st.args.clear();
      st.user_mem_handles.clear();
      for (auto& [id, q] : st.reporters) td.reporters.push_back(std::move(q));
      st.reporters.clear();
      for (auto& [id, q] : st.host_func_threads) td.reporters.push_back(std::move(q));
      st.host_func_threads.clear();
      st.devices.clear();
      td.runtime = std::move(st.runtime);
      st.init_count = 0;
    }
    td.wait_streams = false;  // finalizing does not wait: the runtime's shutdown drains the work
    td.run();
    return ACL_SUCCESS;
  });
}

const char* aclGetRecentErrMsg(void) { return recent_error_message(); }

aclError aclrtSetDevice(int32_t deviceId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    {
      std::lock_guard lock(st.mutex);
      if (aclError e = check_device_locked(st, api, deviceId)) return e;
    }
    device_state_changed(deviceId, ACL_RT_DEVICE_STATE_SET_PRE);
    {
      std::lock_guard lock(st.mutex);
      if (aclError e = check_device_locked(st, api, deviceId)) return e;  // a finalize meanwhile
      ++st.devices[static_cast<std::size_t>(deviceId)].refcount;
      bind_thread_locked(st, static_cast<std::size_t>(deviceId));
    }
    device_state_changed(deviceId, ACL_RT_DEVICE_STATE_SET_POST);
    return ACL_SUCCESS;
  });
}

}  // extern "C"

namespace {

aclError reset_device(const char* api, int32_t deviceId, bool force) {
  auto& st = state::get();
  teardown td;
  {
    std::lock_guard lock(st.mutex);
    if (aclError e = require_init_locked(st, api)) return e;
    if (deviceId < 0 || static_cast<std::size_t>(deviceId) >= st.devices.size())
      return fail(ACL_ERROR_RT_INVALID_DEVICEID, api,
                  "device " + std::to_string(deviceId) + " does not exist (" +
                      std::to_string(st.devices.size()) + " devices)");
    auto& slot = st.devices[static_cast<std::size_t>(deviceId)];
    if (slot.refcount <= 0)
      return fail(ACL_ERROR_RT_CONTEXT_NULL, api,
                  "device " + std::to_string(deviceId) + " is not set (or was already reset)");
    if (!force && --slot.refcount > 0) return ACL_SUCCESS;
  }
  device_state_changed(deviceId, ACL_RT_DEVICE_STATE_RESET_PRE);
  {
    std::lock_guard lock(st.mutex);
    if (aclError e = check_device_locked(st, api, deviceId)) return e;
    // Set again by another thread meanwhile: that reference keeps it.
    if (!force && st.devices[static_cast<std::size_t>(deviceId)].refcount > 0) return ACL_SUCCESS;
    st.release_device_locked(static_cast<std::size_t>(deviceId), td);
  }
  td.run();  // waits for the device's streams, outside the lock
  device_state_changed(deviceId, ACL_RT_DEVICE_STATE_RESET_POST);
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtResetDevice(int32_t deviceId) {
  const char* const api = __func__;
  return guarded(api, [&] { return reset_device(api, deviceId, false); });
}

aclError aclrtResetDeviceForce(int32_t deviceId) {
  const char* const api = __func__;
  return guarded(api, [&] { return reset_device(api, deviceId, true); });
}

aclError aclrtGetDevice(int32_t* deviceId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(deviceId, "deviceId is NULL");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    *deviceId = static_cast<int32_t>(ctx.index);
    return ACL_SUCCESS;
  });
}

aclError aclrtGetDeviceCount(uint32_t* count) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(count, "count is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (aclError e = require_init_locked(st, api)) return e;
    *count = static_cast<uint32_t>(st.devices.size());
    return ACL_SUCCESS;
  });
}

aclError aclrtSynchronizeDevice(void) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    auto p = ctx.device->synchronize();
    return wait(api, p);
  });
}

aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (timeout < -1)
      return fail(ACL_ERROR_RT_PARAM_INVALID, api, "timeout must be -1 (forever) or >= 0 ms");
    context ctx;
    std::vector<std::shared_ptr<stream_obj>> streams;
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      if (aclError e = current_locked(st, api, ctx)) return e;
      for (auto& [h, s] : st.streams)
        if (s->device == ctx.index) streams.push_back(s);
      auto& slot = st.devices[ctx.index];
      for (auto* s : {&slot.default_stream, &slot.sync_stream})
        if (*s) streams.push_back(*s);
    }
    // Poll each stream until the deadline, then synchronize the device (which finds them idle
    // and reports their faults); an abandoned wait would swallow a fault reported later.
    if (timeout >= 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
      for (auto& s : streams)
        while (!s->s.idle()) {
          if (std::chrono::steady_clock::now() >= deadline)
            return fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, api,
                        "the device still has work after " + std::to_string(timeout) + " ms");
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    auto p = ctx.device->synchronize();
    return wait(api, p);
  });
}

}  // extern "C"
