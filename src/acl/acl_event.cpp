// Events.
#include <chrono>
#include <condition_variable>

#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

constexpr std::size_t max_events_per_device = 65536;  // the limit cora reports and enforces

std::size_t events_of_device_locked(state& st, std::size_t device) {
  std::size_t n = 0;
  for (auto& [h, e] : st.events) n += e->device == device;
  return n;
}

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
  if (events_of_device_locked(st, ctx.index) >= max_events_per_device)
    return fail(ACL_ERROR_RT_NO_EVENT_RESOURCE, api,
                "the device has " + std::to_string(max_events_per_device) + " events already");
  auto ev = std::make_shared<event_obj>();
  ev->ev = ctx.device->make_event({.timing = (flag & ACL_EVENT_TIME_LINE) != 0});
  ev->device = ctx.index;
  ev->flags = flag;
  ev->id = st.next_event_id++;
  *event = ev.get();
  st.events.emplace(ev.get(), std::move(ev));
  return ACL_SUCCESS;
}

// The origin of a device's event time line (aclrtEventGetTimestamp): an event recorded once.
struct origin_obj {
  std::weak_ptr<cora::detail::device_state> device;  // a later runtime may reuse the address
  cora::event ev;
  std::uint64_t base_us = 0;
};

aclError device_origin(const char* api, std::size_t device, std::shared_ptr<origin_obj>& out) {
  static std::mutex m;
  static std::unordered_map<const void*, std::shared_ptr<origin_obj>> origins;  // by device state
  std::shared_ptr<cora::runtime> rt;
  if (aclError e = initialized_runtime(api, rt)) return e;
  auto& dev = rt->device(device);
  std::lock_guard lock(m);
  auto& o = origins[dev.state().get()];
  if (!o || o->device.expired()) {
    auto fresh = std::make_shared<origin_obj>();
    fresh->device = dev.state();
    fresh->ev = dev.make_event({.timing = true});
    auto s = dev.make_stream();
    auto p = s.record(fresh->ev);
    if (aclError e = wait(api, p)) return e;
    auto q = s.synchronize();
    if (aclError e = wait(api, q)) return e;
    fresh->base_us = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                    std::chrono::steady_clock::now().time_since_epoch())
                                                    .count());
    o = std::move(fresh);
  }
  out = o;
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
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      ev->recorded = true;
    }
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

aclError aclrtCreateEventExWithFlag(aclrtEvent* event, uint32_t flag) {
  const char* const api = __func__;
  // cora's events can be recorded again at any time: "reused naturally", as this form promises.
  return guarded(api, [&] { return create_event(api, event, flag); });
}

aclError aclrtRecordEventWithFlag(aclrtEvent event, aclrtStream stream, uint32_t flag) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(flag == ACL_EVENT_RECORD_DEFAULT || flag == ACL_EVENT_RECORD_EXTERNAL,
                     "flag must be ACL_EVENT_RECORD_DEFAULT or ACL_EVENT_RECORD_EXTERNAL");
    if (flag == ACL_EVENT_RECORD_EXTERNAL)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "external records of captured graphs are not supported");
    return aclrtRecordEvent(event, stream);
  });
}

aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    // CANN requires the stream's tasks to be done before a reset; the event becomes
    // unrecorded (a record still in flight keeps the old core event alive).
    auto fresh = s->s.device().make_event({.timing = (ev->flags & ACL_EVENT_TIME_LINE) != 0});
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    ev->ev = std::move(fresh);
    ev->recorded = false;
    return ACL_SUCCESS;
  });
}

aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus* status) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(status, "status is NULL");
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    *status = ev->ev.ready() ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
    return ACL_SUCCESS;
  });
}

aclError aclrtQueryEventWaitStatus(aclrtEvent event, aclrtEventWaitStatus* status) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(status, "status is NULL");
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    bool recorded;
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      recorded = ev->recorded;
    }
    // A wait would pass only once the event has been recorded and its work is done.
    *status = recorded && ev->ev.ready() ? ACL_EVENT_WAIT_STATUS_COMPLETE : ACL_EVENT_WAIT_STATUS_NOT_READY;
    return ACL_SUCCESS;
  });
}

aclError aclrtEventGetTimestamp(aclrtEvent event, uint64_t* timestamp) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(timestamp, "timestamp is NULL");
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    if (!(ev->flags & ACL_EVENT_TIME_LINE))
      return fail(ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, api, "the event was created without ACL_EVENT_TIME_LINE");
    std::shared_ptr<origin_obj> origin;
    if (aclError e = device_origin(api, ev->device, origin)) return e;
    std::error_code ec;
    const auto d = cora::event::elapsed(origin->ev, ev->ev, ec);
    if (ec)
      return fail(ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, ec, api,
                  "the event has not completed a record (" + cora::last_error_message() + ")");
    // Microseconds on a per-device time line whose origin is the first timestamp query.
    const double us = d.count() * 1000.0;
    *timestamp = origin->base_us + static_cast<uint64_t>(us < 0 ? 0 : us);
    return ACL_SUCCESS;
  });
}

aclError aclrtGetEventId(aclrtEvent event, uint32_t* eventId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(eventId, "eventId is NULL");
    std::shared_ptr<event_obj> ev;
    if (aclError e = lookup_event(api, event, "event", ev)) return e;
    *eventId = ev->id;
    return ACL_SUCCESS;
  });
}

aclError aclrtGetEventAvailNum(uint32_t* eventCount) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(eventCount, "eventCount is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    *eventCount = static_cast<uint32_t>(max_events_per_device - events_of_device_locked(st, ctx.index));
    return ACL_SUCCESS;
  });
}

}  // extern "C"
