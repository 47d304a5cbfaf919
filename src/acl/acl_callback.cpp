// Host callbacks: aclrtLaunchHostFunc, and aclrtLaunchCallback delivered to report threads.
#include <pthread.h>

#include <chrono>

#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

constexpr std::size_t max_report_threads = 1024;  // CANN's hard limit

std::uint64_t this_thread_id() noexcept { return static_cast<std::uint64_t>(pthread_self()); }

using thread_queues = std::unordered_map<std::uint64_t, std::shared_ptr<report_queue>>;

// Ends the subscription of `stream` held in its `slot` by thread `thread_id` (one of the
// state's `threads`): report threads and host-function threads alike. The thread's last
// stream closes its queue: what is still queued will not run, and blocked streams go on.
aclError unsubscribe(const char* api, std::uint64_t thread_id, aclrtStream stream,
                     std::shared_ptr<report_queue> stream_obj::*slot, thread_queues state::*threads,
                     const char* not_subscribed) {
  auto& st = state::get();
  std::shared_ptr<report_queue> closing;
  {
    std::lock_guard lock(st.mutex);
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream_locked(st, api, stream, s)) return e;
    auto& q = (*s).*slot;
    if (!q || q->thread_id != thread_id)
      return fail(ACL_ERROR_RT_STREAM_SUBSCRIBE, api, not_subscribed + std::to_string(thread_id));
    if (--q->streams == 0) {
      (st.*threads).erase(thread_id);
      closing = q;
    }
    q.reset();
  }
  if (closing) closing->close();
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void* args) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(fn, "fn is NULL");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    std::shared_ptr<report_queue> q;
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      q = s->host_func_thread;
    }
    if (!q) {
      // Runs on a runtime thread once earlier work is done; later work waits for it.
      auto p = s->s.host_func([fn, args] { fn(args); });
      return check_enqueued(api, p);
    }
    // A thread subscribed with aclrtSubscribeHostFunc runs it (aclrtProcessHostFunc); the
    // stream waits until it has.
    auto r = std::make_shared<report>();
    r->fn = fn;
    r->user_data = args;
    r->block = true;
    auto p = s->s.host_func([q, r] {
      std::unique_lock lock(q->mutex);
      if (q->closed) return;
      q->reports.push_back(r);
      q->cv.notify_all();
      q->cv.wait(lock, [&] { return r->done || q->closed; });
    });
    return check_enqueued(api, p);
  });
}

aclError aclrtSubscribeReport(uint64_t threadId, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream_locked(st, api, stream, s)) return e;
    if (s->subscriber)
      return fail(ACL_ERROR_RT_STREAM_SUBSCRIBE, api,
                  "the stream is already subscribed by thread " + std::to_string(s->subscriber->thread_id));
    auto& q = st.reporters[threadId];
    if (!q) {
      if (st.reporters.size() > max_report_threads) {
        st.reporters.erase(threadId);
        return fail(ACL_ERROR_RT_OVER_LIMIT, api, "at most 1024 report threads");
      }
      q = std::make_shared<report_queue>();
      q->thread_id = threadId;
    }
    ++q->streams;
    s->subscriber = q;
    return ACL_SUCCESS;
  });
}

aclError aclrtUnSubscribeReport(uint64_t threadId, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    return unsubscribe(api, threadId, stream, &stream_obj::subscriber, &state::reporters,
                       "the stream is not subscribed by thread ");
  });
}

aclError aclrtLaunchCallback(aclrtCallback fn, void* userData, aclrtCallbackBlockType blockType, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(fn, "fn is NULL");
    const auto block = enum_value(blockType);
    CORA_ACL_REQUIRE(block == ACL_CALLBACK_NO_BLOCK || block == ACL_CALLBACK_BLOCK,
                     "blockType must be ACL_CALLBACK_BLOCK or ACL_CALLBACK_NO_BLOCK");
    auto& st = state::get();
    std::shared_ptr<stream_obj> s;
    std::shared_ptr<report_queue> q;
    {
      std::lock_guard lock(st.mutex);
      if (aclError e = resolve_stream_locked(st, api, stream, s)) return e;
      q = s->subscriber;
    }
    if (!q)
      return fail(ACL_ERROR_RT_STREAM_NO_CB_REG, api,
                  "no report thread subscribed to the stream (aclrtSubscribeReport)");
    auto r = std::make_shared<report>();
    r->fn = fn;
    r->user_data = userData;
    r->block = block == ACL_CALLBACK_BLOCK;
    // In stream order, hand the callback to the report thread; a blocking one holds the stream
    // until that thread has run it.
    auto p = s->s.host_func([q, r] {
      std::unique_lock lock(q->mutex);
      if (q->closed) return;
      q->reports.push_back(r);
      q->cv.notify_all();
      if (r->block) q->cv.wait(lock, [&] { return r->done; });
    });
    return check_enqueued(api, p);
  });
}

