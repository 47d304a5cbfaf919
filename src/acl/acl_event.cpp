// Events.
#include <chrono>
#include <condition_variable>

#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

aclError lookup_event(const char* api, aclrtEvent event, const char* what, std::shared_ptr<event_obj>& out) {
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  return lookup_locked(st, st.events, api, event, what, out);
}

aclError create_event(const char* api, aclrtEvent* event, uint32_t flag) {
  CORA_ACL_REQUIRE(event, "event is NULL");
  constexpr uint32_t known = ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE |
                             ACL_EVENT_DEVICE_USE_ONLY | ACL_EVENT_EXTERNAL | ACL_EVENT_IPC;
  CORA_ACL_REQUIRE((flag & ~known) == 0, "unknown event flag bits");
  constexpr uint32_t unsupported =
      ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_DEVICE_USE_ONLY | ACL_EVENT_EXTERNAL | ACL_EVENT_IPC;
  if (flag & unsupported)
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                "event flags CAPTURE_STREAM_PROGRESS, DEVICE_USE_ONLY, EXTERNAL and IPC are not supported");
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  context ctx;
  if (aclError e = current_locked(st, api, ctx)) return e;
  auto ev = std::make_shared<event_obj>();
  ev->ev = ctx.device->make_event({.timing = (flag & ACL_EVENT_TIME_LINE) != 0});
  ev->device = ctx.index;
  ev->flags = flag;
  *event = ev.get();
  st.events.emplace(ev.get(), std::move(ev));
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtCreateEvent(aclrtEvent* event) {
  const char* const api = __func__;
  // CANN's plain events serve both timing and stream waits.
  return guarded(api, [&] { return create_event(api, event, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE); });
}

aclError aclrtCreateEventWithFlag(aclrtEvent* event, uint32_t flag) {
  const char* const api = __func__;
  return guarded(api, [&] { return create_event(api, event, flag); });
}

aclError aclrtDestroyEvent(aclrtEvent event) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    std::shared_ptr<event_obj> ev;
    std::lock_guard lock(st.mutex);
    if (aclError e = lookup_locked(st, st.events, api, event, "event", ev)) return e;
    st.events.erase(event);  // a record still in flight keeps the core's event alive
    return ACL_SUCCESS;
  });
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    auto p = s->s.record(ev->ev);
    return check_enqueued(api, p);
  });
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    if (!(ev->flags & ACL_EVENT_SYNC))
      return fail(ACL_ERROR_INVALID_PARAM, api, "a stream can wait only for an event created with ACL_EVENT_SYNC");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    auto p = s->s.wait(ev->ev);
    return check_enqueued(api, p);
  });
}

aclError aclrtSynchronizeEvent(aclrtEvent event) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    auto p = ev->ev.synchronize();
    return wait(api, p);
  });
}

aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (timeout < -1)
      return fail(ACL_ERROR_RT_PARAM_INVALID, api, "timeout must be -1 (forever) or >= 0 ms");
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    auto p = ev->ev.synchronize();
    if (timeout < 0) return wait(api, p);
    // A wait on an event does not consume the stream's fault, so it may be abandoned on timeout:
    // the handler only touches state it shares.
    struct shared {
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      std::error_code ec;
    };
    auto sh = std::make_shared<shared>();
    p.async_wait([sh](std::error_code ec) {
      std::lock_guard lock(sh->m);
      sh->done = true;
      sh->ec = ec;
      sh->cv.notify_all();
    });
    std::unique_lock lock(sh->m);
    if (!sh->cv.wait_for(lock, std::chrono::milliseconds(timeout), [&] { return sh->done; }))
      return fail(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, api,
                  "the event's work has not completed after " + std::to_string(timeout) + " ms");
    if (sh->ec) return fail(sh->ec, api, op_message(p));
    return ACL_SUCCESS;
  });
}

aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(status, "status is NULL");
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    *status = ev->ev.ready() ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return ACL_SUCCESS;
  });
}

aclError aclrtEventElapsedTime(float* ms, aclrtEvent startEvent, aclrtEvent endEvent) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(ms, "ms is NULL");
    std::shared_ptr<event_obj> a, b;
    if (aclError e = lookup_event(api, startEvent, "startEvent", a)) return e;
    if (aclError e = lookup_event(api, endEvent, "endEvent", b)) return e;
    if (!(a->flags & ACL_EVENT_TIME_LINE) || !(b->flags & ACL_EVENT_TIME_LINE))
      return fail(ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, api,
                  "elapsed time needs events created with timestamps (ACL_EVENT_TIME_LINE)");
    std::error_code ec;
    const auto d = cora::event::elapsed(a->ev, b->ev, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    *ms = static_cast<float>(d.count());
    return ACL_SUCCESS;
  });
}

}  // extern "C"
