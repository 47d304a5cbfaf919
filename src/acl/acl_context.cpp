// Contexts: the per-thread current context (and with it the current device), as CANN defines.
#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

aclError lookup_context(state& st, const char* api, aclrtContext handle, std::shared_ptr<context_obj>& out) {
  if (!handle) return fail(ACL_ERROR_INVALID_PARAM, api, "context is NULL");
  if (aclError e = require_init_locked(st, api)) return e;
  auto it = st.contexts.find(handle);
  if (it == st.contexts.end())
    return fail(ACL_ERROR_RT_CONTEXT_NULL, api,
                "the context is not a live handle (destroyed, its device reset, or never created)");
  out = it->second;
  return ACL_SUCCESS;
}

// aclSysParamOpt: ACL_OPT_DETERMINISTIC .. ACL_OPT_ENABLE_KERNEL_EARLY_START.
aclError check_opt(const char* api, std::int64_t opt) {
  CORA_ACL_REQUIRE(opt >= ACL_OPT_DETERMINISTIC && opt <= ACL_OPT_ENABLE_KERNEL_EARLY_START,
                   "opt " + std::to_string(opt) + " is not an aclSysParamOpt");
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtCreateContext(aclrtContext* context, int32_t deviceId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(context, "context is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (aclError e = check_device_locked(st, api, deviceId)) return e;
    auto c = std::make_shared<context_obj>();
    c->device = static_cast<std::size_t>(deviceId);
    st.contexts.emplace(c.get(), c);
    bind_thread_locked(st, c);  // CANN makes a new context the calling thread's
    *context = c.get();
    return ACL_SUCCESS;
  });
}

aclError aclrtDestroyContext(aclrtContext context) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    teardown td;
    {
      std::lock_guard lock(st.mutex);
      std::shared_ptr<context_obj> c;
      if (aclError e = lookup_context(st, api, context, c)) return e;
      if (c->primary)
        return fail(ACL_ERROR_INVALID_PARAM, api,
                    "the default context of a device is released by aclrtResetDevice, not destroyed");
      st.contexts.erase(context);
      // The context's streams go with it, as its resources do in CANN.
      for (auto it = st.streams.begin(); it != st.streams.end();) {
        if (it->second->context == context) {
          auto& s = it->second;
          if (s->subscriber && --s->subscriber->streams == 0) {
            st.reporters.erase(s->subscriber->thread_id);
            td.reporters.push_back(s->subscriber);
          }
          s->subscriber.reset();
          if (s->host_func_thread && --s->host_func_thread->streams == 0) {
            st.host_func_threads.erase(s->host_func_thread->thread_id);
            td.reporters.push_back(s->host_func_thread);
          }
          s->host_func_thread.reset();
          td.streams.push_back(std::move(s));
          it = st.streams.erase(it);
        } else {
          ++it;
        }
      }
      if (c->default_stream) td.streams.push_back(std::move(c->default_stream));
      td.contexts.push_back(std::move(c));
    }
    td.run();  // waits for the context's streams, outside the lock
    return ACL_SUCCESS;
  });
}

aclError aclrtSetCurrentContext(aclrtContext context) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    std::shared_ptr<context_obj> c;
    if (aclError e = lookup_context(st, api, context, c)) return e;
    bind_thread_locked(st, c);
    return ACL_SUCCESS;
  });
}

aclError aclrtGetCurrentContext(aclrtContext* context) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(context, "context is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    struct context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    *context = ctx.ctx.get();
    return ACL_SUCCESS;
  });
}

aclError aclrtCtxGetCurrentDefaultStream(aclrtStream* stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(stream, "stream is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    *stream = context_stream_locked(st, *ctx.ctx, *ctx.device).get();
    return ACL_SUCCESS;
  });
}

aclError aclrtGetPrimaryCtxState(int32_t deviceId, uint32_t* flags, int32_t* active) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(flags, "flags is NULL");
    CORA_ACL_REQUIRE(active, "active is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (aclError e = check_device_locked(st, api, deviceId)) return e;
    *flags = 0;
    *active = st.devices[static_cast<std::size_t>(deviceId)].refcount > 0 ? 1 : 0;
    return ACL_SUCCESS;
  });
}

// System parameters are recorded and read back: they steer CANN's operator kernels
// (determinism, debug kernels), which cora has not, so no setting changes what cora runs.
aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_opt(api, enum_value(opt))) return e;
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    ctx.ctx->sys_params[enum_value(opt)] = value;
    return ACL_SUCCESS;
  });
}

aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_opt(api, enum_value(opt))) return e;
    CORA_ACL_REQUIRE(value, "value is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    context ctx;
    if (aclError e = current_locked(st, api, ctx)) return e;
    auto it = ctx.ctx->sys_params.find(enum_value(opt));
    if (it == ctx.ctx->sys_params.end())
      return fail(ACL_ERROR_RT_PARAM_INVALID, api, "the option was not set in this context");
    *value = it->second;
    return ACL_SUCCESS;
  });
}

aclError aclrtSetSysParamOpt(aclSysParamOpt opt, int64_t value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_opt(api, enum_value(opt))) return e;
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (aclError e = require_init_locked(st, api)) return e;
    st.sys_params[enum_value(opt)] = value;
    return ACL_SUCCESS;
  });
}

aclError aclrtGetSysParamOpt(aclSysParamOpt opt, int64_t* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_opt(api, enum_value(opt))) return e;
    CORA_ACL_REQUIRE(value, "value is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (aclError e = require_init_locked(st, api)) return e;
    auto it = st.sys_params.find(enum_value(opt));
    if (it == st.sys_params.end()) return fail(ACL_ERROR_RT_PARAM_INVALID, api, "the option was not set");
    *value = it->second;
    return ACL_SUCCESS;
  });
}

}  // extern "C"
