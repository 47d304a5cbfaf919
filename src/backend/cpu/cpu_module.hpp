// A CPU kernel image loaded into the process: the part of the shared object that the core
// passes (its loadable part) written to an anonymous memory file and dlopen-ed. Kernel entries are looked up by name at their first
// use; the core lists the kernels (from the image's records, checked at load).
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "backend/backend.hpp"
#include "cora/detail/cpu_kernel_abi.h"

namespace cora::backend::cpu {

class cpu_module final : public module {
 public:
  /// Loads an image whose records the core has read and checked; on failure sets `ec` and
  /// returns null.
  static std::unique_ptr<cpu_module> load(std::span<const std::byte> image, std::error_code& ec,
                                          std::string& message);
  ~cpu_module() override;

  const std::vector<kernel_desc>& kernels() const override { return kernels_; }
  void* function(std::size_t index, std::error_code& ec, std::string& message) override;
  void* find(const std::string& name, kernel_desc& layout, std::error_code& ec,
             std::string& message) override;

 private:
  cpu_module() = default;
  void* handle_ = nullptr;
  int fd_ = -1;  // the image's memory file, open while it is loaded
  std::vector<kernel_desc> kernels_;  // empty: the core has the list
};

}  // namespace cora::backend::cpu
