// CUDA kernel images (cubin, fatbin, PTX) loaded into a device's primary context. A load is
// cuModuleLoadDataEx alone; a kernel's function, parameter layout (cuFuncGetParamInfo) and
// attributes are read at its first lookup, or for every kernel by list_kernels (images without
// metadata, found by enumeration).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_context.hpp"

namespace cora::backend::cuda {

/// One kernel of a loaded module: what module::function hands to launches.
struct cuda_function {
  CUfunction handle = nullptr;
  std::string name;
  std::vector<std::uint32_t> sizes;            // of each parameter, as CUDA reports them
  int static_shared = 0;                       // bytes of static shared memory
  std::atomic<std::uint32_t> dynamic_shared_limit{0};  // dynamic shared bytes allowed so far
};

class cuda_module final : public module {
 public:
  /// Loads an image. Failures are invalid_binary with CUDA's message (and the JIT log for
  /// PTX), out_of_memory, or device_lost when the context is gone.
  static std::unique_ptr<cuda_module> load(std::shared_ptr<context> ctx,
                                           std::span<const std::byte> image, image_kind kind,
                                           const std::string& device_label, int cc_major,
                                           int cc_minor, std::error_code& ec,
                                           std::string& message);
  ~cuda_module() override;

  bool list_kernels(std::error_code& ec, std::string& message) override;
  const std::vector<kernel_desc>& kernels() const override { return kernels_; }
  void* function(std::size_t index, std::error_code& ec, std::string& message) override;
  void* native_handle() const noexcept override { return module_; }
  void* find(const std::string& name, kernel_desc& layout, std::error_code& ec,
             std::string& message) override;
  void* global(const std::string& name, std::size_t& size, std::error_code& ec,
               std::string& message) override;

 private:
  explicit cuda_module(std::shared_ptr<context> ctx) noexcept : ctx_(std::move(ctx)) {}
  // Reads what a launch needs of `f` into a new entry of functions_ and kernels_ (mutex_ held).
  cuda_function* add(CUfunction f, const char* name, std::error_code& ec, std::string& message);
  void fail(CUresult r, const std::string& step, std::error_code& ec, std::string& message);

  std::shared_ptr<context> ctx_;
  std::string label_;  // "the <kind> image on <device>", for messages
  CUmodule module_ = nullptr;
  std::mutex mutex_;
  bool listed_ = false;
  std::vector<kernel_desc> kernels_;                        // resolved so far, in order
  std::vector<std::unique_ptr<cuda_function>> functions_;  // same order; stable addresses
};

/// The alignment of a parameter that CUDA placed at `offset` with `size` bytes: the largest
/// power of two (at most 16) dividing both. CUDA reports no alignments; a guess that places
/// every parameter where CUDA does.
std::uint32_t guess_alignment(std::size_t offset, std::size_t size) noexcept;

}  // namespace cora::backend::cuda
