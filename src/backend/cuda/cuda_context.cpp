#include "backend/cuda/cuda_context.hpp"

namespace cora::backend::cuda {

std::shared_ptr<context> context::retain(const driver_api& api, int ordinal, std::string& message) {
  CUdevice dev = 0;
  CUresult r = api.cuDeviceGet(&dev, ordinal);
  if (r != CUDA_SUCCESS) {
    message = "cuDeviceGet(" + std::to_string(ordinal) + "): " + describe(r);
    return nullptr;
  }
  CUcontext ctx = nullptr;
  r = api.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != CUDA_SUCCESS) {
    message = "cannot retain the primary context of CUDA device " + std::to_string(ordinal) +
              ": " + describe(r);
    return nullptr;
  }
  std::shared_ptr<context> c(new context(api, dev, ordinal, ctx));
  r = c->make_current();
  if (r == CUDA_SUCCESS) r = api.cuCtxGetStreamPriorityRange(&c->least_priority, &c->greatest_priority);
  if (r != CUDA_SUCCESS) {
    message = "cannot use the primary context of CUDA device " + std::to_string(ordinal) + ": " +
              describe(r);
    return nullptr;  // the destructor releases it
  }
  return c;
}

context::~context() {
  // Errors are of no use here (the driver may already be shutting down at process exit).
  marker_slots.reset();  // before the release, while the context still exists
  api.cuDevicePrimaryCtxRelease(device);
}

CUresult context::make_current() const noexcept {
  CUcontext cur = nullptr;
  if (api.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == handle) return CUDA_SUCCESS;
  return api.cuCtxSetCurrent(handle);
}

bool context::note(CUresult r) noexcept {
  if (!context_fatal(r)) return lost();
  std::lock_guard lock(lost_mutex_);
  if (!lost_.load(std::memory_order_relaxed)) {
    lost_code_ = to_error_code(r);
    try {
      lost_message_ = describe(r);
    } catch (...) {
    }
    lost_.store(true, std::memory_order_release);
  }
  return true;
}

std::error_code context::lost_code() const {
  std::lock_guard lock(lost_mutex_);
  return lost_code_;
}

std::string context::lost_message() const {
  std::lock_guard lock(lost_mutex_);
  return lost_message_;
}

}  // namespace cora::backend::cuda
