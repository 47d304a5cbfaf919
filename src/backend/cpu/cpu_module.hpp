// A CPU kernel image loaded into the process: the part of the shared object that the core
// passes (its loadable part) written to an anonymous memory file and dlopen-ed. Kernel entries are looked up by name at their first
// use; the core lists the kernels (from the image's records, checked at load).
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "backend/backend.hpp"
#include "cora/detail/cpu_kernel_abi.h"

namespace cora::backend::cpu {

/// The globals of a device's loaded images that were looked up (cpu_module::global): memory
/// the device's kernels use, so the core treats it as device memory (stream-ordered copies),
/// not as pageable host memory. Shared by the device and its modules.
class global_ranges {
 public:
  void add(const void* p, std::size_t size);
  void remove(const void* p) noexcept;
  /// The published range holding `p`; size 0 when none.
  std::pair<std::uintptr_t, std::size_t> find(const void* p) const noexcept;

 private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> ranges_;
};

class cpu_module final : public module {
 public:
  /// Loads an image whose records the core has read and checked; on failure sets `ec` and
  /// returns null.
  static std::unique_ptr<cpu_module> load(std::span<const std::byte> image, std::error_code& ec,
                                          std::string& message,
                                          std::shared_ptr<global_ranges> globals = nullptr);
  ~cpu_module() override;

  const std::vector<kernel_desc>& kernels() const override { return kernels_; }
  void* function(std::size_t index, std::error_code& ec, std::string& message) override;
  void* find(const std::string& name, kernel_desc& layout, std::error_code& ec,
             std::string& message) override;
  void* global(const std::string& name, std::size_t& size, std::error_code& ec,
               std::string& message) override;
  /// A kernel's handle is its entry function in the loaded image.
  void* code_address(void* function) const noexcept override { return function; }

 private:
  cpu_module() = default;
  void* handle_ = nullptr;
  int fd_ = -1;  // the image's memory file, open while it is loaded
  std::vector<kernel_desc> kernels_;  // empty: the core has the list
  std::shared_ptr<global_ranges> globals_;
  std::mutex published_mutex_;
  std::vector<const void*> published_;  // globals added to globals_, removed at unload
};

}  // namespace cora::backend::cpu
