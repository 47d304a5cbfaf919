#include "acl/acl_state.hpp"

#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include <asio/error.hpp>

namespace cora::acl {

namespace {

thread_local std::string recent_message;
thread_local aclError last_code = ACL_SUCCESS;
thread_local std::uint32_t last_task_id = 0;
std::atomic<std::uint32_t> next_task_id{1};
struct sync_target {
  bool set = false;
  std::size_t device = 0;
  std::int32_t stream_id = 0;
};
thread_local sync_target sync_of_thread;

// A code CANN gives for a failed task (kernel fault, timeout, lost device).
bool task_failure(aclError code) {
  return code == ACL_ERROR_RT_AICORE_EXCEPTION || code == ACL_ERROR_RT_AICORE_TIMEOUT ||
         code == ACL_ERROR_RT_LOST_HEARTBEAT;
}

/// The device the calling thread set, valid while its epoch and generation are current.
struct binding {
  const void* ctx = nullptr;  // a context of aclrtCreateContext, or null for the device's own
  std::size_t device = 0;
  std::uint64_t epoch = 0;
  std::uint64_t generation = 0;
  bool set = false;
};
thread_local binding current_binding;

}  // namespace

// --- errors ------------------------------------------------------------------------------------

aclError fail(aclError code, const char* api, const std::string& message) {
  try {
    recent_message = std::string(api) + ": " + message;
  } catch (...) {
  }
  last_code = code;
  if (task_failure(code) && sync_of_thread.set)
    report_task_failure(code, sync_of_thread.device, sync_of_thread.stream_id);
  return code;
}

aclError last_error(bool clear) noexcept {
  const aclError c = last_code;
  if (clear) last_code = ACL_SUCCESS;
  return c;
}

std::uint32_t count_task() noexcept { return last_task_id = next_task_id.fetch_add(1, std::memory_order_relaxed); }
std::uint32_t last_task() noexcept { return last_task_id; }

synchronizing::synchronizing(std::size_t device, std::int32_t stream_id) noexcept {
  sync_of_thread = {true, device, stream_id};
}
synchronizing::~synchronizing() { sync_of_thread = {}; }

const char* recent_error_message() noexcept {
  return recent_message.empty() ? nullptr : recent_message.c_str();
}

aclError to_acl(std::error_code ec) noexcept {
  if (!ec) return ACL_SUCCESS;
  if (ec.category() == cora::error_category()) {
    switch (static_cast<cora::errc>(ec.value())) {
      case errc::invalid_argument:
      case errc::invalid_pointer:
      case errc::out_of_range:
      case errc::invalid_binary:
      case errc::kernel_not_found:
      case errc::argument_mismatch:
      case errc::invalid_launch_config:
      case errc::args_not_finalized:
      case errc::too_many_arguments:
        return ACL_ERROR_RT_PARAM_INVALID;
      case errc::invalid_handle:
      case errc::binary_unloaded:
      case errc::already_unloaded:
        return ACL_ERROR_RT_INVALID_HANDLE;
      case errc::out_of_memory: return ACL_ERROR_RT_MEMORY_ALLOCATION;
      case errc::placeholder_misuse:
      case errc::args_finalized:
      case errc::not_supported:
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
      case errc::kernel_fault: return ACL_ERROR_RT_AICORE_EXCEPTION;
      case errc::kernel_timeout: return ACL_ERROR_RT_AICORE_TIMEOUT;
      case errc::device_lost: return ACL_ERROR_RT_LOST_HEARTBEAT;
      case errc::wrong_device: return ACL_ERROR_RT_STREAM_CONTEXT;
      case errc::runtime_shut_down: return ACL_ERROR_UNINITIALIZE;
      case errc::no_device: return ACL_ERROR_RT_INVALID_DEVICEID;
      case errc::driver_error: return ACL_ERROR_RT_DRV_INTERNAL_ERROR;
      case errc::not_ready: return ACL_ERROR_RT_EVENT_NOT_COMPLETE;
      case errc::timed_out: return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
      case errc::copy_fault: return ACL_ERROR_RT_COPY_DATA;
      case errc::illegal_in_capture: return ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED;
      case errc::aborted: return ACL_ERROR_RT_STREAM_ABORT;
    }
    return ACL_ERROR_RT_INTERNAL_ERROR;
  }
  // Other categories (asio's, the system's, the generic one) are matched by meaning, through
  // their error conditions: a wait aborted by a shutdown carries asio's operation_aborted.
  // asio's system category holds errno values but maps them to no std::errc condition, so its
  // codes are read as the system's.
  if (ec.category() == asio::error::get_system_category()) ec = std::error_code(ec.value(), std::system_category());
  if (ec == std::errc::operation_canceled) return ACL_ERROR_RT_DEVICE_TASK_ABORT;
  if (ec == std::errc::timed_out) return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
  if (ec == std::errc::not_enough_memory) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  if (ec == std::errc::invalid_argument) return ACL_ERROR_RT_PARAM_INVALID;
  if (ec == std::errc::function_not_supported || ec == std::errc::not_supported ||
      ec == std::errc::operation_not_supported)
    return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
  // The core reports file errors (binaries read from disk) in the system category.
  if (ec.default_error_condition().category() == std::generic_category()) return ACL_ERROR_RT_FILE_OPEN;
  return ACL_ERROR_RT_INTERNAL_ERROR;
}

aclError fail(aclError code, std::error_code ec, const char* api, const std::string& detail) {
  std::string m = detail.empty() ? ec.message() : detail;
  if (!detail.empty() && detail != ec.message()) m += " (" + ec.message() + ")";
  return fail(code, api, m);
}

aclError fail(std::error_code ec, const char* api, const std::string& detail) {
  return fail(to_acl(ec), ec, api, detail);
}

aclError fail_current_exception(const char* api) noexcept {
  try {
    throw;
  } catch (const cora::error& e) {
    return fail(e.code(), api, e.what());
  } catch (const std::bad_alloc&) {
    return fail(ACL_ERROR_BAD_ALLOC, api, "out of host memory");
  } catch (const std::exception& e) {
    return fail(ACL_ERROR_INTERNAL_ERROR, api, e.what());
  } catch (...) {
    return fail(ACL_ERROR_INTERNAL_ERROR, api, "unknown exception");
  }
}

// --- objects -----------------------------------------------------------------------------------

bool args_obj::param_index(const void* handle, std::uint32_t& index) const noexcept {
  const auto* p = static_cast<const unsigned char*>(handle);
  // Compare as integers: the handle may point anywhere.
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto base = reinterpret_cast<std::uintptr_t>(params.data());
  if (a < base || a >= base + params.size()) return false;
  index = static_cast<std::uint32_t>(a - base);
  return index < args.param_count();
}

void report_queue::close() {
  std::lock_guard lock(mutex);
  closed = true;
  for (auto& r : reports) r->done = true;
  reports.clear();
  cv.notify_all();
}

void teardown::run() noexcept {
  try {
    for (auto& q : reporters) q->close();
    if (wait_streams)
      for (auto& s : streams) {
        std::error_code ec;
        s->s.synchronize().wait(ec);  // CANN waits for the tasks of a released stream
      }
    for (auto& c : contexts) {
      if (wait_streams && c->default_stream) {
        std::error_code ec;
        c->default_stream->s.synchronize().wait(ec);
      }
    }
    for (auto& b : binaries) {
      std::error_code ec;
      if (b->bin.loaded()) b->bin.unload(ec);  // launches in flight keep the code loaded
    }
  } catch (...) {
  }
  streams.clear();
  events.clear();
  functions.clear();
  binaries.clear();
  args.clear();
  contexts.clear();
  reporters.clear();
  runtime.reset();  // last: everything above may belong to it
}

// --- the state ---------------------------------------------------------------------------------

state& state::get() {
  static state* s = new state;  // never destroyed: thread_local objects may outlive statics
  return *s;
}

void state::release_device_locked(std::size_t index, teardown& out) {
  auto& slot = devices[index];
  auto take = [&](auto& map, auto& into) {
    for (auto it = map.begin(); it != map.end();) {
      if (it->second->device == index) {
        into.push_back(std::move(it->second));
        it = map.erase(it);
      } else {
        ++it;
      }
    }
  };
  take(streams, out.streams);
  take(events, out.events);
  take(binaries, out.binaries);
  take(functions, out.functions);
  for (auto& s : out.streams) {
    if (s->subscriber && --s->subscriber->streams == 0) {
      reporters.erase(s->subscriber->thread_id);
      out.reporters.push_back(s->subscriber);
    }
    s->subscriber.reset();
    if (s->host_func_thread && --s->host_func_thread->streams == 0) {
      host_func_threads.erase(s->host_func_thread->thread_id);
      out.reporters.push_back(s->host_func_thread);
    }
    s->host_func_thread.reset();
  }
  for (auto* s : {&slot.default_stream, &slot.sync_stream})
    if (*s) {
      if ((*s)->subscriber && --(*s)->subscriber->streams == 0) {
        reporters.erase((*s)->subscriber->thread_id);
        out.reporters.push_back((*s)->subscriber);
      }
      (*s)->subscriber.reset();
      if ((*s)->host_func_thread && --(*s)->host_func_thread->streams == 0) {
        host_func_threads.erase((*s)->host_func_thread->thread_id);
        out.reporters.push_back((*s)->host_func_thread);
      }
      (*s)->host_func_thread.reset();
      out.streams.push_back(std::move(*s));
    }
  for (auto it = contexts.begin(); it != contexts.end();) {
    if (it->second->device == index) {
      out.contexts.push_back(std::move(it->second));
      it = contexts.erase(it);
    } else {
      ++it;
    }
  }
  slot.primary.reset();
  slot.symbol_functions.clear();  // their kernels stay loaded in the core's kernel libraries
  slot.refcount = 0;
  ++slot.generation;
}

void state::retire_user_args_locked(const void* handle) {
  auto it = args.find(handle);
  if (it == args.end() || !it->second->user_mem) return;
  auto u = user_mem_handles.find(it->second->user_mem);
  if (u != user_mem_handles.end() && u->second == handle) user_mem_handles.erase(u);
  args.erase(it);
}

aclError require_init_locked(state& st, const char* api) {
  if (!st.runtime) return fail(ACL_ERROR_UNINITIALIZE, api, "aclInit has not been called");
  return ACL_SUCCESS;
}

aclError initialized_runtime(const char* api, std::shared_ptr<cora::runtime>& out) {
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  if (aclError e = require_init_locked(st, api)) return e;
  out = st.runtime;
  return ACL_SUCCESS;
}

void bind_thread_locked(state& st, std::size_t index) {
  current_binding = {nullptr, index, st.epoch, st.devices[index].generation, true};
}

void bind_thread_locked(state& st, const std::shared_ptr<context_obj>& ctx) {
  if (ctx->primary) return bind_thread_locked(st, ctx->device);
  current_binding = {ctx.get(), ctx->device, st.epoch, st.devices[ctx->device].generation, true};
}

const std::shared_ptr<context_obj>& primary_context_locked(state& st, std::size_t index) {
  auto& slot = st.devices[index];
  if (!slot.primary) {
    auto c = std::make_shared<context_obj>();
    c->device = index;
    c->primary = true;
    st.contexts.emplace(c.get(), c);
    slot.primary = std::move(c);
  }
  return slot.primary;
}

aclError check_device_locked(state& st, const char* api, std::int64_t deviceId) {
  if (aclError e = require_init_locked(st, api)) return e;
  if (deviceId < 0 || static_cast<std::size_t>(deviceId) >= st.devices.size())
    return fail(ACL_ERROR_RT_INVALID_DEVICEID, api,
                "device " + std::to_string(deviceId) + " does not exist (" + std::to_string(st.devices.size()) +
                    " devices)");
  return ACL_SUCCESS;
}

aclError current_locked(state& st, const char* api, context& out) {
  if (aclError e = require_init_locked(st, api)) return e;
  const binding& b = current_binding;
  if (b.set && b.ctx && b.epoch == st.epoch) {
    auto it = st.contexts.find(b.ctx);
    if (it == st.contexts.end())
      return fail(ACL_ERROR_RT_CONTEXT_NULL, api,
                  "the thread's context was destroyed (aclrtDestroyContext, or its device was reset)");
    out.runtime = st.runtime;
    out.index = it->second->device;
    out.device = &st.runtime->device(out.index);
    out.ctx = it->second;
    return ACL_SUCCESS;
  }
  if (!b.set || b.epoch != st.epoch || b.device >= st.devices.size() ||
      b.generation != st.devices[b.device].generation || st.devices[b.device].refcount <= 0)
    return fail(ACL_ERROR_RT_CONTEXT_NULL, api,
                "no device is set on this thread (call aclrtSetDevice first)");
  out.runtime = st.runtime;
  out.index = b.device;
  out.device = &st.runtime->device(b.device);
  out.ctx = primary_context_locked(st, b.device);
  return ACL_SUCCESS;
}

bool peek_current_device_locked(state& st, std::size_t& index) {
  if (!st.runtime) return false;
  const binding& b = current_binding;
  if (!b.set || b.epoch != st.epoch || b.device >= st.devices.size()) return false;
  if (b.ctx) {
    auto it = st.contexts.find(b.ctx);
    if (it == st.contexts.end()) return false;
    index = it->second->device;
    return true;
  }
  if (b.generation != st.devices[b.device].generation || st.devices[b.device].refcount <= 0) return false;
  index = b.device;
  return true;
}

aclError current(const char* api, context& out) {
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  return current_locked(st, api, out);
}

namespace {

// One of a device's own streams (default or synchronous copies), made on first use.
const std::shared_ptr<stream_obj>& device_stream(std::shared_ptr<stream_obj>& slot, const context& ctx) {
  if (!slot) {
    auto s = std::make_shared<stream_obj>();
    s->s = ctx.device->make_stream();
    s->device = ctx.index;
    slot = std::move(s);
  }
  return slot;
}

}  // namespace

const std::shared_ptr<stream_obj>& context_stream_locked(state& st, context_obj& c, cora::device& dev) {
  if (c.primary) {
    context ctx;
    ctx.device = &dev;
    ctx.index = c.device;
    return device_stream(st.devices[c.device].default_stream, ctx);
  }
  if (!c.default_stream) {
    auto s = std::make_shared<stream_obj>();
    s->s = dev.make_stream();
    s->device = c.device;
    s->context = &c;
    c.default_stream = std::move(s);
  }
  return c.default_stream;
}

std::shared_ptr<stream_obj> new_stream_locked(state& st, const context& ctx, const cora::stream_options& o) {
  auto s = std::make_shared<stream_obj>();
  s->s = ctx.device->make_stream(o);
  s->device = ctx.index;
  s->context = ctx.ctx && !ctx.ctx->primary ? ctx.ctx.get() : nullptr;
  s->id = st.next_stream_id++;
  st.streams.emplace(s.get(), s);
  return s;
}

aclError resolve_stream_locked(state& st, const char* api, aclrtStream handle,
                               std::shared_ptr<stream_obj>& out) {
  if (handle) {
    if (aclError e = require_init_locked(st, api)) return e;
    auto it = st.streams.find(handle);
    if (it != st.streams.end()) {
      out = it->second;
      return ACL_SUCCESS;
    }
    // A context's default stream (aclrtCtxGetCurrentDefaultStream) is a handle too.
    for (auto& [h, c] : st.contexts) {
      auto& d = c->primary ? st.devices[c->device].default_stream : c->default_stream;
      if (d && d.get() == handle) {
        out = d;
        return ACL_SUCCESS;
      }
    }
    return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "the stream is not a live handle (destroyed, or never created)");
  }
  context ctx;
  if (aclError e = current_locked(st, api, ctx)) return e;
  out = context_stream_locked(st, *ctx.ctx, *ctx.device);
  return ACL_SUCCESS;
}

