// Kernel binaries, functions, and the symbols of mixed-mode launchers.
#include <acl/cora_acl.h>

#include <cora/kernel_library.hpp>

#include <cstring>
#include <span>

#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

// --- load options ----------------------------------------------------------------------------

aclError parse_options(const char* api, const aclrtBinaryLoadOptions* options, cora::load_options& out) {
  if (!options) return ACL_SUCCESS;
  CORA_ACL_REQUIRE(options->numOpt == 0 || options->options, "options->options is NULL");
  for (std::size_t i = 0; i < options->numOpt; ++i) {
    const auto& o = options->options[i];
    switch (enum_value(o.type)) {
      case ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD:
        CORA_ACL_REQUIRE(o.value.isLazyLoad <= 1, "isLazyLoad must be 0 or 1");
        out.lazy = o.value.isLazyLoad == 1;
        break;
      case ACL_RT_BINARY_LOAD_OPT_MAGIC:
        // The magic tells CANN which core an ELF targets. cora recognizes its formats by their
        // own magic and runs every kernel on one kind of compute unit, so each of the three
        // declarations holds; other values are refused.
        CORA_ACL_REQUIRE(o.value.magic == ACL_RT_BINARY_MAGIC_ELF_AICORE ||
                             o.value.magic == ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE ||
                             o.value.magic == ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE,
                         "magic is not one of the ACL_RT_BINARY_MAGIC_ELF_* values");
        break;
      case ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE:
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                    "AI CPU kernel modes have no meaning on cora (its CPU device runs ordinary kernels)");
      default:
        return fail(ACL_ERROR_INVALID_PARAM, api,
                    "unknown load option type " + std::to_string(enum_value(o.type)));
    }
  }
  return ACL_SUCCESS;
}

aclError finish_load(const char* api, const context& ctx, cora::pending<cora::binary>& p,
                     aclrtBinHandle* binHandle) {
  std::error_code ec;
  cora::binary bin = p.wait(ec);
  if (ec) {
    const auto& h = p.handle();
    return fail(ec, api, h.source() ? h.source()->message(h.seq()) : std::string());
  }
  auto b = std::make_shared<binary_obj>();
  b->bin = std::move(bin);
  b->device = ctx.index;
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  // The device may have been reset while loading: the binary would belong to no context.
  context now;
  if (aclError e = current_locked(st, api, now)) return e;
  *binHandle = b.get();
  st.binaries.emplace(b.get(), std::move(b));
  return ACL_SUCCESS;
}

// The function handle of kernel `k` of binary `b` (one per kernel).
std::shared_ptr<function_obj> function_of(state& st, binary_obj& b, cora::kernel k) {
  const std::string name(k.name());
  auto& slot = b.functions[name];
  if (!slot) {
    slot = std::make_shared<function_obj>();
    slot->k = std::move(k);
    slot->device = b.device;
    slot->binary = &b;
  }
  st.functions.emplace(slot.get(), slot);
  return slot;
}

template <class Lookup>
aclError get_function(const char* api, aclrtBinHandle binHandle, aclrtFuncHandle* funcHandle, Lookup&& lookup) {
  auto& st = state::get();
  std::shared_ptr<binary_obj> b;
  {
    std::lock_guard lock(st.mutex);
    if (aclError e = lookup_locked(st, st.binaries, api, binHandle, "binHandle", b)) return e;
  }
  std::error_code ec;
  cora::kernel k = lookup(b->bin, ec);  // may load a lazily loaded binary: outside the lock
  if (ec) return fail(ec, api, cora::last_error_message());
  std::lock_guard lock(st.mutex);
  if (!st.binaries.count(binHandle))
    return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "the binary was unloaded meanwhile");
  *funcHandle = function_of(st, *b, std::move(k)).get();
  return ACL_SUCCESS;
}

// --- symbols ---------------------------------------------------------------------------------

// Libraries made by cora_acl_register_symbol, one per symbol. They live as long as the program:
// the core's symbol table refers to them.
struct registered_libraries {
  std::mutex mutex;
  std::vector<std::unique_ptr<cora::kernel_library>> libraries;
  static registered_libraries& get() {
    static auto* r = new registered_libraries;  // usable from static constructors and destructors
    return *r;
  }
};

