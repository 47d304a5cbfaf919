#include "backend/cpu/cpu_module.hpp"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/binary_format.hpp"
#include "cora/error.hpp"

namespace cora::backend::cpu {

std::unique_ptr<cpu_module> cpu_module::load(std::span<const std::byte> image, std::error_code& ec,
                                             std::string& message) {
  auto kernels = detail::read_cpu_kernel_records(image, ec, message);
  if (ec) return nullptr;

  // dlopen needs a file: an anonymous memory file, never a path on disk.
  const int fd = ::memfd_create("cora-kernel-image", MFD_CLOEXEC);
  if (fd < 0) {
    ec = std::error_code(errno, std::system_category());
    message = "memfd_create failed";
    return nullptr;
  }
  std::size_t written = 0;
  while (written < image.size()) {
    const ssize_t n = ::write(fd, image.data() + written, image.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ec = std::error_code(errno ? errno : EIO, std::system_category());
      message = "writing the kernel image to memory failed";
      ::close(fd);
      return nullptr;
    }
    written += static_cast<std::size_t>(n);
  }
  // The file stays open while the image is loaded: dlopen returns an already loaded object of
  // the same name, and "/proc/self/fd/N" names repeat once N is closed and reused.
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    ::close(fd);
    ec = make_error_code(errc::invalid_binary);
    const char* err = ::dlerror();
    message = std::string("the kernel image does not load: ") + (err ? err : "dlopen failed");
    return nullptr;
  }
  std::unique_ptr<cpu_module> m(new cpu_module);
  m->handle_ = handle;
  m->fd_ = fd;
  m->kernels_ = std::move(kernels);
  m->entries_.resize(m->kernels_.size(), nullptr);
  for (std::size_t i = 0; i < m->kernels_.size(); ++i) {
    const std::string symbol = CORA_KERNEL_ENTRY_PREFIX + m->kernels_[i].name;
    m->entries_[i] = ::dlsym(handle, symbol.c_str());
    if (!m->entries_[i]) {
      ec = make_error_code(errc::invalid_binary);
      message = "the kernel image lacks the entry of kernel '" + m->kernels_[i].name + "'";
      return nullptr;
    }
  }
  ec.clear();
  return m;
}

cpu_module::~cpu_module() {
  if (handle_) ::dlclose(handle_);
  if (fd_ >= 0) ::close(fd_);
}

void* cpu_module::function(std::size_t index, std::error_code& ec, std::string& message) {
  if (index >= entries_.size()) {
    ec = make_error_code(errc::kernel_not_found);
    message = "no such kernel";
    return nullptr;
  }
  ec.clear();
  return entries_[index];
}

}  // namespace cora::backend::cpu