aclError resolve_stream(const char* api, aclrtStream handle, std::shared_ptr<stream_obj>& out) {
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  return resolve_stream_locked(st, api, handle, out);
}

aclError sync_stream_locked(state& st, const char*, const context& ctx,
                            std::shared_ptr<stream_obj>& out) {
  out = device_stream(st.devices[ctx.index].sync_stream, ctx);
  return ACL_SUCCESS;
}

aclError resolve_args(const char* api, aclrtArgsHandle handle, std::shared_ptr<args_obj>& out) {
  if (!handle) return fail(ACL_ERROR_INVALID_PARAM, api, "argsHandle is NULL");
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  if (aclError e = require_init_locked(st, api)) return e;
  auto it = st.args.find(handle);
  if (it == st.args.end())
    return fail(ACL_ERROR_RT_INVALID_HANDLE, api,
                "argsHandle is not a live argument list of aclrtKernelArgsInit or "
                "aclrtKernelArgsInitByUserMem (one in user memory is consumed by its launch)");
  if (it->second->user_mem) {
    // A handle in user memory: the caller may have reused that memory since.
    user_args_header h{};
    std::memcpy(&h, handle, sizeof(h));
    if (h.magic != user_args_header::magic_value || h.owner != it->second.get()) {
      st.retire_user_args_locked(handle);  // the memory is reused: the entry goes
      return fail(ACL_ERROR_RT_INVALID_HANDLE, api,
                  "argsHandle memory was overwritten since aclrtKernelArgsInitByUserMem");
    }
  }
  out = it->second;
  return ACL_SUCCESS;
}