// The function handle of a kernel launcher's symbol on the calling thread's device: the core's
// kernel library loads its binary on that device once (shared with C++ launches of the same
// launchers), and the handle stays until the device is reset.
aclError function_by_symbol(const char* api, const void* symbol, std::shared_ptr<function_obj>& out) {
  const cora::kernel_symbol ks = cora::find_kernel_symbol(symbol);
  if (!ks.library)
    return fail(ACL_ERROR_RT_SYMBOL_NOT_FOUND, api,
                "the symbol is no registered kernel launcher (cora_add_kernel_library or "
                "cora_acl_register_symbol)");
  auto& st = state::get();
  context ctx;
  {
    std::lock_guard lock(st.mutex);
    if (aclError e = current_locked(st, api, ctx)) return e;
    auto& slot = st.devices[ctx.index];
    if (auto it = slot.symbol_functions.find(symbol); it != slot.symbol_functions.end()) {
      out = it->second;
      return ACL_SUCCESS;
    }
  }
  cora::kernel k = ks.library->kernel(*ctx.device, ks.library->kernel_names().at(ks.index));
  std::lock_guard lock(st.mutex);
  context now;
  if (aclError e = current_locked(st, api, now)) return e;
  if (now.index != ctx.index) return fail(ACL_ERROR_RT_CONTEXT_NULL, api, "the device changed meanwhile");
  auto& fn = st.devices[ctx.index].symbol_functions[symbol];
  if (!fn) {
    fn = std::make_shared<function_obj>();
    fn->k = std::move(k);
    fn->device = ctx.index;
  }
  st.functions.emplace(fn.get(), fn);
  out = fn;
  return ACL_SUCCESS;
}

}  // namespace

namespace cora::acl {

aclError resolve_function(const char* api, const void* func, bool symbols, std::shared_ptr<function_obj>& out) {
  if (!func) return fail(ACL_ERROR_INVALID_PARAM, api, "the function handle is NULL");
  auto& st = state::get();
  {
    std::lock_guard lock(st.mutex);
    if (aclError e = require_init_locked(st, api)) return e;
    auto it = st.functions.find(func);
    if (it != st.functions.end()) {
      out = it->second;
      return ACL_SUCCESS;
    }
  }
  // As CANN's runtime does: a registered symbol first, otherwise an invalid handle.
  if (symbols && cora::find_kernel_symbol(func).library) return function_by_symbol(api, func, out);
  return fail(ACL_ERROR_RT_INVALID_HANDLE, api,
              symbols ? "func is neither a live function handle nor a registered kernel symbol"
                      : "funcHandle is not a live function handle");
}

}  // namespace cora::acl

extern "C" {

aclError aclrtBinaryLoadFromFile(const char* binPath, aclrtBinaryLoadOptions* options, aclrtBinHandle* binHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(binPath, "binPath is NULL");
    CORA_ACL_REQUIRE(binHandle, "binHandle is NULL");
    cora::load_options opts;
    if (aclError e = parse_options(api, options, opts)) return e;
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    auto p = ctx.device->load_binary(std::filesystem::path(binPath), opts);
    return finish_load(api, ctx, p, binHandle);
  });
}

aclError aclrtBinaryLoadFromData(const void* data, size_t length, const aclrtBinaryLoadOptions* options,
                                 aclrtBinHandle* binHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(data, "data is NULL");
    CORA_ACL_REQUIRE(length > 0, "length must be > 0");
    CORA_ACL_REQUIRE(binHandle, "binHandle is NULL");
    cora::load_options opts;
    if (aclError e = parse_options(api, options, opts)) return e;
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    auto p = ctx.device->load_binary(std::span<const std::byte>(static_cast<const std::byte*>(data), length), opts);
    return finish_load(api, ctx, p, binHandle);
  });
}

aclError aclrtBinaryUnLoad(aclrtBinHandle binHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    auto& st = state::get();
    std::shared_ptr<binary_obj> b;
    {
      std::lock_guard lock(st.mutex);
      if (aclError e = lookup_locked(st, st.binaries, api, binHandle, "binHandle", b)) return e;
      st.binaries.erase(binHandle);
      for (auto& [name, fn] : b->functions) st.functions.erase(fn.get());
    }
    // Launches already enqueued keep the code loaded until they finish.
    std::error_code ec;
    b->bin.unload(ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    return ACL_SUCCESS;
  });
}

aclError aclrtBinaryGetFunction(const aclrtBinHandle binHandle, const char* kernelName, aclrtFuncHandle* funcHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(binHandle, "binHandle is NULL");
    CORA_ACL_REQUIRE(kernelName, "kernelName is NULL");
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    return get_function(api, binHandle, funcHandle,
                        [&](cora::binary& b, std::error_code& ec) { return b.kernel(kernelName, ec); });
  });
}

aclError aclrtBinaryGetFunctionByEntry(aclrtBinHandle binHandle, uint64_t funcEntry, aclrtFuncHandle* funcHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(binHandle, "binHandle is NULL");
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    return get_function(api, binHandle, funcHandle,
                        [&](cora::binary& b, std::error_code& ec) { return b.kernel_by_entry(funcEntry, ec); });
  });
}

