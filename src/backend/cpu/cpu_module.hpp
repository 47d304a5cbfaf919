// A CPU kernel image loaded into the process (dlopen of an in-memory file).
#pragma once

#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "backend/backend.hpp"
#include "cora/detail/cpu_kernel_abi.h"

namespace cora::backend::cpu {

class cpu_module final : public module {
 public:
  /// Loads a validated image; on failure sets `ec` and returns null.
  static std::unique_ptr<cpu_module> load(std::span<const std::byte> image, std::error_code& ec,
                                          std::string& message);
  ~cpu_module() override;

  const std::vector<kernel_desc>& kernels() const override { return kernels_; }
  void* function(std::size_t index, std::error_code& ec, std::string& message) override;

 private:
  cpu_module() = default;
  void* handle_ = nullptr;
  int fd_ = -1;  // the image's memory file, open while it is loaded
  std::vector<kernel_desc> kernels_;
  std::vector<void*> entries_;
};

}  // namespace cora::backend::cpu
