// Streams.
#include <algorithm>
#include <cstring>

#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

aclError create_configured(const char* api, aclrtStream* stream, std::uint32_t priority, std::uint32_t flags);
void notify_stream_state(aclrtStream s, aclrtStreamState state);

// Takes a stream out of the registry: it must belong to the calling thread's device, as CANN
// requires of streams of the current context.
aclError take_stream(const char* api, aclrtStream stream, std::shared_ptr<stream_obj>& out) {
  CORA_ACL_REQUIRE(stream, "stream is NULL (the default stream cannot be destroyed)");
  {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (aclError e = lookup_locked(st, st.streams, api, stream, "stream", out)) return e;
  }
  notify_stream_state(stream, ACL_RT_STREAM_STATE_DESTROY_PRE);
  auto& st = state::get();
  teardown td;  // a report queue left without streams is closed outside the lock
  {
    std::lock_guard lock(st.mutex);
    if (aclError e = lookup_locked(st, st.streams, api, stream, "stream", out)) return e;
    context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    if (out->device != ctx.index)
      return fail(ACL_ERROR_RT_STREAM_CONTEXT, api,
                  "the stream belongs to device " + std::to_string(out->device) +
                      ", not to this thread's device " + std::to_string(ctx.index));
    st.streams.erase(stream);
    if (out->subscriber && --out->subscriber->streams == 0) {
      st.reporters.erase(out->subscriber->thread_id);
      td.reporters.push_back(out->subscriber);
    }
    out->subscriber.reset();
    if (out->host_func_thread && --out->host_func_thread->streams == 0) {
      st.host_func_threads.erase(out->host_func_thread->thread_id);
      td.reporters.push_back(out->host_func_thread);
    }
    out->host_func_thread.reset();
  }
  td.run();
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtCreateStream(aclrtStream* stream) {
  const char* const api = __func__;
  return guarded(api, [&] { return create_configured(api, stream, 0, 0); });
}

aclError aclrtCreateStreamWithConfig(aclrtStream* stream, uint32_t priority, uint32_t flag) {
  const char* const api = __func__;
  // Flag bits CANN does not define give a default stream, as CANN documents.
  return guarded(api, [&] { return create_configured(api, stream, priority, flag); });
}

aclError aclrtDestroyStream(aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<stream_obj> s;
    if (aclError e = take_stream(api, stream, s)) return e;
    std::error_code ec;
    s->s.synchronize().wait(ec);  // waits for the stream's tasks; their faults go with it
    return ACL_SUCCESS;
  });
}

aclError aclrtDestroyStreamForce(aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<stream_obj> s;
    // Dropping the stream does not wait: work in flight completes, then the core frees it.
    return take_stream(api, stream, s);
  });
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    return synchronize_stream(api, *s, -1);
  });
}

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (timeout < -1)
      return fail(ACL_ERROR_RT_PARAM_INVALID, api, "timeout must be -1 (forever) or >= 0 ms");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    return synchronize_stream(api, *s, timeout);
  });
}

aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus* status) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(status, "status is NULL");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    *status = s->s.idle() ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
    return ACL_SUCCESS;
  });
}

}  // extern "C"

// --- configuration, attributes, ids ------------------------------------------------------------

namespace {

constexpr std::uint32_t max_streams_per_device = 2048;  // the limit cora reports and enforces

// CANN's priorities run from 0 (highest) to 7; cora's streams have one: 0.
aclError check_priority(const char* api, std::uint64_t priority) {
  CORA_ACL_REQUIRE(priority <= 7, "priority must be in [0, 7]");
  if (priority != 0)
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                "stream priorities other than 0 are not supported (aclrtDeviceGetStreamPriorityRange gives [0, 0])");
  return ACL_SUCCESS;
}

