#include "backend/cpu/cpu_module.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cora/error.hpp"

namespace cora::backend::cpu {

namespace {

bool write_all(int fd, const std::byte* p, std::size_t n) {
  std::size_t written = 0;
  while (written < n) {
    const ssize_t w = ::write(fd, p + written, n - written);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    written += static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

void global_ranges::add(const void* p, std::size_t size) {
  std::lock_guard lock(mutex_);
  ranges_[reinterpret_cast<std::uintptr_t>(p)] = size;
}

void global_ranges::remove(const void* p) noexcept {
  std::lock_guard lock(mutex_);
  ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
}

std::pair<std::uintptr_t, std::size_t> global_ranges::find(const void* p) const noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mutex_);
  auto it = ranges_.upper_bound(a);
  if (it == ranges_.begin()) return {0, 0};
  --it;
  if (a - it->first >= it->second) return {0, 0};
  return *it;
}

kept_images::~kept_images() {
  for (const entry& e : files_) ::close(e.fd);
}

void kept_images::keep(const image_key& key, int fd) noexcept {
  std::lock_guard lock(mutex_);
  const bool known = std::any_of(files_.begin(), files_.end(), [&](const entry& e) { return e.key == key; });
  if (known || key.size > max_bytes) {
    ::close(fd);
    return;
  }
  try {
    files_.push_back({key, fd});
  } catch (...) {
    ::close(fd);
    return;
  }
  bytes_ += key.size;
  while (files_.size() > max_files || bytes_ > max_bytes) {
    bytes_ -= files_.front().key.size;
    ::close(files_.front().fd);
    files_.pop_front();
  }
}

int kept_images::take(const image_key& key) noexcept {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(files_.begin(), files_.end(), [&](const entry& e) { return e.key == key; });
  if (it == files_.end()) return -1;
  const int fd = it->fd;
  bytes_ -= it->key.size;
  files_.erase(it);
  return fd;
}

std::unique_ptr<cpu_module> cpu_module::load(std::span<const std::byte> image, std::error_code& ec,
                                             std::string& message,
                                             std::shared_ptr<global_ranges> globals,
                                             std::shared_ptr<kept_images> kept, const image_key& key) {
  // The kernel records were read and checked by the core (against the container's metadata,
  // which its checksum covers); entries are found by name at their first lookup.
  // dlopen needs a file: an anonymous memory file, never a path on disk. The core passes the
  // bytes the loader maps (the image up to its last loadable segment, without debug sections,
  // unless CORA_CPU_FULL_IMAGES asks for them), so a large image with debug information costs
  // no more to load than a stripped one. A section table outside them is dropped from the
  // header (the dynamic loader never reads it).
  const std::size_t size = image.size();
  if (size < sizeof(Elf64_Ehdr)) {
    ec = make_error_code(errc::invalid_binary);
    message = "the kernel image is too small for an ELF header";
    return nullptr;
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof(eh));
  const bool table_inside = eh.e_shoff <= size && eh.e_shentsize == sizeof(Elf64_Shdr) &&
                            (size - eh.e_shoff) / sizeof(Elf64_Shdr) >= eh.e_shnum;
  const int fd = ::memfd_create("cora-kernel-image", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    ec = std::error_code(errno, std::system_category());
    message = "memfd_create failed";
    return nullptr;
  }
  bool ok;
  if (!table_inside) {
    eh.e_shoff = 0;
    eh.e_shnum = 0;
    eh.e_shstrndx = SHN_UNDEF;
    ok = write_all(fd, reinterpret_cast<const std::byte*>(&eh), sizeof(eh)) &&
         write_all(fd, image.data() + sizeof(eh), size - sizeof(eh));
  } else {
    ok = write_all(fd, image.data(), image.size());
  }
  if (!ok) {
    ec = std::error_code(errno, std::system_category());
    message = "writing the kernel image to memory failed";
    ::close(fd);
    return nullptr;
  }
  // A file kept for later loads must stay these bytes: sealed against any change.
  if (kept && key && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    kept = nullptr;
  return open(fd, ec, message, std::move(globals), std::move(kept), key);
}

std::unique_ptr<cpu_module> cpu_module::open(int fd, std::error_code& ec, std::string& message,
                                             std::shared_ptr<global_ranges> globals,
                                             std::shared_ptr<kept_images> kept, const image_key& key) {
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
  m->globals_ = std::move(globals);
  m->fd_ = fd;
  if (key) {
    m->kept_ = std::move(kept);
    m->key_ = key;
  }
  ec.clear();
  return m;
}

cpu_module::~cpu_module() {
  if (globals_)
    for (const void* p : published_) globals_->remove(p);
  if (handle_) ::dlclose(handle_);
  if (fd_ < 0) return;
  // An image the loader keeps (C++ unique symbols make it undeletable) stays known by its
  // "/proc/self/fd/N" name: a later image in a file that reuses N would get the old object.
  // Its file then stays open too, so that the name is never reused.
  const std::string path = "/proc/self/fd/" + std::to_string(fd_);
  if (void* still = ::dlopen(path.c_str(), RTLD_NOLOAD | RTLD_LAZY)) {
    ::dlclose(still);
    return;
  }
  // Unloaded for good: a later load of the same bytes may map this file again.
  if (kept_)
    kept_->keep(key_, fd_);
  else
    ::close(fd_);
}

void* cpu_module::function(std::size_t index, std::error_code& ec, std::string& message) {
  (void)index;
  ec = make_error_code(errc::kernel_not_found);
  message = "the CPU device finds kernels by name";
  return nullptr;
}

void* cpu_module::global(const std::string& name, std::size_t& size, std::error_code& ec,
                         std::string& message) {
  size = 0;
  // The image's data lives in the process, where the CPU device's kernels read and write it.
  void* address = ::dlsym(handle_, name.c_str());
  Dl_info info{};
  const ElfW(Sym)* sym = nullptr;
  if (!address ||
      ::dladdr1(address, &info, reinterpret_cast<void**>(const_cast<ElfW(Sym)**>(&sym)), RTLD_DL_SYMENT) == 0 ||
      !sym || ELF64_ST_TYPE(sym->st_info) != STT_OBJECT) {
    ec = make_error_code(errc::kernel_not_found);
    message = "no global '" + name + "' in the loaded image (declare it with CORA_GLOBAL)";
    return nullptr;
  }
  size = static_cast<std::size_t>(sym->st_size);
  // CORA_GLOBAL records the variable's size beside it; the symbol's size may include padding
  // that a sanitizer adds.
  if (const auto* recorded =
          static_cast<const unsigned long long*>(::dlsym(handle_, ("cora_global_size_" + name).c_str())))
    size = static_cast<std::size_t>(*recorded);
  if (globals_ && size) {
    std::lock_guard lock(published_mutex_);
    if (std::find(published_.begin(), published_.end(), address) == published_.end()) {
      published_.push_back(address);
      globals_->add(address, size);
    }
  }
  ec.clear();
  return address;
}

void* cpu_module::find(const std::string& name, kernel_desc& layout, std::error_code& ec,
                       std::string& message) {
  // dlsym is thread-safe; the core calls this once per kernel and caches the result.
  const std::string symbol = CORA_KERNEL_ENTRY_PREFIX + name;
  void* entry = ::dlsym(handle_, symbol.c_str());
  if (!entry) {
    ec = make_error_code(errc::kernel_not_found);
    message = "kernel '" + name + "' is not in the loaded image";
    return nullptr;
  }
  layout = kernel_desc{};
  layout.name = name;
  layout.params_known = false;  // the image's records were checked against the metadata at load
  ec.clear();
  return entry;
}

}  // namespace cora::backend::cpu