aclError aclrtGetFuncBySymbol(const void* symbol, aclrtFuncHandle* funcHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(symbol, "symbol is NULL");
    CORA_ACL_REQUIRE(funcHandle, "funcHandle is NULL");
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      if (aclError e = require_init_locked(st, api)) return e;
    }
    std::shared_ptr<function_obj> fn;
    if (aclError e = function_by_symbol(api, symbol, fn)) return e;
    *funcHandle = fn.get();
    return ACL_SUCCESS;
  });
}

aclError aclrtGetFunctionName(aclrtFuncHandle funcHandle, uint32_t maxLen, char* name) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(name, "name is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    const auto n = fn->k.name();
    CORA_ACL_REQUIRE(n.size() < maxLen, "maxLen (" + std::to_string(maxLen) + ") cannot hold the name '" +
                                            std::string(n) + "' and its terminator");
    std::memcpy(name, n.data(), n.size());
    name[n.size()] = '\0';
    return ACL_SUCCESS;
  });
}

aclError aclrtFunctionGetParamCount(const void* func, size_t* paramCount) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(func, "func is NULL");
    CORA_ACL_REQUIRE(paramCount, "paramCount is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, func, true, fn)) return e;
    *paramCount = fn->k.params().size();
    return ACL_SUCCESS;
  });
}

aclError aclrtFunctionGetParamInfo(const void* func, size_t paramIndex, size_t* paramOffset, size_t* paramSize) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(func, "func is NULL");
    CORA_ACL_REQUIRE(paramOffset, "paramOffset is NULL");
    CORA_ACL_REQUIRE(paramSize, "paramSize is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, func, true, fn)) return e;
    const auto params = fn->k.params();
    CORA_ACL_REQUIRE(paramIndex < params.size(), "paramIndex " + std::to_string(paramIndex) +
                                                     " is out of range (the kernel has " +
                                                     std::to_string(params.size()) + " parameters)");
    *paramOffset = params[paramIndex].offset;
    *paramSize = params[paramIndex].size;
    return ACL_SUCCESS;
  });
}

aclError cora_acl_register_symbol(const void* symbol, const void* binary, size_t size, const char* kernelName) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(symbol, "symbol is NULL");
    CORA_ACL_REQUIRE(binary, "binary is NULL");
    CORA_ACL_REQUIRE(size > 0, "size must be > 0");
    CORA_ACL_REQUIRE(kernelName && *kernelName, "kernelName is NULL or empty");
    auto& r = registered_libraries::get();
    std::lock_guard lock(r.mutex);
    if (const auto known = cora::find_kernel_symbol(symbol); known.library) {
      const auto image = known.library->image();
      const bool same = image.data() == static_cast<const std::byte*>(binary) && image.size() == size &&
                        known.library->kernel_names().at(known.index) == kernelName;
      if (same) return ACL_SUCCESS;
      return fail(ACL_ERROR_KERNEL_ALREADY_REGISTERED, api, "the symbol is registered for another kernel");
    }
    r.libraries.push_back(std::make_unique<cora::kernel_library>(
        std::span<const std::byte>(static_cast<const std::byte*>(binary), size), std::vector<std::string>{kernelName}));
    cora::register_kernel_symbol(symbol, *r.libraries.back(), 0);
    return ACL_SUCCESS;
  });
}

}  // extern "C"

// --- binaries in memory, function queries -------------------------------------------------------

namespace {

// aclrtCreateBinary: a copy of the caller's bytes, loaded by aclrtBinaryLoad.
struct binary_blob {
  static constexpr std::uint64_t magic_value = 0x424f4c4241524f43ull;  // "CORABLOB"
  std::uint64_t magic = magic_value;
  std::vector<std::byte> bytes;
};
std::mutex blobs_mutex;
std::unordered_map<const void*, std::unique_ptr<binary_blob>>& blobs() {
  static auto* m = new std::unordered_map<const void*, std::unique_ptr<binary_blob>>;
  return *m;
}

aclError lookup_binary(const char* api, aclrtBinHandle h, std::shared_ptr<binary_obj>& out) {
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  return lookup_locked(st, st.binaries, api, h, "binHandle", out);
}

}  // namespace

extern "C" {

aclrtBinary aclrtCreateBinary(const void* data, size_t dataLen) {
  const char* const api = __func__;
  try {
    if (!data || dataLen == 0) {
      (void)fail(ACL_ERROR_INVALID_PARAM, api, "data is NULL or dataLen is 0");
      return nullptr;
    }
    auto b = std::make_unique<binary_blob>();
    b->bytes.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + dataLen);
    std::lock_guard lock(blobs_mutex);
    void* h = b.get();
    blobs().emplace(h, std::move(b));
    return h;
  } catch (...) {
    (void)fail_current_exception(api);
    return nullptr;
  }
}