aclError check_stream_flags(const char* api, std::uint64_t flag) {
  // FAST_LAUNCH and FAST_SYNC describe how every cora stream works already (resources made at
  // creation, synchronization by polling). The others need features cora has not.
  constexpr std::uint64_t unsupported =
      ACL_STREAM_PERSISTENT | ACL_STREAM_HUGE | ACL_STREAM_CPU_SCHEDULE | ACL_STREAM_DEVICE_USE_ONLY;
  if (flag & unsupported)
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                "stream flags PERSISTENT, HUGE, CPU_SCHEDULE and DEVICE_USE_ONLY are not supported");
  return ACL_SUCCESS;
}

struct stream_state_callback {
  std::string name;
  aclrtStreamStateCallback fn = nullptr;
  void* args = nullptr;
};
std::mutex callbacks_mutex;
std::vector<stream_state_callback> stream_callbacks;  // aclrtRegStreamStateCallback

void notify_stream_state(aclrtStream s, aclrtStreamState state) {
  std::vector<stream_state_callback> cbs;
  {
    std::lock_guard lock(callbacks_mutex);
    cbs = stream_callbacks;
  }
  for (auto& c : cbs) c.fn(s, state, c.args);
}

std::size_t streams_of_device_locked(state& st, std::size_t device) {
  std::size_t n = 0;
  for (auto& [h, s] : st.streams) n += s->device == device;
  return n;
}

aclError create_configured(const char* api, aclrtStream* stream, std::uint32_t priority, std::uint32_t flags) {
  CORA_ACL_REQUIRE(stream, "stream is NULL");
  if (aclError e = check_priority(api, priority)) return e;
  if (aclError e = check_stream_flags(api, flags)) return e;
  {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    if (streams_of_device_locked(st, ctx.index) >= max_streams_per_device)
      return fail(ACL_ERROR_RT_NO_STREAM_RESOURCE, api,
                  "the device has " + std::to_string(max_streams_per_device) + " streams already");
    auto s = new_stream_locked(st, ctx);
    s->priority = priority;
    s->flags = flags;
    *stream = s.get();
  }
  notify_stream_state(*stream, ACL_RT_STREAM_STATE_CREATE_POST);
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclrtStreamConfigHandle* aclrtCreateStreamConfigHandle(void) {
  try {
    return new aclrtStreamConfigHandle{};
  } catch (...) {
    (void)fail(ACL_ERROR_BAD_ALLOC, __func__, "out of host memory");
    return nullptr;
  }
}

aclError aclrtDestroyStreamConfigHandle(aclrtStreamConfigHandle* handle) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(handle, "handle is NULL");
  delete handle;
  return ACL_SUCCESS;
}

aclError aclrtSetStreamConfigOpt(aclrtStreamConfigHandle* handle, aclrtStreamConfigAttr attr, const void* attrValue,
                                 size_t valueSize) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(handle, "handle is NULL");
    CORA_ACL_REQUIRE(attrValue, "attrValue is NULL");
    auto read = [&](auto& field) -> aclError {
      CORA_ACL_REQUIRE(valueSize == sizeof(field), "valueSize must be " + std::to_string(sizeof(field)) +
                                                       " for this attribute");
      std::memcpy(&field, attrValue, sizeof(field));
      return ACL_SUCCESS;
    };
    switch (enum_value(attr)) {
      case ACL_RT_STREAM_WORK_ADDR_PTR: return read(handle->workptr);
      case ACL_RT_STREAM_WORK_SIZE: return read(handle->workSize);
      case ACL_RT_STREAM_FLAG: return read(handle->flag);
      case ACL_RT_STREAM_PRIORITY: return read(handle->priority);
      default: return fail(ACL_ERROR_INVALID_PARAM, api, "attr is not an aclrtStreamConfigAttr");
    }
  });
}

aclError aclrtCreateStreamV2(aclrtStream* stream, const aclrtStreamConfigHandle* handle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(handle, "handle is NULL");
    // A work area for the stream's operators: cora's tasks need none, so one given is refused
    // rather than ignored.
    if (handle->workptr || handle->workSize)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "a stream work area (WORK_ADDR_PTR, WORK_SIZE) is not supported");
    CORA_ACL_REQUIRE(handle->flag <= 0xffffffffu, "flag does not fit 32 bits");
    return create_configured(api, stream, handle->priority, static_cast<std::uint32_t>(handle->flag));
  });
}

