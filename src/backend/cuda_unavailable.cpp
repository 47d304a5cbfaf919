// Used when cora is built without the CUDA toolkit.
#include "backend/backend.hpp"

namespace cora::backend {

std::vector<std::unique_ptr<device>> make_cuda_devices(std::string& reason) {
  reason = "cora was built without the CUDA backend";
  return {};
}

void stop_cuda_calls_for_exit() noexcept {}

}  // namespace cora::backend
