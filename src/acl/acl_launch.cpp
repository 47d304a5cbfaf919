// The five launch calls and aclrtLaunchKernelCfg.
#include <cstring>
#include <span>

#include "acl/acl_state.hpp"

using namespace cora::acl;

static_assert(sizeof(aclrtPlaceHolderInfo) == sizeof(cora::placeholder_info) &&
                  offsetof(aclrtPlaceHolderInfo, addrOffset) == offsetof(cora::placeholder_info, addr_offset) &&
                  offsetof(aclrtPlaceHolderInfo, dataOffset) == offsetof(cora::placeholder_info, data_offset),
              "cora::placeholder_info has CANN's layout");

namespace {

// Maps CANN's launch attributes onto cora::launch_config. What cora can honour is honoured;
// what it cannot is refused with ACL_ERROR_RT_FEATURE_NOT_SUPPORT, never dropped.
aclError make_config(const char* api, uint32_t numBlocks, const aclrtLaunchKernelCfg* cfg, cora::launch_config& out) {
  out = {};
  out.grid = cora::dim3(numBlocks);
  if (!cfg) return ACL_SUCCESS;
  CORA_ACL_REQUIRE(cfg->numAttrs == 0 || cfg->attrs, "cfg->attrs is NULL");
  bool seen[10] = {};
  for (std::size_t i = 0; i < cfg->numAttrs; ++i) {
    const auto& a = cfg->attrs[i];
    const auto id = enum_value(a.id);
    CORA_ACL_REQUIRE(id >= 1 && id <= 9, "unknown launch attribute " + std::to_string(id));
    CORA_ACL_REQUIRE(!seen[id], "launch attribute " + std::to_string(id) + " is given twice");
    seen[id] = true;
    const auto& v = a.value;
    switch (id) {
      case ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE:
        CORA_ACL_REQUIRE(v.schemMode <= 1, "schemMode must be 0 (normal) or 1 (batch)");
        out.schedule = v.schemMode == 1 ? cora::schedule_mode::batch : cora::schedule_mode::normal;
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE:
        // Dynamic unified-buffer bytes per block: cora's dynamic shared memory. A backend
        // without it refuses the launch.
        out.shared_bytes = v.dynUBufSize;
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE:
        // Every cora block runs on one kind of compute unit, the AI Core's counterpart.
        if (enum_value(v.engineType) != ACL_RT_ENGINE_TYPE_AIC)
          return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "only ACL_RT_ENGINE_TYPE_AIC engines exist on cora");
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET:
        if (v.blockDimOffset != 0)
          return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "a block offset (engine split) is not supported");
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH:
        CORA_ACL_REQUIRE(v.isBlockTaskPrefetch <= 1, "isBlockTaskPrefetch must be 0 or 1");
        if (v.isBlockTaskPrefetch)
          return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "block task prefetch is not supported");
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP:
        CORA_ACL_REQUIRE(v.isDataDump <= 1, "isDataDump must be 0 or 1");
        if (v.isDataDump) return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "data dump is not supported");
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT:
        out.timeout = std::chrono::seconds(v.timeout);  // 0: no limit, as in CANN
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US:
        out.timeout = std::chrono::microseconds(
            static_cast<std::int64_t>((static_cast<std::uint64_t>(v.timeoutUs.timeoutHigh) << 32 |
                                       v.timeoutUs.timeoutLow) &
                                      0x7fffffffffffffffull));
        break;
      case ACL_RT_LAUNCH_KERNEL_ATTR_ENABLE_PROFILING:
        CORA_ACL_REQUIRE(v.enableProfiling <= 1, "enableProfiling must be 0 or 1");
        if (v.enableProfiling)
          return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "per-launch profiling is not supported");
        break;
    }
  }
  CORA_ACL_REQUIRE(!(seen[ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT] && seen[ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US]),
                   "TIMEOUT and TIMEOUT_US cannot be combined");
  return ACL_SUCCESS;
}

struct target {
  std::shared_ptr<function_obj> fn;
  std::shared_ptr<stream_obj> stream;
  cora::launch_config cfg;
};