aclError aclrtStreamGetPriority(aclrtStream stream, uint32_t* priority) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(priority, "priority is NULL");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    *priority = s->priority;
    return ACL_SUCCESS;
  });
}

aclError aclrtStreamGetFlags(aclrtStream stream, uint32_t* flags) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(flags, "flags is NULL");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    *flags = s->flags;
    return ACL_SUCCESS;
  });
}

aclError aclrtStreamGetId(aclrtStream stream, int32_t* streamId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(streamId, "streamId is NULL");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    *streamId = s->id;  // default streams are 0; created streams count from 1
    return ACL_SUCCESS;
  });
}

aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(mode == ACL_CONTINUE_ON_FAILURE || mode == ACL_STOP_ON_FAILURE,
                     "mode must be ACL_CONTINUE_ON_FAILURE or ACL_STOP_ON_FAILURE");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    // The core's failure mode: with STOP, tasks behind a failed one are not run and report
    // the failure at the next synchronization, which also ends the stop (docs/acl-compat.md).
    std::error_code ec;
    s->s.stop_on_failure(mode == ACL_STOP_ON_FAILURE, ec);
    if (ec)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                  "ACL_STOP_ON_FAILURE is not supported on this device: " + cora::last_error_message());
    s->failure_mode = mode;
    return ACL_SUCCESS;
  });
}

aclError aclrtSetStreamAttribute(aclrtStream stream, aclrtStreamAttr stmAttrType, aclrtStreamAttrValue* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(value, "value is NULL");
    const auto attr = enum_value(stmAttrType);
    switch (attr) {
      case ACL_STREAM_ATTR_FAILURE_MODE: return aclrtSetStreamFailureMode(stream, value->failureMode);
      case ACL_STREAM_ATTR_PRIORITY: {
        std::shared_ptr<stream_obj> s;
        if (aclError e = resolve_stream(api, stream, s)) return e;
        return check_priority(api, value->streamPriority);
      }
      case ACL_STREAM_ATTR_FLOAT_OVERFLOW_CHECK:
      case ACL_STREAM_ATTR_USER_CUSTOM_TAG:
      case ACL_STREAM_ATTR_CACHE_OP_INFO: {
        std::shared_ptr<stream_obj> s;
        if (aclError e = resolve_stream(api, stream, s)) return e;
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                    "overflow checks, custom tags and operator info caches are Ascend stream features");
      }
      default: return fail(ACL_ERROR_INVALID_PARAM, api, "stmAttrType is not an aclrtStreamAttr");
    }
  });
}

aclError aclrtGetStreamAttribute(aclrtStream stream, aclrtStreamAttr stmAttrType, aclrtStreamAttrValue* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(value, "value is NULL");
    const auto attr = enum_value(stmAttrType);
    CORA_ACL_REQUIRE(attr >= ACL_STREAM_ATTR_FAILURE_MODE && attr <= ACL_STREAM_ATTR_PRIORITY,
                     "stmAttrType is not an aclrtStreamAttr");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    *value = aclrtStreamAttrValue{};
    switch (attr) {
      case ACL_STREAM_ATTR_FAILURE_MODE: value->failureMode = s->failure_mode; break;
      case ACL_STREAM_ATTR_PRIORITY: value->streamPriority = s->priority; break;
      default: break;  // overflow checks, tags and op-info caches: off
    }
    return ACL_SUCCESS;
  });
}

aclError aclrtGetStreamAvailableNum(uint32_t* streamCount) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(streamCount, "streamCount is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    *streamCount = static_cast<uint32_t>(max_streams_per_device - streams_of_device_locked(st, ctx.index));
    return ACL_SUCCESS;
  });
}

