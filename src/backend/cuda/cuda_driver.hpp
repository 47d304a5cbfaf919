// The CUDA driver API, loaded at run time. libcuda.so.1 is opened with dlopen and every entry
// point is resolved through cuGetProcAddress at the ABI version of the prototype this file
// names, so one build runs on machines with and without an NVIDIA driver and never links
// -lcuda. Only the toolkit's headers are used at build time.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <string>
#include <system_error>

#include "cora/error.hpp"

namespace cora::backend::cuda {

// X(name, version): entry point `name` with the prototype PFN_<name>_v<version> of
// cudaTypedefs.h, requested from the driver at that version. The driver must have these.
#define CORA_CUDA_REQUIRED(X)          \
  X(cuGetErrorName, 6000)              \
  X(cuGetErrorString, 6000)            \
  X(cuInit, 2000)                      \
  X(cuDriverGetVersion, 2020)          \
  X(cuDeviceGet, 2000)                 \
  X(cuDeviceGetCount, 2000)            \
  X(cuDeviceGetName, 2000)             \
  X(cuDeviceGetUuid, 11040)            \
  X(cuDeviceTotalMem, 3020)            \
  X(cuDeviceGetAttribute, 2000)        \
  X(cuDeviceGetPCIBusId, 4010)         \
  X(cuDevicePrimaryCtxRetain, 7000)    \
  X(cuDevicePrimaryCtxRelease, 11000)  \
  X(cuCtxSetCurrent, 4000)             \
  X(cuCtxGetCurrent, 4000)             \
  X(cuCtxGetStreamPriorityRange, 5050) \
  X(cuMemGetInfo, 3020)                \
  X(cuMemAlloc, 3020)                  \
  X(cuMemFree, 3020)                   \
  X(cuMemAllocManaged, 6000)           \
  X(cuMemPoolCreate, 11020)            \
  X(cuMemPoolDestroy, 11020)           \
  X(cuMemPoolSetAttribute, 11020)      \
  X(cuMemPoolGetAttribute, 11020)      \
  X(cuMemPoolTrimTo, 11020)            \
  X(cuMemAllocFromPoolAsync, 11020)    \
  X(cuMemFreeAsync, 11020)             \
  X(cuPointerGetAttributes, 7000)      \
  X(cuMemHostAlloc, 2020)              \
  X(cuMemFreeHost, 2000)               \
  X(cuMemHostGetDevicePointer, 3020)   \
  X(cuMemcpy, 4000)                    \
  X(cuMemcpyAsync, 4000)               \
  X(cuMemsetD8Async, 3020)             \
  X(cuStreamCreateWithPriority, 5050)  \
  X(cuStreamDestroy, 4000)             \
  X(cuStreamQuery, 2000)               \
  X(cuStreamSynchronize, 2000)         \
  X(cuStreamWaitEvent, 3020)           \
  X(cuStreamWriteValue32, 11070)       \
  X(cuStreamWriteValue64, 11070)       \
  X(cuStreamWaitValue32, 11070)        \
  X(cuStreamWaitValue64, 11070)        \
  X(cuLaunchHostFunc, 10000)           \
  X(cuEventCreate, 2000)               \
  X(cuEventDestroy, 4000)              \
  X(cuEventRecord, 2000)               \
  X(cuEventQuery, 2000)                \
  X(cuEventSynchronize, 2000)          \
  X(cuModuleLoadDataEx, 2010)          \
  X(cuModuleUnload, 2000)              \
  X(cuModuleGetFunction, 2000)         \
  X(cuModuleGetGlobal, 3020)           \
  X(cuFuncGetAttribute, 2020)          \
  X(cuFuncSetAttribute, 9000)          \
  X(cuLaunchKernel, 4000)              \
  X(cuLaunchKernelEx, 11060)

// Newer entry points: null when the driver predates them.
#define CORA_CUDA_OPTIONAL(X)             \
  X(cuModuleGetFunctionCount, 12040)      \
  X(cuModuleEnumerateFunctions, 12040)    \
  X(cuFuncGetName, 12030)                 \
  X(cuFuncGetParamInfo, 12040)            \
  X(cuFuncIsLoaded, 12040)                \
  X(cuFuncLoad, 12040)                    \
  CORA_CUDA_GRAPHS(X)

// Graphs (cuda_graph.cpp): every CUDA 12 driver has them; a driver without them makes graph
// instantiation fail with errc::not_supported.
#define CORA_CUDA_GRAPHS(X)                  \
  X(cuGraphCreate, 10000)                    \
  X(cuGraphDestroy, 10000)                   \
  X(cuGraphAddKernelNode, 12000)             \
  X(cuGraphAddMemcpyNode, 10000)             \
  X(cuGraphAddMemsetNode, 10000)             \
  X(cuGraphAddHostNode, 10000)               \
  X(cuGraphAddEmptyNode, 10000)              \
  X(cuGraphInstantiateWithFlags, 11040)      \
  X(cuGraphUpload, 11010)                    \
  X(cuGraphLaunch, 10000)                    \
  X(cuGraphExecDestroy, 10000)               \
  X(cuGraphExecKernelNodeSetParams, 12000)   \
  X(cuGraphExecMemcpyNodeSetParams, 10020)   \
  X(cuGraphExecUpdate, 12000)

/// Set once the process has begun to exit (main returned, or std::exit ran) while cora had
/// CUDA devices, by backend::stop_cuda_calls_for_exit() (see core/process_exit.hpp).
inline std::atomic<bool> process_exit_begun{false};

/// One entry point of the driver, called like the function it holds. Once the process has
/// begun to exit it no longer calls the driver and fails with CUDA_ERROR_DEINITIALIZED, as the
/// driver itself does once torn down: the exit handlers that the driver and an attached tool
/// (compute-sanitizer) registered tear it down, and a call made during or after that (from the
/// destructor of a static runtime, or from a cora thread releasing what a runtime left behind)
/// can crash the process. Releases are skipped (the driver reclaims everything at exit), and
/// waits end with device_lost instead of hanging.
template <class Pfn>
struct entry_point;
template <class... Args>
struct entry_point<CUresult(CUDAAPI*)(Args...)> {
  CUresult(CUDAAPI* fn)(Args...) = nullptr;
  CUresult operator()(Args... args) const {
    if (process_exit_begun.load(std::memory_order_relaxed)) [[unlikely]]
      return CUDA_ERROR_DEINITIALIZED;
    return fn(args...);
  }
  /// False where the driver lacks the entry point (the optional ones).
  explicit operator bool() const noexcept { return fn != nullptr; }
};

/// The driver's entry points. Field names are the API's names (cuda.h maps some of them to
/// their _v2 symbols; the fields follow, so calls read like plain driver code).
struct driver_api {
#define CORA_CUDA_FIELD(name, version) entry_point<PFN_##name##_v##version> name;
  CORA_CUDA_REQUIRED(CORA_CUDA_FIELD)
  CORA_CUDA_OPTIONAL(CORA_CUDA_FIELD)
#undef CORA_CUDA_FIELD
  /// cuEventElapsedTime at 12.8 where the driver has it, else the original (same prototype).
  entry_point<PFN_cuEventElapsedTime_v2000> event_elapsed_time;
  int version = 0;  ///< cuDriverGetVersion: 1000 * major + 10 * minor
};

/// Loads `library` (a name for dlopen or a path) into a fresh table. Returns false with a
/// reason a person can act on when the library is missing, too old, or no real driver.
bool load_driver(const char* library, driver_api& api, std::string& reason);

/// The process's driver (libcuda.so.1), loaded on first use and never unloaded; null with
/// `reason` set when there is none.
const driver_api* driver(std::string& reason);

/// The category of CUresult codes: name() is "cuda"; messages are the driver's name and
/// description of the code ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was
/// encountered"), or the code's name alone while no driver is loaded.
const std::error_category& cuda_category() noexcept;

inline std::error_code make_cuda_error(CUresult r) noexcept {
  return {static_cast<int>(r), cuda_category()};
}

/// "CUDA_ERROR_X: description" for a code.
std::string describe(CUresult r);

/// True for errors after which the context cannot be used any more (a faulting kernel, a lost
/// device): every later call on it fails.
bool context_fatal(CUresult r) noexcept;

/// The code cora reports for a CUresult: a cora::errc where callers act on the difference
/// (faults, lost devices, memory, binaries, launch configurations), else the CUDA code itself
/// in cuda_category().
std::error_code to_error_code(CUresult r) noexcept;

}  // namespace cora::backend::cuda