// The checks every launch shares, in CANN's order: NULL function, zero blocks, the config, then
// the handles.
aclError prepare(const char* api, const void* func, bool symbols, uint32_t numBlocks, aclrtStream stream,
                 const aclrtLaunchKernelCfg* cfg, target& out) {
  CORA_ACL_REQUIRE(func, "the function handle is NULL");
  CORA_ACL_REQUIRE(numBlocks > 0, "numBlocks must be > 0");
  if (aclError e = make_config(api, numBlocks, cfg, out.cfg)) return e;
  if (aclError e = resolve_function(api, func, symbols, out.fn)) return e;
  return resolve_stream(api, stream, out.stream);
}

aclError launch_device_args(const char* api, aclrtFuncHandle funcHandle, uint32_t numBlocks, const void* argsData,
                            size_t argsSize, const aclrtLaunchKernelCfg* cfg, aclrtStream stream) {
  CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
  CORA_ACL_REQUIRE(argsData, "argsData is NULL");
  target t;
  if (aclError e = prepare(api, funcHandle, false, numBlocks, stream, cfg, t)) return e;
  auto p = t.stream->s.launch_device_block(t.fn->k, t.cfg, argsData, argsSize);
  return check_enqueued(api, p);
}

}  // namespace

extern "C" {

aclError aclrtLaunchKernel(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void* argsData, size_t argsSize,
                           aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&] { return launch_device_args(api, funcHandle, numBlocks, argsData, argsSize, nullptr, stream); });
}

aclError aclrtLaunchKernelV2(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void* argsData, size_t argsSize,
                             aclrtLaunchKernelCfg* cfg, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&] { return launch_device_args(api, funcHandle, numBlocks, argsData, argsSize, cfg, stream); });
}

aclError aclrtLaunchKernelWithConfig(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                     aclrtLaunchKernelCfg* cfg, aclrtArgsHandle argsHandle, void* reserve) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    CORA_ACL_REQUIRE(numBlocks > 0, "numBlocks must be > 0");
    CORA_ACL_REQUIRE(argsHandle, "argsHandle is NULL");
    CORA_ACL_REQUIRE(reserve == nullptr, "reserve is reserved and must be NULL");
    target t;
    if (aclError e = prepare(api, funcHandle, false, numBlocks, stream, cfg, t)) return e;
    std::shared_ptr<args_obj> a;
    if (aclError e = resolve_args(api, argsHandle, a)) return e;
    auto p = t.stream->s.launch(t.fn->k, t.cfg, a->args);
    if (a->user_mem) {
      // A list in user memory is consumed by its launch (the launch holds a copy of its block):
      // its entry goes now, or one would be kept per handle address until aclFinalize.
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      st.retire_user_args_locked(argsHandle);
      std::memset(argsHandle, 0, sizeof(user_args_header));
    }
    return check_enqueued(api, p);
  });
}

aclError aclrtLaunchKernelWithHostArgs(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                       aclrtLaunchKernelCfg* cfg, void* hostArgs, size_t argsSize,
                                       aclrtPlaceHolderInfo* placeHolderArray, size_t placeHolderNum) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    CORA_ACL_REQUIRE(hostArgs, "hostArgs is NULL");
    CORA_ACL_REQUIRE(placeHolderNum == 0 || placeHolderArray, "placeHolderArray is NULL but placeHolderNum is not 0");
    target t;
    if (aclError e = prepare(api, funcHandle, false, numBlocks, stream, cfg, t)) return e;
    const std::span<const cora::placeholder_info> phs(reinterpret_cast<const cora::placeholder_info*>(placeHolderArray),
                                                      placeHolderNum);
    auto p = t.stream->s.launch_host_block(
        t.fn->k, t.cfg, std::span<const std::byte>(static_cast<const std::byte*>(hostArgs), argsSize), phs);
    // A placeholder entry that points outside the block is a bad value, as CANN checks it.
    return check_enqueued(api, p, {{cora::errc::placeholder_misuse, ACL_ERROR_RT_PARAM_INVALID}});
  });
}

aclError aclrtLaunchKernelWithArgsArray(void* func, uint32_t numBlocks, aclrtStream stream, aclrtLaunchKernelCfg* cfg,
                                        void** args) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    target t;
    if (aclError e = prepare(api, func, true, numBlocks, stream, cfg, t)) return e;
    CORA_ACL_REQUIRE(args || t.fn->k.params().empty(), "args is NULL");
    auto p = t.stream->s.launch_pointer_array(t.fn->k, t.cfg, const_cast<const void* const*>(args));
    return check_enqueued(api, p);
  });
}

}  // extern "C"