aclError aclrtDeviceGetStreamPriorityRange(int32_t* leastPriority, int32_t* greatestPriority) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(leastPriority, "leastPriority is NULL");
    CORA_ACL_REQUIRE(greatestPriority, "greatestPriority is NULL");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    *leastPriority = 0;  // cora's streams have one priority
    *greatestPriority = 0;
    return ACL_SUCCESS;
  });
}

aclError aclrtRegStreamStateCallback(const char* regName, aclrtStreamStateCallback callback, void* args) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(regName && *regName, "regName is NULL or empty");
    std::lock_guard lock(callbacks_mutex);
    auto it = std::find_if(stream_callbacks.begin(), stream_callbacks.end(),
                           [&](const stream_state_callback& c) { return c.name == regName; });
    if (!callback) {  // CANN: a NULL callback unregisters the name
      if (it != stream_callbacks.end()) stream_callbacks.erase(it);
      return ACL_SUCCESS;
    }
    if (it != stream_callbacks.end()) {
      it->fn = callback;
      it->args = args;
    } else {
      stream_callbacks.push_back({regName, callback, args});
    }
    return ACL_SUCCESS;
  });
}

aclError aclrtStreamWaitEventWithTimeout(aclrtStream stream, aclrtEvent event, int32_t timeout) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(timeout >= -1, "timeout must be -1 (forever), 0 or > 0 ms");
    // The stream waits until the event completes; cora's stream waits have no deadline, so a
    // timeout is not enforced (docs/acl-compat.md).
    return aclrtStreamWaitEvent(stream, event);
  });
}

aclError aclrtStreamWaitEventWithFlag(aclrtStream stream, aclrtEvent event, uint32_t timeout, uint32_t flag) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(flag == ACL_EVENT_WAIT_DEFAULT || flag == ACL_EVENT_WAIT_EXTERNAL,
                     "flag must be ACL_EVENT_WAIT_DEFAULT or ACL_EVENT_WAIT_EXTERNAL");
    if (flag == ACL_EVENT_WAIT_EXTERNAL)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "external waits of captured graphs are not supported");
    CORA_ACL_REQUIRE(timeout <= 0x7fffffffu, "timeout is too large");
    return aclrtStreamWaitEventWithTimeout(stream, event, static_cast<int32_t>(timeout));
  });
}

aclError aclrtValueWrite(void* devAddr, uint64_t value, uint32_t flag, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(devAddr, "devAddr is NULL");
    CORA_ACL_REQUIRE(flag == 0, "flag is reserved and must be 0");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    // One 64-bit store in stream order, which an aclrtValueWait of another stream sees whole.
    auto p = s->s.write_value(static_cast<std::uint64_t*>(devAddr), value);
    return check_enqueued(api, p);
  });
}

aclError aclrtStreamAbort(aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    std::error_code ec;
    s->s.abort(ec);
    if (ec)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                  "a GPU stream cannot discard work already handed to the driver: " +
                      cora::last_error_message());
    // The discarded tasks are gone once the running one has finished; the stream is then
    // clean for new work (their abort is not reported again). An earlier failure still is.
    auto p = s->s.synchronize();
    std::error_code done;
    p.wait(done);
    if (done && done != make_error_code(cora::errc::aborted)) return fail(done, api, op_message(p));
    return ACL_SUCCESS;
  });
}

aclError aclrtValueWait(void* devAddr, uint64_t value, uint32_t flag, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(devAddr, "devAddr is NULL");
    // CANN's ACL_VALUE_WAIT_GEQ, _EQ, _AND, _NOR: the values of cora::wait_condition.
    CORA_ACL_REQUIRE(flag <= 3u, "flag must be 0 (GEQ), 1 (EQ), 2 (AND) or 3 (NOR)");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    auto p = s->s.wait_value(static_cast<const std::uint64_t*>(devAddr), value,
                             static_cast<cora::wait_condition>(flag));
    return check_enqueued(api, p);
  });
}

}  // extern "C"
