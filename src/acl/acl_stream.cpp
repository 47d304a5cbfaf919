// Streams.
#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

aclError create_stream(const char* api, aclrtStream* stream) {
  CORA_ACL_REQUIRE(stream, "stream is NULL");
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  context ctx;
  if (aclError e = current_locked(st, api, ctx)) return e;
  auto s = std::make_shared<stream_obj>();
  s->s = ctx.device->make_stream();
  s->device = ctx.index;
  *stream = s.get();
  st.streams.emplace(s.get(), std::move(s));
  return ACL_SUCCESS;
}

// Takes a stream out of the registry: it must belong to the calling thread's device, as CANN
// requires of streams of the current context.
aclError take_stream(const char* api, aclrtStream stream, std::shared_ptr<stream_obj>& out) {
  CORA_ACL_REQUIRE(stream, "stream is NULL (the default stream cannot be destroyed)");
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
  }
  td.run();
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtCreateStream(aclrtStream* stream) {
  const char* const api = __func__;
  return guarded(api, [&] { return create_stream(api, stream); });
}

aclError aclrtCreateStreamWithConfig(aclrtStream* stream, uint32_t priority, uint32_t flag) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(stream, "stream is NULL");
    CORA_ACL_REQUIRE(priority <= 7, "priority must be in [0, 7]");
    // CANN reserves the priority on current parts (it must be 0); cora's streams have one
    // priority, so another value is refused rather than dropped.
    if (priority != 0)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "stream priorities other than 0 are not supported");
    // FAST_LAUNCH and FAST_SYNC describe how every cora stream works already (resources made at
    // creation, synchronization by polling). The others need features cora has not.
    constexpr uint32_t unsupported =
        ACL_STREAM_PERSISTENT | ACL_STREAM_HUGE | ACL_STREAM_CPU_SCHEDULE | ACL_STREAM_DEVICE_USE_ONLY;
    if (flag & unsupported)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                  "stream flags PERSISTENT, HUGE, CPU_SCHEDULE and DEVICE_USE_ONLY are not supported");
    // Other bits give a default stream, as CANN documents.
    return create_stream(api, stream);
  });
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
