#include "backend/cuda/cuda_driver.hpp"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

namespace cora::backend::cuda {

namespace {

// The loaded driver, once there is one (the category's messages use it).
std::atomic<const driver_api*> loaded_driver{nullptr};

// Names of the codes cora meets most, for messages while no driver is loaded (the driver's
// cuGetErrorName covers every code once it is).
const char* builtin_name(CUresult r) noexcept {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER: return "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER";
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NO_BINARY_FOR_GPU: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case CUDA_ERROR_ECC_UNCORRECTABLE: return "CUDA_ERROR_ECC_UNCORRECTABLE";
    case CUDA_ERROR_INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND: return "CUDA_ERROR_JIT_COMPILER_NOT_FOUND";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case CUDA_ERROR_LAUNCH_TIMEOUT: return "CUDA_ERROR_LAUNCH_TIMEOUT";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case CUDA_ERROR_ASSERT: return "CUDA_ERROR_ASSERT";
    case CUDA_ERROR_HARDWARE_STACK_ERROR: return "CUDA_ERROR_HARDWARE_STACK_ERROR";
    case CUDA_ERROR_ILLEGAL_INSTRUCTION: return "CUDA_ERROR_ILLEGAL_INSTRUCTION";
    case CUDA_ERROR_MISALIGNED_ADDRESS: return "CUDA_ERROR_MISALIGNED_ADDRESS";
    case CUDA_ERROR_INVALID_ADDRESS_SPACE: return "CUDA_ERROR_INVALID_ADDRESS_SPACE";
    case CUDA_ERROR_INVALID_PC: return "CUDA_ERROR_INVALID_PC";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: return "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE";
    case CUDA_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_TIMEOUT: return "CUDA_ERROR_TIMEOUT";
    case CUDA_ERROR_INVALID_CLUSTER_SIZE: return "CUDA_ERROR_INVALID_CLUSTER_SIZE";
    case CUDA_ERROR_FUNCTION_NOT_LOADED: return "CUDA_ERROR_FUNCTION_NOT_LOADED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}

class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int ev) const override { return describe(static_cast<CUresult>(ev)); }
};

}  // namespace

std::string describe(CUresult r) {
  const driver_api* api = loaded_driver.load(std::memory_order_acquire);
  const char* name = nullptr;
  const char* text = nullptr;
  if (api) {
    if (api->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
    if (api->cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  }
  if (!name) name = builtin_name(r);
  std::string out = name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
  if (text) {
    out += ": ";
    out += text;
  }
  return out;
}

const std::error_category& cuda_category() noexcept {
  static const category c;
  return c;
}

bool context_fatal(CUresult r) noexcept {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_EXTERNAL_DEVICE:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_DEINITIALIZED:
      return true;
    default:
      return false;
  }
}

std::error_code to_error_code(CUresult r) noexcept {
  switch (r) {
    case CUDA_SUCCESS: return {};
    case CUDA_ERROR_OUT_OF_MEMORY: return make_error_code(errc::out_of_memory);
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
    case CUDA_ERROR_JIT_COMPILATION_DISABLED:
    case CUDA_ERROR_INVALID_SOURCE:
      return make_error_code(errc::invalid_binary);
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
      return make_error_code(errc::kernel_fault);
    case CUDA_ERROR_LAUNCH_TIMEOUT: return make_error_code(errc::kernel_timeout);
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_EXTERNAL_DEVICE:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      return make_error_code(errc::device_lost);
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
    case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
    case CUDA_ERROR_INVALID_CLUSTER_SIZE:
      return make_error_code(errc::invalid_launch_config);
    case CUDA_ERROR_NOT_SUPPORTED: return make_error_code(errc::not_supported);
    case CUDA_ERROR_NOT_READY: return make_error_code(errc::not_ready);
    case CUDA_ERROR_TIMEOUT: return make_error_code(errc::timed_out);
    default: return make_cuda_error(r);
  }
}

bool load_driver(const char* library, driver_api& api, std::string& reason) {
  api = driver_api{};
  ::dlerror();
  void* handle = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    reason = std::string("cannot load the NVIDIA driver library ") + library + " (" +
             (why ? why : "unknown error") + "); is an NVIDIA driver installed?";
    return false;
  }
  // Never dlclose'd: the driver keeps threads and atexit handlers of its own.
  auto get_proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(::dlsym(handle, "cuGetProcAddress_v2"));
  if (!get_proc) {
    reason = std::string(library) +
             " has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA 12.0; update it";
    return false;
  }
  auto resolve = [&](const char* symbol, int version, void** out) -> CUresult {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *out = nullptr;
    const CUresult r = get_proc(symbol, out, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS) *out = nullptr;
    return r;
  };
  void* p = nullptr;
  CUresult r;
#define CORA_CUDA_RESOLVE_REQUIRED(name, version)                                                \
  r = resolve(#name, version, &p);                                                               \
  if (r == CUDA_ERROR_STUB_LIBRARY) {                                                            \
    reason = std::string(library) +                                                              \
             " is the CUDA toolkit's stub library (CUDA_ERROR_STUB_LIBRARY), not a driver: no " \
             "NVIDIA driver is installed, or the stubs directory is on the library path";       \
    return false;                                                                                \
  }                                                                                              \
  if (!p) {                                                                                      \
    reason = std::string("the NVIDIA driver lacks ") + #name + " (CUDA " +                       \
             std::to_string((version) / 1000) + "." + std::to_string((version) % 1000 / 10) +    \
             " API); update the driver";                                                         \
    return false;                                                                                \
  }                                                                                              \
  api.name.fn = reinterpret_cast<PFN_##name##_v##version>(p);
  CORA_CUDA_REQUIRED(CORA_CUDA_RESOLVE_REQUIRED)
#undef CORA_CUDA_RESOLVE_REQUIRED
#define CORA_CUDA_RESOLVE_OPTIONAL(name, version) \
  resolve(#name, version, &p);                    \
  api.name.fn = reinterpret_cast<PFN_##name##_v##version>(p);
  CORA_CUDA_OPTIONAL(CORA_CUDA_RESOLVE_OPTIONAL)
#undef CORA_CUDA_RESOLVE_OPTIONAL
  if (resolve("cuEventElapsedTime", 12080, &p) != CUDA_SUCCESS || !p)
    resolve("cuEventElapsedTime", 2000, &p);
  api.event_elapsed_time.fn = reinterpret_cast<PFN_cuEventElapsedTime_v2000>(p);
  if (!api.event_elapsed_time) {
    reason = "the NVIDIA driver lacks cuEventElapsedTime";
    return false;
  }
  r = api.cuDriverGetVersion(&api.version);
  if (r != CUDA_SUCCESS) {
    reason = std::string(library) + ": cuDriverGetVersion failed (" + std::to_string(static_cast<int>(r)) + ")";
    return false;
  }
  if (api.version < 12000) {
    reason = "the NVIDIA driver supports CUDA " + std::to_string(api.version / 1000) + "." +
             std::to_string(api.version % 1000 / 10) + "; cora needs a CUDA 12.0 driver or newer";
    return false;
  }
  return true;
}

const driver_api* driver(std::string& reason) {
  static driver_api api;
  static std::string why;
  static const bool ok = [] {
    const bool loaded = load_driver("libcuda.so.1", api, why);
    if (loaded) loaded_driver.store(&api, std::memory_order_release);
    return loaded;
  }();
  if (!ok) {
    reason = why;
    return nullptr;
  }
  return &api;
}

}  // namespace cora::backend::cuda
