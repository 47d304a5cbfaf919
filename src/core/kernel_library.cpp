#include "cora/kernel_library.hpp"

#include <mutex>
#include <unordered_map>

#include "core/binary_loader.hpp"
#include "core/state.hpp"

namespace cora {

struct kernel_library::per_device {
  std::shared_ptr<detail::device_state> device;
  binary bin;
  std::vector<cora::kernel> kernels;
};

kernel_library::kernel_library(std::span<const std::byte> image, std::vector<std::string> kernels)
    : image_(image), names_(std::move(kernels)) {}

kernel_library::~kernel_library() = default;

kernel_library::per_device& kernel_library::on(const std::shared_ptr<detail::device_state>& dev) {
  std::lock_guard lock(mutex_);
  for (auto& d : devices_)
    if (d->device == dev) return *d;
  // First launch on this device: load the embedded binary here, in call order.
  std::error_code ec;
  std::string message;
  auto st = detail::load_binary_image(dev, std::span<const std::byte>(image_), {}, ec, message);
  if (ec) throw error(ec, "cannot load the kernel library on " + dev->properties.name + ": " + message);
  auto d = std::make_unique<per_device>();
  d->device = dev;
  d->bin = binary(std::move(st));
  for (const auto& n : names_) d->kernels.push_back(d->bin.kernel(n));
  devices_.push_back(std::move(d));
  return *devices_.back();
}

const cora::kernel& kernel_library::kernel(const stream& s, std::size_t index) {
  if (!s) throw error(errc::invalid_handle, "empty stream handle");
  auto& d = on(s.state()->device);
  if (index >= d.kernels.size()) throw error(errc::kernel_not_found, "no kernel with that index");
  return d.kernels[index];
}

cora::kernel kernel_library::kernel(cora::device& dev, std::string_view name) {
  auto& d = on(dev.state());
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return d.kernels[i];
  return d.bin.kernel(name);
}

namespace {

struct symbol_table {
  std::mutex mutex;
  std::unordered_map<const void*, kernel_symbol> symbols;
};

symbol_table& symbols() {
  static symbol_table t;
  return t;
}

}  // namespace

void register_kernel_symbol(const void* symbol, kernel_library& library, std::size_t index) {
  auto& t = symbols();
  std::lock_guard lock(t.mutex);
  t.symbols[symbol] = {&library, index};
}

kernel_symbol find_kernel_symbol(const void* symbol) noexcept {
  auto& t = symbols();
  std::lock_guard lock(t.mutex);
  auto it = t.symbols.find(symbol);
  return it == t.symbols.end() ? kernel_symbol{} : it->second;
}

}  // namespace cora