aclError aclrtDestroyBinary(aclrtBinary binary) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(binary, "binary is NULL");
    std::lock_guard lock(blobs_mutex);
    if (blobs().erase(binary) == 0)
      return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "binary is not a live aclrtCreateBinary handle");
    return ACL_SUCCESS;
  });
}

aclError aclrtBinaryLoad(const aclrtBinary binary, aclrtBinHandle* binHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(binary, "binary is NULL");
    CORA_ACL_REQUIRE(binHandle, "binHandle is NULL");
    std::vector<std::byte> bytes;
    {
      std::lock_guard lock(blobs_mutex);
      auto it = blobs().find(binary);
      if (it == blobs().end())
        return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "binary is not a live aclrtCreateBinary handle");
      bytes = it->second->bytes;
    }
    return aclrtBinaryLoadFromData(bytes.data(), bytes.size(), nullptr, binHandle);
  });
}

aclError aclrtBinaryGetDevAddress(const aclrtBinHandle binHandle, void** binAddr, size_t* binSize) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(binAddr && binSize, "binAddr or binSize is NULL");
    std::shared_ptr<binary_obj> b;
    if (aclError e = lookup_binary(api, binHandle, b)) return e;
    // A loaded binary is a shared object (CPU) or a driver module (GPU): no device copy of the
    // image exists to point at.
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "a loaded binary has no device address on cora");
  });
}

aclError aclrtBinaryGetGlobal(aclrtBinHandle binHandle, const char* name, void** dptr, size_t* size) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(name && dptr && size, "name, dptr or size is NULL");
    std::shared_ptr<binary_obj> b;
    if (aclError e = lookup_binary(api, binHandle, b)) return e;
    // A global of the kernels' code (CORA_GLOBAL): device memory on a GPU (cuModuleGetGlobal),
    // the loaded image's own data on the CPU device, where its kernels see it.
    std::error_code ec;
    const cora::device_global g = b->bin.global(name, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    *dptr = g.address;
    *size = g.size;
    return ACL_SUCCESS;
  });
}

aclError aclrtBinarySetExceptionCallback(aclrtBinHandle binHandle, aclrtOpExceptionCallback callback, void* userData) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(callback, "callback is NULL");
    std::shared_ptr<binary_obj> b;
    if (aclError e = lookup_binary(api, binHandle, b)) return e;
    // cora reports faults per stream, not per task, so it cannot tell which binary's kernel
    // failed: a callback that would never be called is refused.
    (void)userData;
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                "faults are reported per stream; a binary's exception callback would never run");
  });
}

aclError aclrtFunctionGetBinary(const aclrtFuncHandle funcHandle, aclrtBinHandle* binHandle) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(binHandle, "binHandle is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (!fn->binary || !st.binaries.count(fn->binary))
      return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "the function's binary was unloaded, or it has no binary handle");
    *binHandle = const_cast<void*>(fn->binary);
    return ACL_SUCCESS;
  });
}

aclError aclrtGetFunctionAddr(aclrtFuncHandle funcHandle, void** aicAddr, void** aivAddr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(aicAddr && aivAddr, "aicAddr or aivAddr is NULL");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    // Every cora kernel is of one kind (AI Core, see aclrtGetFunctionAttribute): its code is
    // the AIC address; there is no vector-core part.
    void* code = fn->k.code_address();
    if (!code)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                  "this device exposes no kernel code addresses (a GPU kernel is a driver handle)");
    *aicAddr = code;
    *aivAddr = nullptr;
    return ACL_SUCCESS;
  });
}

aclError aclrtGetFunctionAttribute(aclrtFuncHandle funcHandle, aclrtFuncAttribute attrType, int64_t* attrValue) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(attrValue, "attrValue is NULL");
    const auto attr = enum_value(attrType);
    CORA_ACL_REQUIRE(attr >= ACL_FUNC_ATTR_KERNEL_TYPE && attr <= ACL_FUNC_ATTR_KERNEL_SCHED_MODE,
                     "attrType is not an aclrtFuncAttribute");
    std::shared_ptr<function_obj> fn;
    if (aclError e = resolve_function(api, funcHandle, false, fn)) return e;
    switch (attr) {
      case ACL_FUNC_ATTR_KERNEL_TYPE:
        *attrValue = 0;  // CANN's AI Core kernel: every cora kernel runs on one kind of unit
        break;
      case ACL_FUNC_ATTR_KERNEL_RATIO: {
        // Two 16-bit ratios, vector cores then cube cores, as CANN packs them: 0 and 1.
        const std::uint16_t ratio[4] = {0, 1, 0, 0};
        std::memcpy(attrValue, ratio, sizeof(ratio));
        break;
      }
      default: *attrValue = 0; break;  // the normal scheduling mode
    }
    return ACL_SUCCESS;
  });
}

}  // extern "C"