aclError aclrtProcessReport(int32_t timeout) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(timeout == -1 || timeout > 0, "timeout must be -1 (forever) or > 0 ms");
    auto& st = state::get();
    std::shared_ptr<report_queue> q;
    {
      std::lock_guard lock(st.mutex);
      if (aclError e = require_init_locked(st, api)) return e;
      auto it = st.reporters.find(this_thread_id());
      if (it != st.reporters.end()) q = it->second;
    }
    if (!q) return fail(ACL_ERROR_RT_THREAD_SUBSCRIBE, api, "this thread is subscribed to no stream");
    std::unique_lock lock(q->mutex);
    const auto ready = [&] { return !q->reports.empty() || q->closed; };
    if (timeout < 0)
      q->cv.wait(lock, ready);
    else if (!q->cv.wait_for(lock, std::chrono::milliseconds(timeout), ready))
      return fail(ACL_ERROR_RT_REPORT_TIMEOUT, api, "no callback arrived within " + std::to_string(timeout) + " ms");
    if (q->reports.empty()) return fail(ACL_ERROR_RT_THREAD_SUBSCRIBE, api, "the thread was unsubscribed");
    while (!q->reports.empty()) {
      auto r = std::move(q->reports.front());
      q->reports.pop_front();
      lock.unlock();
      r->fn(r->user_data);
      lock.lock();
      r->done = true;
      q->cv.notify_all();
    }
    return ACL_SUCCESS;
  });
}

aclError aclrtSubscribeHostFunc(uint64_t hostFuncThreadId, aclrtStream exeStream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream_locked(st, api, exeStream, s)) return e;
    if (s->host_func_thread)
      return fail(ACL_ERROR_RT_STREAM_SUBSCRIBE, api,
                  "the stream's host functions are already run by thread " +
                      std::to_string(s->host_func_thread->thread_id));
    auto& q = st.host_func_threads[hostFuncThreadId];
    if (!q) {
      q = std::make_shared<report_queue>();
      q->thread_id = hostFuncThreadId;
    }
    ++q->streams;
    s->host_func_thread = q;
    return ACL_SUCCESS;
  });
}

aclError aclrtUnSubscribeHostFunc(uint64_t hostFuncThreadId, aclrtStream exeStream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    return unsubscribe(api, hostFuncThreadId, exeStream, &stream_obj::host_func_thread,
                       &state::host_func_threads, "the stream's host functions are not run by thread ");
  });
}

aclError aclrtProcessHostFunc(int32_t timeout) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(timeout == -1 || timeout >= 0, "timeout must be -1 (forever) or >= 0 ms");
    auto& st = state::get();
    std::shared_ptr<report_queue> q;
    {
      std::lock_guard lock(st.mutex);
      if (aclError e = require_init_locked(st, api)) return e;
      auto it = st.host_func_threads.find(this_thread_id());
      if (it != st.host_func_threads.end()) q = it->second;
    }
    if (!q)
      return fail(ACL_ERROR_RT_THREAD_SUBSCRIBE, api, "this thread runs the host functions of no stream");
    std::unique_lock lock(q->mutex);
    const auto ready = [&] { return !q->reports.empty() || q->closed; };
    if (timeout < 0)
      q->cv.wait(lock, ready);
    else if (!q->cv.wait_for(lock, std::chrono::milliseconds(timeout), ready))
      return fail(ACL_ERROR_RT_REPORT_TIMEOUT, api,
                  "no host function arrived within " + std::to_string(timeout) + " ms");
    if (q->reports.empty()) return fail(ACL_ERROR_RT_THREAD_SUBSCRIBE, api, "the thread was unsubscribed");
    while (!q->reports.empty()) {
      auto r = std::move(q->reports.front());
      q->reports.pop_front();
      lock.unlock();
      r->fn(r->user_data);
      lock.lock();
      r->done = true;
      q->cv.notify_all();
    }
    return ACL_SUCCESS;
  });
}

}  // extern "C"
