#include "cora/binary.hpp"

#include <algorithm>

#include "core/binary_format.hpp"
#include "core/binary_loader.hpp"
#include "core/state.hpp"
#include "cora/detail/arg_layout.hpp"

namespace cora {

namespace detail {

binary_state::~binary_state() = default;

std::shared_ptr<backend::module> binary_state::ensure_loaded(std::error_code& ec,
                                                             std::string& message) {
  std::lock_guard lock(mutex);
  if (unloaded.load(std::memory_order_acquire)) {
    set_error(ec, errc::binary_unloaded, "the binary was unloaded");
    return nullptr;
  }
  if (!module) {
    if (device->shut_down.load(std::memory_order_acquire)) {
      set_error(ec, errc::runtime_shut_down, "the runtime was shut down");
      return nullptr;
    }
    auto m = device->backend->load(image, image_kind, ec, message);
    if (ec) return nullptr;
    module = std::shared_ptr<backend::module>(std::move(m));
    image.clear();
    image.shrink_to_fit();
  }
  ec.clear();
  return module;
}

std::shared_ptr<backend::module> binary_state::module_for_launch(std::error_code& ec) {
  std::lock_guard lock(mutex);
  if (unloaded.load(std::memory_order_relaxed) || !module) {
    set_error(ec, errc::binary_unloaded, "the kernel's binary was unloaded");
    return nullptr;
  }
  return module;
}

namespace {

// Picks the image of a container that the device runs: for CUDA an exact cubin, then a
// fatbin, then PTX; for the CPU device its ELF image.
const corabin_image* pick_image(const corabin& c, device_state& dev) {
  const corabin_image* best = nullptr;
  int best_rank = -1;
  const std::uint32_t arch =
      static_cast<std::uint32_t>(dev.properties.compute_major * 10 + dev.properties.compute_minor);
  for (const auto& img : c.images) {
    if (!dev.backend->accepts(to_image_kind(img.kind))) continue;
    int rank = 0;
    switch (img.kind) {
      case binary_kind::cuda_cubin: rank = img.arch == arch ? 4 : 0; break;
      case binary_kind::cuda_fatbin: rank = 3; break;
      case binary_kind::cuda_ptx: rank = 2; break;
      case binary_kind::cpu_elf: rank = 4; break;
      default: break;
    }
    if (rank > best_rank) {
      best = &img;
      best_rank = rank;
    }
  }
  return best_rank > 0 ? best : nullptr;
}

std::string device_label(device_state& dev) {
  return dev.properties.name + " (" + (dev.properties.backend == backend_kind::cuda ? "cuda" : "cpu") + ")";
}

}  // namespace

std::shared_ptr<binary_state> load_binary_image(std::shared_ptr<device_state> dev,
                                                std::vector<std::byte> bytes,
                                                const load_options& options, std::error_code& ec,
                                                std::string& message) {
  if (bytes.empty()) {
    set_error(ec, errc::invalid_binary, "the binary is empty");
    message = last_error_message();
    return nullptr;
  }
  auto st = std::make_shared<binary_state>();
  st->device = dev;
  const binary_kind kind = sniff_binary(bytes);
  std::vector<backend::kernel_desc> declared;
  bool have_declared = false;
  std::span<const std::byte> image(bytes);
  binary_kind image_kind = kind;
  corabin container;
  switch (kind) {
    case binary_kind::corabin: {
      container = parse_corabin(bytes, ec, message);
      if (ec) return nullptr;
      const corabin_image* img = pick_image(container, *dev);
      if (!img) {
        std::string have;
        for (const auto& i : container.images) have += std::string(have.empty() ? "" : ", ") + binary_kind_name(i.kind);
        ec = make_error_code(errc::invalid_binary);
        message = "the container has no image for " + device_label(*dev) + " (it holds: " + have + ")";
        return nullptr;
      }
      image = img->bytes;
      image_kind = img->kind;
      declared = container.kernels;
      have_declared = !declared.empty();
      st->format = std::string("corabin/") + binary_kind_name(img->kind);
      break;
    }
    case binary_kind::cpu_elf:
    case binary_kind::cuda_cubin:
    case binary_kind::cuda_fatbin:
    case binary_kind::cuda_ptx:
      if (!dev->backend->accepts(to_image_kind(kind))) {
        ec = make_error_code(errc::invalid_binary);
        message = std::string("a ") + binary_kind_name(kind) + " image cannot run on " + device_label(*dev);
        return nullptr;
      }
      st->format = binary_kind_name(kind);
      if (kind == binary_kind::cpu_elf) {
        declared = read_cpu_kernel_records(bytes, ec, message);
        if (ec) return nullptr;
        have_declared = true;
      }
      break;
    case binary_kind::foreign_elf:
      ec = make_error_code(errc::invalid_binary);
      message = "an ELF file that is no kernel image for this device (wrong machine or type)";
      return nullptr;
    case binary_kind::unknown:
      ec = make_error_code(errc::invalid_binary);
      message = "not a kernel binary (no known format: corabin, CPU kernel image, cubin, fatbin, PTX)";
      return nullptr;
  }
  st->image_kind = to_image_kind(image_kind);
  if (options.lazy && have_declared) {
    st->image.assign(image.begin(), image.end());
    st->kernels = std::move(declared);
    ec.clear();
    return st;
  }
  auto m = dev->backend->load(image, st->image_kind, ec, message);
  if (ec) return nullptr;
  st->module = std::shared_ptr<backend::module>(std::move(m));
  st->kernels = st->module->kernels();
  if (have_declared) {
    // The container's metadata must agree with what the device reports.
    for (const auto& d : declared) {
      auto it = std::find_if(st->kernels.begin(), st->kernels.end(),
                             [&](const backend::kernel_desc& k) { return k.name == d.name; });
      if (it == st->kernels.end()) continue;
      if (!it->params_known) {
        it->params = d.params;
        it->params_known = true;
      } else if (it->params.size() != d.params.size()) {
        ec = make_error_code(errc::invalid_binary);
        message = "kernel '" + d.name + "' has " + std::to_string(it->params.size()) +
                  " parameters in the image but " + std::to_string(d.params.size()) + " in its metadata";
        return nullptr;
      } else {
        // Some backends know only offsets and sizes (CUDA) and guess alignments; the metadata
        // has the signature's, which fix the canonical layout. Sizes must agree.
        for (std::size_t i = 0; i < d.params.size(); ++i) {
          if (it->params[i].size != d.params[i].size) {
            ec = make_error_code(errc::invalid_binary);
            message = "parameter " + std::to_string(i) + " of kernel '" + d.name + "' has " +
                      std::to_string(it->params[i].size) + " bytes in the image but " +
                      std::to_string(d.params[i].size) + " in its metadata";
            return nullptr;
          }
          it->params[i].align = d.params[i].align;
          // A CPU image's records say which parameters are pointers, and must agree; other
          // images do not say, and take the metadata's word.
          if (dev->properties.backend == backend_kind::cpu &&
              it->params[i].pointer != d.params[i].pointer) {
            ec = make_error_code(errc::invalid_binary);
            message = "parameter " + std::to_string(i) + " of kernel '" + d.name + "' is " +
                      (it->params[i].pointer ? "" : "not ") + "a pointer in the image but " +
                      (d.params[i].pointer ? "" : "not ") + "in its metadata";
            return nullptr;
          }
          it->params[i].pointer = d.params[i].pointer;
        }
      }
      if (!it->entry_key) it->entry_key = d.entry_key;
    }
  }
  for (auto& k : st->kernels) {
    std::uint64_t key;
    if (!k.entry_key && entry_key_of(k.name, key)) k.entry_key = key;
  }
  ec.clear();
  return st;
}

std::shared_ptr<kernel_state> make_kernel(const std::shared_ptr<binary_state>& b, std::size_t index,
                                          std::error_code& ec) {
  std::string message;
  auto module = b->ensure_loaded(ec, message);
  if (ec) {
    if (!message.empty()) set_error(ec, ec, message);
    return nullptr;
  }
  const auto& want = b->kernels[index];
  const auto& loaded = module->kernels();
  std::size_t mi = 0;
  while (mi < loaded.size() && loaded[mi].name != want.name) ++mi;
  if (mi == loaded.size()) {
    set_error(ec, errc::kernel_not_found, "kernel '" + want.name + "' is not in the loaded image");
    return nullptr;
  }
  void* fn = module->function(mi, ec, message);
  if (ec) {
    set_error(ec, ec, message);
    return nullptr;
  }
  auto k = std::make_shared<kernel_state>();
  k->binary = b;
  k->desc = &want;
  k->function = fn;
  std::size_t end = 0;
  for (const auto& p : want.params) {
    const std::size_t off = next_param_offset(end, p.align);
    k->params.push_back({off, p.size, p.align, p.pointer});
    end = off + p.size;
  }
  k->args_size = align_up(end, 8);
  ec.clear();
  return k;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// kernel

std::string_view kernel::name() const noexcept { return s_ ? std::string_view(s_->desc->name) : std::string_view(); }

std::optional<std::uint64_t> kernel::entry_key() const noexcept {
  return s_ ? s_->desc->entry_key : std::nullopt;
}

std::span<const param_info> kernel::params() const noexcept {
  return s_ ? std::span<const param_info>(s_->params) : std::span<const param_info>();
}

std::size_t kernel::args_size() const noexcept { return s_ ? s_->args_size : 0; }

// ---------------------------------------------------------------------------------------------
// binary

cora::kernel binary::kernel(std::string_view name, std::error_code& ec) const {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty binary handle");
    return {};
  }
  if (s_->unloaded.load(std::memory_order_acquire)) {
    detail::set_error(ec, errc::binary_unloaded, "the binary was unloaded");
    return {};
  }
  for (std::size_t i = 0; i < s_->kernels.size(); ++i)
    if (s_->kernels[i].name == name) return cora::kernel(detail::make_kernel(s_, i, ec));
  detail::set_error(ec, errc::kernel_not_found,
                    "no kernel named '" + std::string(name) + "' in the binary");
  return {};
}

cora::kernel binary::kernel(std::string_view name) const {
  std::error_code ec;
  auto k = kernel(name, ec);
  detail::throw_if(ec);
  return k;
}

cora::kernel binary::kernel_by_entry(std::uint64_t key, std::error_code& ec) const {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty binary handle");
    return {};
  }
  if (s_->unloaded.load(std::memory_order_acquire)) {
    detail::set_error(ec, errc::binary_unloaded, "the binary was unloaded");
    return {};
  }
  for (std::size_t i = 0; i < s_->kernels.size(); ++i)
    if (s_->kernels[i].entry_key == key) return cora::kernel(detail::make_kernel(s_, i, ec));
  detail::set_error(ec, errc::kernel_not_found,
                    "no kernel with entry key " + std::to_string(key) + " in the binary");
  return {};
}

cora::kernel binary::kernel_by_entry(std::uint64_t key) const {
  std::error_code ec;
  auto k = kernel_by_entry(key, ec);
  detail::throw_if(ec);
  return k;
}

std::vector<std::string> binary::kernel_names() const {
  std::vector<std::string> out;
  if (s_)
    for (const auto& k : s_->kernels) out.push_back(k.name);
  return out;
}

std::string binary::format() const { return s_ ? s_->format : std::string(); }

void binary::unload(std::error_code& ec) {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty binary handle");
    return;
  }
  std::shared_ptr<backend::module> last;  // freed outside the lock, unless launches hold it
  {
    std::lock_guard lock(s_->mutex);
    if (s_->unloaded.exchange(true)) {
      detail::set_error(ec, errc::already_unloaded, "the binary was already unloaded");
      return;
    }
    last = std::move(s_->module);
  }
  ec.clear();
}

void binary::unload() {
  std::error_code ec;
  unload(ec);
  detail::throw_if(ec);
}

bool binary::loaded() const noexcept { return s_ && !s_->unloaded.load(std::memory_order_acquire); }

}  // namespace cora
