// The raw CUDA driver side of the benchmarks: device `ordinal`'s primary context with the
// kernels of test_kernels.corabin loaded by hand, as driver code written without cora would.
// Only built with the CUDA backend (CORA_HAS_CUDA).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "core/binary_format.hpp"
#include "io/file_reader.hpp"

namespace cora::bench {

namespace cu = cora::backend::cuda;

inline void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cu::describe(r));
}

/// The fatbin image of a .corabin file (throws when it has none).
inline std::vector<std::byte> fatbin_of(const std::filesystem::path& corabin) {
  std::error_code ec;
  std::string message;
  const auto bytes = cora::detail::read_whole_file_sync(corabin, ec, message);
  if (ec) throw std::runtime_error(message);
  const auto c = cora::detail::parse_corabin(bytes, ec, message);
  if (ec) throw std::runtime_error(message);
  for (const auto& img : c.images)
    if (img.kind == cora::detail::binary_kind::cuda_fatbin) return {img.bytes.begin(), img.bytes.end()};
  throw std::runtime_error("no fatbin in " + corabin.string());
}

/// Device `ordinal`'s primary context and, unless made with no image, one loaded module.
class raw_cuda {
 public:
  /// The context alone: for measuring loads, where a resident module of the same image would
  /// let the driver share its parsed copy.
  explicit raw_cuda(std::size_t ordinal) {
    std::string reason;
    api_ = cu::driver(reason);
    if (!api_) throw std::runtime_error(reason);
    check(api().cuInit(0), "cuInit");
    check(api().cuDeviceGet(&dev_, static_cast<int>(ordinal)), "cuDeviceGet");
    check(api().cuDevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
    bind();
  }
  raw_cuda(std::size_t ordinal, const std::vector<std::byte>& fatbin) : raw_cuda(ordinal) {
    check(api().cuModuleLoadDataEx(&module_, fatbin.data(), 0, nullptr, nullptr), "cuModuleLoadDataEx");
    if (!api().cuModuleGetFunctionCount) throw std::runtime_error("driver without cuModuleEnumerateFunctions");
    unsigned count = 0;
    check(api().cuModuleGetFunctionCount(&count, module_), "cuModuleGetFunctionCount");
    std::vector<CUfunction> fs(count);
    check(api().cuModuleEnumerateFunctions(fs.data(), count, module_), "cuModuleEnumerateFunctions");
    for (CUfunction f : fs) {
      const char* name = nullptr;
      if (api().cuFuncGetName(&name, f) == CUDA_SUCCESS) functions_[name] = f;
    }
  }
  ~raw_cuda() {
    bind();
    if (module_) api().cuModuleUnload(module_);
    api().cuDevicePrimaryCtxRelease(dev_);
  }
  raw_cuda(const raw_cuda&) = delete;
  raw_cuda& operator=(const raw_cuda&) = delete;

  const cu::driver_api& api() const noexcept { return *api_; }
  /// Makes the context current on the calling thread (each thread that calls the driver).
  void bind() const { check(api().cuCtxSetCurrent(ctx_), "cuCtxSetCurrent"); }
  CUfunction function(const std::string& name) const {
    auto it = functions_.find(name);
    if (it == functions_.end()) throw std::runtime_error("no kernel " + name);
    return it->second;
  }
  CUmodule module() const noexcept { return module_; }

  CUstream make_stream() const {
    CUstream s = nullptr;
    check(api().cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreate");
    return s;
  }
  CUevent make_event(unsigned flags = CU_EVENT_DISABLE_TIMING) const {
    CUevent e = nullptr;
    check(api().cuEventCreate(&e, flags), "cuEventCreate");
    return e;
  }
  void* host_alloc(std::size_t bytes) const {
    void* p = nullptr;
    check(api().cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
    return p;
  }
  CUdeviceptr alloc(std::size_t bytes) const {
    CUdeviceptr p = 0;
    check(api().cuMemAlloc(&p, bytes), "cuMemAlloc");
    return p;
  }
  /// Busy-polls `e` until it has completed.
  void spin(CUevent e) const {
    CUresult r;
    while ((r = api().cuEventQuery(e)) == CUDA_ERROR_NOT_READY) {
    }
    check(r, "cuEventQuery");
  }

 private:
  const cu::driver_api* api_ = nullptr;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  std::map<std::string, CUfunction> functions_;
};

/// Device `ordinal`'s raw side with test_kernels.corabin loaded, made on first use and never
/// destroyed (process exit tears the driver down).
inline raw_cuda& raw_test_kernels(std::size_t ordinal) {
  static std::map<std::size_t, raw_cuda*> all;
  auto& r = all[ordinal];
  if (!r) r = new raw_cuda(ordinal, fatbin_of(kernels_dir() + "/test_kernels.corabin"));
  return *r;
}

/// `kernelParams` for cuLaunchKernel: a pointer to each argument.
template <class... A>
std::vector<void*> params(A&... a) {
  return {static_cast<void*>(&a)...};
}

}  // namespace cora::bench