// --- waiting -------------------------------------------------------------------------------------

std::string op_message(const cora::pending<void>& p) {
  const auto& h = p.handle();
  return h.source() ? h.source()->message(h.seq()) : std::string();
}

aclError wait(const char* api, cora::pending<void>& p) {
  std::error_code ec;
  p.wait(ec);
  // The runtime was finalized (or its device reset) while this call waited: CANN reports the
  // tasks it abandoned as aborted. A call made after the finalize never gets here.
  if (ec == cora::errc::runtime_shut_down)
    return fail(ACL_ERROR_RT_DEVICE_TASK_ABORT, ec, api, "the runtime was finalized while this call waited");
  if (ec) return fail(ec, api, op_message(p));
  return ACL_SUCCESS;
}

aclError check_enqueued(const char* api, cora::pending<void>& p,
                        std::initializer_list<std::pair<cora::errc, aclError>> overrides) {
  count_task();
  if (!p.ready()) return ACL_SUCCESS;
  const std::error_code ec = p.error();  // observes it: the failure is reported here, once
  if (!ec) return ACL_SUCCESS;
  for (const auto& [from, to] : overrides)
    if (ec == from) return fail(to, ec, api, op_message(p));
  return fail(ec, api, op_message(p));
}

aclError synchronize_stream(const char* api, stream_obj& s, std::int32_t timeout_ms) {
  const synchronizing sync(s.device, s.id);
  if (timeout_ms >= 0) {
    // Poll through stream::idle() (which queries the device) rather than arming a wait that a
    // timeout would abandon: an abandoned synchronize would swallow a fault reported later.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    auto nap = std::chrono::microseconds(10);
    while (!s.s.idle()) {
      if (std::chrono::steady_clock::now() >= deadline)
        return fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, api,
                    "the stream still has work after " + std::to_string(timeout_ms) + " ms");
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
  auto p = s.s.synchronize();
  return wait(api, p);
}

}  // namespace cora::acl
