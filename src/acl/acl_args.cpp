// Argument lists (aclrtArgsHandle) on cora::kernel_args.
#include <cstring>

#include "acl/acl_state.hpp"
#include "cora/detail/checked_size.hpp"

using namespace cora::acl;

namespace {

// CANN's aclrtKernelArgsInit hands each thread one handle, reset by every Init on that thread
// and never freed; so does this. The holder unregisters it when the thread ends.
struct thread_args {
  std::shared_ptr<args_obj> obj = std::make_shared<args_obj>();
  ~thread_args() {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    st.args.erase(obj.get());
  }
};
thread_local thread_args this_thread_args;

aclError param_of(const char* api, const args_obj& a, aclrtParamHandle handle, std::uint32_t& index) {
  CORA_ACL_REQUIRE(handle, "paramHandle is NULL");
  if (!a.param_index(handle, index))
    return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "paramHandle is no parameter of this argument list");
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtKernelArgsInit(aclrtFuncHandle funcHandle, aclrtArgsHandle* argsHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    auto& a = this_thread_args.obj;
    a->args.reset(fn->k);
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    st.args.emplace(a.get(), a);  // again after an aclFinalize
    *argsHandle = a.get();
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsInitByUserMem(aclrtFuncHandle funcHandle, aclrtArgsHandle argsHandle, void* userHostMem,
                                      size_t actualArgsSize) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    CORA_ACL_REQUIRE(userHostMem, "userHostMem is NULL");
    CORA_ACL_REQUIRE(actualArgsSize > 0, "actualArgsSize must be > 0");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    CORA_ACL_REQUIRE(actualArgsSize >= fn->k.args_size(),
                     "actualArgsSize (" + std::to_string(actualArgsSize) + ") is smaller than the kernel's " +
                         std::to_string(fn->k.args_size()) + "-byte argument block");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    // The handle lives in the caller's memory (a header naming the list); the list itself is
    // ours, reused when the same memory is initialized again.
    auto& a = st.args[argsHandle];
    if (a && !a->user_mem)
      return fail(ACL_ERROR_INVALID_PARAM, api,
                  "argsHandle is the handle of aclrtKernelArgsInit, not memory for a handle");
    if (!a) a = std::make_shared<args_obj>();
    // A user buffer belongs to one handle: one that wrote it before is retired (its memory was
    // reused), and so is this handle's link to an older buffer.
    if (a->user_mem && a->user_mem != userHostMem) st.user_mem_handles.erase(a->user_mem);
    if (auto u = st.user_mem_handles.find(userHostMem); u != st.user_mem_handles.end() && u->second != argsHandle)
      st.retire_user_args_locked(u->second);
    st.user_mem_handles[userHostMem] = argsHandle;
    a->args.reset(fn->k);
    a->user_mem = userHostMem;
    a->user_size = actualArgsSize;
    const user_args_header h{user_args_header::magic_value, a.get()};
    std::memcpy(argsHandle, &h, sizeof(h));
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsGetMemSize(aclrtFuncHandle funcHandle, size_t userArgsSize, size_t* actualArgsSize) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    CORA_ACL_REQUIRE(actualArgsSize, "actualArgsSize is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    // CANN's sizing: the user's bytes, eight 8-byte system slots, and one 8-byte slot per
    // parameter. It covers cora's block too: each parameter and placeholder payload pads to 8.
    std::size_t size = 0;
    CORA_ACL_REQUIRE(cora::detail::checked_add(userArgsSize, 8 * 8 + fn->k.params().size() * 8, size),
                     "userArgsSize (" + std::to_string(userArgsSize) + ") overflows the size");
    *actualArgsSize = size;
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsGetHandleMemSize(aclrtFuncHandle funcHandle, size_t* memSize) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    CORA_ACL_REQUIRE(memSize, "memSize is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    *memSize = user_args_handle_size;
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsAppend(aclrtArgsHandle argsHandle, void* param, size_t paramSize,
                               aclrtParamHandle* paramHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    CORA_ACL_REQUIRE(param, "param is NULL");
    CORA_ACL_REQUIRE(paramSize > 0, "paramSize must be > 0");
    CORA_ACL_REQUIRE(paramHandle, "paramHandle is NULL");
    std::shared_ptr<args_obj> a;
    if (aclError e = resolve_args(api, argsHandle, a)) return e;
    std::error_code ec;
    const auto h = a->args.append(param, paramSize, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    *paramHandle = a->param_handle(h.index);
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsAppendPlaceHolder(aclrtArgsHandle argsHandle, aclrtParamHandle* paramHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    CORA_ACL_REQUIRE(paramHandle, "paramHandle is NULL");
    std::shared_ptr<args_obj> a;
    if (aclError e = resolve_args(api, argsHandle, a)) return e;
    std::error_code ec;
    const auto h = a->args.append_placeholder(ec);
    // After a buffer was fetched, after finalize, or on a parameter that is no pointer:
    // ACL_ERROR_RT_FEATURE_NOT_SUPPORT, as CANN rejects late appends.
    if (ec) return fail(ec, api, cora::last_error_message());
    *paramHandle = a->param_handle(h.index);
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsGetPlaceHolderBuffer(aclrtArgsHandle argsHandle, aclrtParamHandle paramHandle, size_t dataSize,
                                             void** bufferAddr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    CORA_ACL_REQUIRE(paramHandle, "paramHandle is NULL");
    CORA_ACL_REQUIRE(dataSize > 0, "dataSize must be > 0");
    CORA_ACL_REQUIRE(bufferAddr, "bufferAddr is NULL");
    std::shared_ptr<args_obj> a;
    if (aclError e = resolve_args(api, argsHandle, a)) return e;
    std::uint32_t index;
    if (aclError e = param_of(api, *a, paramHandle, index)) return e;
    std::error_code ec;
    void* buf = a->args.placeholder_buffer(cora::param_handle{index}, dataSize, ec);
    if (ec == cora::errc::placeholder_misuse)  // a normal parameter has no buffer
      return fail(ACL_ERROR_RT_PARAM_INVALID, ec, api, cora::last_error_message());
    if (ec) return fail(ec, api, cora::last_error_message());
    *bufferAddr = buf;
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsParaUpdate(aclrtArgsHandle argsHandle, aclrtParamHandle paramHandle, void* param,
                                   size_t paramSize) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    CORA_ACL_REQUIRE(paramHandle, "paramHandle is NULL");
    CORA_ACL_REQUIRE(param, "param is NULL");
    CORA_ACL_REQUIRE(paramSize > 0, "paramSize must be > 0");
    std::shared_ptr<args_obj> a;
    if (aclError e = resolve_args(api, argsHandle, a)) return e;
    std::uint32_t index;
    if (aclError e = param_of(api, *a, paramHandle, index)) return e;
    std::error_code ec;
    a->args.update(cora::param_handle{index}, param, paramSize, ec);
    if (ec == cora::errc::placeholder_misuse)  // a placeholder is updated through its buffer
      return fail(ACL_ERROR_RT_PARAM_INVALID, ec, api, cora::last_error_message());
    if (ec) return fail(ec, api, cora::last_error_message());
    return ACL_SUCCESS;
  });
}

aclError aclrtKernelArgsFinalize(aclrtArgsHandle argsHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    std::shared_ptr<args_obj> a;
    if (aclError e = resolve_args(api, argsHandle, a)) return e;
    std::error_code ec;
    a->args.finalize(ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    if (a->user_mem) {
      // The caller's buffer holds the finalized block, as CANN keeps it there.
      const auto& block = a->args.block();
      if (block.size() > a->user_size)
        return fail(ACL_ERROR_INVALID_PARAM, api,
                    "the argument block (" + std::to_string(block.size()) +
                        " bytes) does not fit the user memory of " + std::to_string(a->user_size) +
                        " bytes (size it with aclrtKernelArgsGetMemSize)");
      // A kernel without parameters has an empty block, and no data() to copy from.
      if (!block.empty()) std::memcpy(a->user_mem, block.data(), block.size());
    }
    return ACL_SUCCESS;
  });
}

}  // extern "C"
