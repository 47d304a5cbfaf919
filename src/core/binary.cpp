#include "cora/binary.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <vector>

#include <asio/post.hpp>

#include "core/binary_format.hpp"
#include "core/binary_loader.hpp"
#include "core/host_pool.hpp"
#include "core/state.hpp"
#include "cora/detail/arg_layout.hpp"
#include "io/file_reader.hpp"

namespace cora {

namespace detail {

// The module's last reference unloads it (device_state::own_module): on the dropping thread only
// when a user's handle let it go and the unload waits for nothing, else on a cora thread.
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
    auto m = device->backend->load(image, image_kind, image_key, ec, message);
    if (ec) return nullptr;
    module = device->own_module(std::move(m));
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
const corabin_image* pick_image(const corabin& c, const device_state& dev) {
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

std::string device_label(const device_state& dev) {
  return dev.properties.name + " (" + (dev.properties.backend == backend_kind::cuda ? "cuda" : "cpu") + ")";
}

}  // namespace

namespace {

// The container's metadata must be the CPU image's own records, exactly: the image unpacks its
// arguments by its records, so a layout that differs would make a launch read garbage.
bool same_as_image(const std::vector<backend::kernel_desc>& declared,
                   const std::vector<backend::kernel_desc>& image, std::error_code& ec,
                   std::string& message) {
  auto mismatch = [&](const std::string& what) {
    ec = make_error_code(errc::invalid_binary);
    message = "the container's kernel metadata does not match its CPU image: " + what;
    return false;
  };
  if (declared.size() != image.size())
    return mismatch(std::to_string(declared.size()) + " kernels in the metadata, " +
                    std::to_string(image.size()) + " in the image");
  for (const auto& d : declared) {
    auto it = std::find_if(image.begin(), image.end(),
                           [&](const backend::kernel_desc& k) { return k.name == d.name; });
    if (it == image.end()) return mismatch("kernel '" + d.name + "' is not in the image");
    if (it->entry_key != d.entry_key) return mismatch("kernel '" + d.name + "' has another entry key");
    if (it->params.size() != d.params.size())
      return mismatch("kernel '" + d.name + "' has " + std::to_string(it->params.size()) +
                      " parameters in the image but " + std::to_string(d.params.size()) + " in its metadata");
    for (std::size_t i = 0; i < d.params.size(); ++i)
      if (it->params[i].size != d.params[i].size || it->params[i].align != d.params[i].align)
        return mismatch("parameter " + std::to_string(i) + " of kernel '" + d.name + "' is " +
                        std::to_string(it->params[i].size) + " bytes aligned to " +
                        std::to_string(it->params[i].align) + " in the image but " +
                        std::to_string(d.params[i].size) + " aligned to " +
                        std::to_string(d.params[i].align) + " in its metadata");
      else if (it->params[i].pointer != d.params[i].pointer)
        return mismatch("parameter " + std::to_string(i) + " of kernel '" + d.name + "' is " +
                        (it->params[i].pointer ? "" : "not ") + "a pointer in the image but " +
                        (d.params[i].pointer ? "" : "not ") + "in its metadata");
  }
  ec.clear();
  return true;
}

}  // namespace

bool plan_load(device_state& dev, std::span<const std::byte> head, std::uint64_t file_size,
               load_plan& plan, std::error_code& ec, std::string& message) {
  plan = load_plan{};
  if (file_size == 0) {
    set_error(ec, errc::invalid_binary, "the binary is empty");
    message = last_error_message();
    return false;
  }
  const binary_kind kind = sniff_binary(head);
  plan.kind = kind;
  plan.image.offset = 0;
  plan.image.size = file_size;
  plan.part_size = file_size;
  switch (kind) {
    case binary_kind::corabin: {
      // Only the image this device runs is read and hashed: a container may carry a large
      // image for another device, which this load never touches.
      corabin container = parse_corabin_meta(head, file_size, ec, message);
      if (ec) return false;
      const corabin_image* img = pick_image(container, dev);
      if (!img) {
        std::string have;
        for (const auto& i : container.images) have += std::string(have.empty() ? "" : ", ") + binary_kind_name(i.kind);
        ec = make_error_code(errc::invalid_binary);
        message = "the container has no image for " + device_label(dev) + " (it holds: " + have + ")";
        return false;
      }
      plan.container = true;
      plan.image = *img;
      // A CPU image is read up to the end of its loadable segments unless the whole is wanted
      // for a debugger (the dynamic loader reads no more); other images whole.
      plan.part_size = img->kind == binary_kind::cpu_elf && !full_cpu_images() ? img->load_size : img->size;
      plan.kind = img->kind;
      plan.declared = std::move(container.kernels);
      plan.format = std::string("corabin/") + binary_kind_name(img->kind);
      break;
    }
    case binary_kind::cpu_elf:
      // The dynamic loader trusts the bytes it maps, and corrupt relocations or headers crash
      // it; a raw shared object has no checksum to check them against first. CPU images are
      // therefore loaded only from a container, whose checksums cover image and metadata.
      ec = make_error_code(errc::invalid_binary);
      message = "a CPU kernel image loads only inside a .corabin container (cora-pack --cpu "
                "IMAGE), whose checksums guard the dynamic loader against corrupt bytes";
      return false;
    case binary_kind::cuda_cubin:
    case binary_kind::cuda_fatbin:
    case binary_kind::cuda_ptx:
      if (!dev.backend->accepts(to_image_kind(kind))) {
        ec = make_error_code(errc::invalid_binary);
        message = std::string("a ") + binary_kind_name(kind) + " image cannot run on " + device_label(dev);
        return false;
      }
      plan.format = binary_kind_name(kind);
      break;
    case binary_kind::foreign_elf:
      ec = make_error_code(errc::invalid_binary);
      message = "an ELF file that is no kernel image for this device (wrong machine or type)";
      return false;
    case binary_kind::unknown:
      ec = make_error_code(errc::invalid_binary);
      message = "not a kernel binary (no known format: corabin, CPU kernel image, cubin, fatbin, PTX)";
      return false;
  }
  ec.clear();
  return true;
}

namespace {

/// The key of the planned image's bytes once they are verified (empty outside a container).
backend::image_key image_key_of(const load_plan& plan) noexcept {
  if (!plan.container) return {};
  return {plan.part_size == plan.image.size ? plan.image.checksum : plan.image.load_checksum,
          plan.part_size};
}

/// The binary of a module loaded (or, lazily, of bytes kept for later) with its kernel records.
std::shared_ptr<binary_state> make_binary(std::shared_ptr<device_state> dev, const load_plan& plan,
                                          std::vector<backend::kernel_desc> declared,
                                          bool have_declared, std::unique_ptr<backend::module> m,
                                          std::span<const std::byte> lazy_image, std::error_code& ec,
                                          std::string& message) {
  auto st = std::make_shared<binary_state>();
  st->device = dev;
  st->format = plan.format;
  st->image_kind = to_image_kind(plan.kind);
  if (!m) {
    st->image.assign(lazy_image.begin(), lazy_image.end());
    st->image_key = image_key_of(plan);
  } else {
    st->module = dev->own_module(std::move(m));
    // An image without metadata lists its kernels now; otherwise each is resolved at its
    // first lookup.
    if (!have_declared) {
      if (!st->module->list_kernels(ec, message)) return nullptr;
      declared = st->module->kernels();
    }
  }
  st->kernels = std::move(declared);
  for (auto& k : st->kernels) {
    std::uint64_t key;
    if (!k.entry_key && entry_key_of(k.name, key)) k.entry_key = key;
  }
  st->resolved.reset(new binary_state::resolved_kernel[st->kernels.size()]);
  ec.clear();
  return st;
}

}  // namespace

std::shared_ptr<binary_state> load_planned(std::shared_ptr<device_state> dev, load_plan plan,
                                           std::span<const std::byte> image,
                                           const load_options& options, std::error_code& ec,
                                           std::string& message) {
  std::vector<backend::kernel_desc> declared = std::move(plan.declared);
  bool have_declared = !declared.empty();
  if (plan.container) {
    corabin_image img = plan.image;
    img.bytes = image;
    // Every byte that is loaded is checked: the loaded part against its own checksum, or the
    // whole image (and that part) when the whole is loaded.
    if (image.size() == img.size ? !verify_corabin_image(img, ec, message)
                                 : !verify_corabin_load_part(img, image, ec, message))
      return nullptr;
    if (img.kind == binary_kind::cpu_elf) {
      // Checked on every load, lazy or not, before anything trusts the metadata.
      const auto own = read_corabin_image_records(img, image, ec, message);
      if (ec) return nullptr;
      if (!have_declared) {
        declared = own;
        have_declared = true;
      } else if (!same_as_image(declared, own, ec, message)) {
        return nullptr;
      }
    }
  }
  if (options.lazy && have_declared)
    return make_binary(std::move(dev), plan, std::move(declared), true, nullptr, image, ec, message);
  // The bytes are verified: named by their key, a module kept from the same bytes may serve.
  auto m = dev->backend->load(image, to_image_kind(plan.kind), image_key_of(plan), ec, message);
  if (ec) return nullptr;
  return make_binary(std::move(dev), plan, std::move(declared), have_declared, std::move(m), {}, ec,
                     message);
}

namespace {

/// Containers that a load read, planned and loaded, by identity (file_identity) and by the
/// devices the plan is for (plan_class): a later load of the file unchanged neither reads nor
/// checks its metadata again. It reads only the image (checked against its checksum, as every
/// loaded byte is), or, on a device that keeps the files of unloaded images (the CPU device,
/// backend::device::load_kept), reads nothing of the file. A file written since shows another
/// identity. Only files last changed at least `settle` before the load are recorded, so that a
/// write within the file system's timestamp granularity of it still changes the identity.
class known_files {
 public:
  struct entry {
    file_identity file;
    std::uint64_t devices = 0;                  // plan_class of the devices the plan is for
    load_plan plan;                             // as planned from the metadata
    std::vector<backend::kernel_desc> kernels;  // of the binary the load made
  };
  static constexpr std::size_t max_entries = 64;
  static constexpr std::int64_t settle_ns = 100'000'000;

  static known_files& get() {
    static auto* k = new known_files;  // never destroyed: loads may run during exit
    return *k;
  }
  /// What is known of `file` as it is, for devices of class `devices`; null if nothing.
  std::shared_ptr<const entry> find(const file_identity& file, std::uint64_t devices) const {
    std::lock_guard lock(mutex_);
    for (const auto& e : entries_)
      if (e->file == file && e->devices == devices) return e;
    return nullptr;
  }
  /// Forgets `file` for devices of class `devices`.
  void forget(const file_identity& file, std::uint64_t devices) noexcept {
    std::lock_guard lock(mutex_);
    std::erase_if(entries_, [&](const auto& k) { return k->file == file && k->devices == devices; });
  }
  void add(entry e) noexcept {
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    if (e.file.changed_ns > std::int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec - settle_ns) return;
    try {
      auto known = std::make_shared<const entry>(std::move(e));
      std::lock_guard lock(mutex_);
      std::erase_if(entries_, [&](const auto& k) {
        return k->file.device == known->file.device && k->file.inode == known->file.inode &&
               k->devices == known->devices;
      });
      entries_.push_back(std::move(known));
      if (entries_.size() > max_entries) entries_.pop_front();
    } catch (...) {
      // Out of memory: the file is read again next time.
    }
  }

 private:
  mutable std::mutex mutex_;
  std::deque<std::shared_ptr<const entry>> entries_;  // the oldest first
};

/// The devices whose image a container's plan picks alike (pick_image): those of one backend
/// and, on a GPU, one architecture.
std::uint64_t plan_class(const device_state& dev) noexcept {
  return (std::uint64_t{static_cast<std::uint32_t>(dev.properties.backend)} << 32) |
         (static_cast<std::uint32_t>(dev.properties.compute_major) << 16) |
         static_cast<std::uint32_t>(dev.properties.compute_minor);
}

/// The binary of a known file's image (known_files), from the memory file the backend kept;
/// null if it kept none (the image is then read).
std::shared_ptr<binary_state> load_known(std::shared_ptr<device_state> dev, const known_files::entry& known,
                                         std::error_code& ec, std::string& message) {
  auto m = dev->backend->load_kept(image_key_of(known.plan), to_image_kind(known.plan.kind), ec, message);
  if (!m) return nullptr;
  return make_binary(std::move(dev), known.plan, known.kernels, true, std::move(m), {}, ec, message);
}

}  // namespace

std::shared_ptr<binary_state> load_binary_image(std::shared_ptr<device_state> dev,
                                                std::span<const std::byte> bytes,
                                                const load_options& options, std::error_code& ec,
                                                std::string& message) {
  load_plan plan;
  if (!plan_load(*dev, bytes, bytes.size(), plan, ec, message)) return nullptr;
  const auto image = bytes.subspan(plan.image.offset, plan.part_size);
  return load_planned(std::move(dev), std::move(plan), image,
                      options, ec, message);
}

namespace {

/// A load from a file: its first bytes (a container's metadata), then the image it picks, read
/// through the I/O queue without copying the rest of the file.
struct file_load : std::enable_shared_from_this<file_load> {
  std::shared_ptr<device_state> dev;
  load_options options;
  file_load_callback done;
  std::shared_ptr<file_parts> file;
  std::unique_ptr<std::byte[]> head;  // not value-initialized: every byte is read over
  std::size_t head_size = 0;
  std::unique_ptr<std::byte[]> image;
  load_plan plan;
  file_identity identity;  // of the file when opened

  // Enough for the metadata of a container of 25 kernels (a record is about 1.1 KiB) and
  // for sniffing a raw image (PTX is recognised in its first 4 KiB); more metadata takes a
  // second read.
  static constexpr std::size_t first_read = 32 * 1024;

  std::string quoted_path() const { return "'" + file_path.string() + "'"; }
  // I/O errors name the path already.
  void fail(std::error_code ec, std::string message) { done(ec, std::move(message), nullptr); }
  void fail_load(std::error_code ec, const std::string& message) {
    done(ec, quoted_path() + ": " + message, nullptr);
  }

  std::filesystem::path file_path;
  // The stream of the host function that asked for the load, if any (see run_when_idle); held,
  // so that no other stream takes its address before the load compares it.
  intrusive_ptr<stream_state> host_func_stream;
  bool here = false;  // read what the page cache holds on the calling thread (start())
  bool from_known = false;  // the plan is a known file's (load_known), not read now

  void start() {
    // What loads on the calling thread from memory (an image part up to inline_cpu_load_bytes:
    // on the CPU device always, on a GPU while its streams are idle) loads here from a file
    // whose parts are in the page cache, read with an open and reads that cannot wait
    // (here_up_to): no hop to the I/O thread and back. A GPU with work in flight loads later
    // on a cora thread, so its reads go through the queue, as does anything else, errors too.
    here = !dev->backend->load_waits() || dev->streams_idle();
    if (here)
      if (auto f = file_parts::open_cached(file_path)) return opened(std::move(f));
    file_parts::open(file_path, [self = shared_from_this()](std::error_code ec, std::string message,
                                                       std::shared_ptr<file_parts> f) {
      if (ec) return self->fail(ec, std::move(message));
      self->opened(std::move(f));
    });
  }

  std::size_t here_up_to() const noexcept { return here ? inline_cpu_load_bytes : 0; }

  void opened(std::shared_ptr<file_parts> f) {
    file = std::move(f);
    identity = file->identity();
    if (file->size() == 0) return fail(make_error_code(errc::invalid_binary), quoted_path() + " is empty");
    if (load_known()) return;
    read_head(std::min<std::uint64_t>(file->size(), first_read));
  }

  void read_head(std::size_t n) {
    try {
      head.reset(new std::byte[n]);  // at most a header's worth of metadata (under 5 MiB)
    } catch (const std::bad_alloc&) {
      return fail_load(std::make_error_code(std::errc::not_enough_memory),
                       "its metadata does not fit in memory");
    }
    head_size = n;
    file->read(0, n, head.get(), [self = shared_from_this()](std::error_code ec, std::string message) {
      if (ec) return self->fail(ec, std::move(message));
      self->on_head();
    }, here_up_to());
  }

  void on_head() {
    const std::span<const std::byte> h(head.get(), head_size);
    const std::uint64_t meta = corabin_meta_size(h);
    if (meta > head_size && meta <= file->size()) return read_head(static_cast<std::size_t>(meta));
    std::error_code ec;
    std::string message;
    if (!plan_load(*dev, h, file->size(), plan, ec, message)) return fail_load(ec, message);
    const std::uint64_t begin = plan.image.offset, end = begin + plan.part_size;
    if (end <= head_size) return load(head.get() + begin);
    read_image();
  }

  /// Reads the planned image (what the first read got of it is not read again), then loads it.
  void read_image() {
    const std::uint64_t begin = plan.image.offset;
    try {
      image.reset(new std::byte[plan.part_size]);
    } catch (const std::bad_alloc&) {
      return fail_load(std::make_error_code(std::errc::not_enough_memory),
                  "an image of " + std::to_string(plan.part_size) + " bytes does not fit in memory");
    }
    // What the first read got of the image is not read again.
    const std::size_t have = begin < head_size ? static_cast<std::size_t>(head_size - begin) : 0;
    if (have) std::memcpy(image.get(), head.get() + begin, have);
    file->read(begin + have, static_cast<std::size_t>(plan.part_size - have), image.get() + have,
               [self = shared_from_this()](std::error_code e, std::string m) {
                 if (e) return self->fail(e, std::move(m));
                 self->load(self->image.get());
               }, here_up_to());
  }

  /// Loads a known file (known_files) without reading its metadata: from the memory file
  /// the device kept of its image, where it kept one and the load is not lazy, else from the
  /// image read alone. False if the file is not known (it is then read whole).
  bool load_known() {
    if (dev->shut_down.load(std::memory_order_acquire)) return false;
    try {
      const auto known = known_files::get().find(identity, plan_class(*dev));
      if (!known) return false;
      if (!options.lazy && dev->backend->keeps_images() && loads_inline(*dev, known->plan.part_size)) {
        std::error_code ec;
        std::string message;
        if (auto b = cora::detail::load_known(dev, *known, ec, message)) {
          file.reset();
          done({}, {}, std::move(b));
          return true;
        }
      }
      plan = known->plan;
    } catch (...) {
      return false;  // out of memory: the usual way reports what still fails
    }
    from_known = true;
    read_image();
    return true;
  }

  /// Starts over, reading the file whole (its known plan failed).
  void read_again() {
    from_known = false;
    plan = load_plan{};
    head.reset();
    head_size = 0;
    image.reset();
    start();
  }

  void load(const std::byte* bytes) {
    file.reset();  // closed before a long load
    auto run = [self = shared_from_this(), bytes] {
      std::error_code ec;
      std::string message;
      if (self->dev->shut_down.load(std::memory_order_acquire))
        return self->fail(make_error_code(errc::runtime_shut_down), "the runtime was shut down");
      std::shared_ptr<binary_state> b;
      try {
        b = load_planned(self->dev, self->plan, std::span(bytes, self->plan.part_size),
                         self->options, ec, message);
      } catch (...) {
        ec = std::make_error_code(std::errc::not_enough_memory);
        message = "out of memory while loading the image";
      }
      if (ec == make_error_code(errc::invalid_binary) && self->from_known) {
        // The file no longer holds what its identity promised: forgotten, and read whole
        // (from a cora thread: this may run with the device's submission locks held).
        known_files::get().forget(self->identity, plan_class(*self->dev));
        try {
          asio::post(host_pool(), [self] { self->read_again(); });
          return;
        } catch (...) {
        }
      }
      if (ec) return self->fail_load(ec, message);
      if (!self->from_known && self->plan.container) {
        try {
          known_files::get().add({self->identity, plan_class(*self->dev), self->plan, b->kernels});
        } catch (...) {
          // Out of memory: the file is not remembered, and the load stands.
        }
      }
      self->done({}, {}, std::move(b));
    };
    // Here is the calling thread (a small image part read from the page cache) or the I/O
    // thread. The CPU device's load (a checksum pass and a dlopen of a small file) runs here.
    // A GPU load calls the driver, which waits for the device's running kernels and holds
    // other threads' driver calls meanwhile: it runs while cora's streams are idle, here if
    // they are now, else on a cora thread once they are.
    if (dev->backend->load_waits())
      dev->run_when_idle(std::move(run), true, host_func_stream.get());
    else if (loads_inline(*dev, plan.part_size))
      run();
    else
      asio::post(host_pool(), std::move(run));
  }
};

}  // namespace

bool full_cpu_images() noexcept {
  static const bool full = [] {
    const char* v = std::getenv("CORA_CPU_FULL_IMAGES");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return full;
}

bool loads_inline(const device_state& dev, std::size_t image_bytes) noexcept {
  return dev.properties.backend == backend_kind::cpu && image_bytes <= inline_cpu_load_bytes;
}

void load_binary_file(std::shared_ptr<device_state> dev, const std::filesystem::path& path,
                      const load_options& options, file_load_callback done) {
  auto l = std::make_shared<file_load>();
  l->dev = std::move(dev);
  l->options = options;
  l->done = std::move(done);
  l->file_path = path;
  if (const host_func_scope* h = host_func_scope::current(); h && h->device == l->dev.get())
    l->host_func_stream = intrusive_ptr<stream_state>::share(const_cast<stream_state*>(h->stream));
  l->start();
}

namespace {

// Resolves kernels[index] of `b`: the module's function, checked against the metadata.
bool resolve(binary_state& b, std::size_t index, std::error_code& ec, std::string& message) {
  auto module = b.ensure_loaded(ec, message);
  if (ec) return false;
  const auto& want = b.kernels[index];
  backend::kernel_desc image;
  void* fn = module->find(want.name, image, ec, message);
  if (ec) return false;
  if (image.params_known) {
    if (image.params.size() != want.params.size()) {
      ec = make_error_code(errc::invalid_binary);
      message = "kernel '" + want.name + "' has " + std::to_string(image.params.size()) +
                " parameters in the image but " + std::to_string(want.params.size()) + " in its metadata";
      return false;
    }
    // Some backends know only offsets and sizes (CUDA) and guess alignments; the metadata has
    // the signature's, which fix the canonical layout. Sizes must agree, and alignments too
    // where the image's are exact (the CPU device). A guess (the largest power of two up to 16
    // dividing offset and size) is at least the real alignment, so a larger one in the
    // metadata is wrong too.
    const bool exact = b.device->properties.backend == backend_kind::cpu;
    for (std::size_t i = 0; i < want.params.size(); ++i) {
      const auto& have = image.params[i];
      const auto& meta = want.params[i];
      const bool align_wrong = exact ? have.align != meta.align : meta.align > have.align && have.align < 16;
      if (have.size != meta.size || align_wrong) {
        ec = make_error_code(errc::invalid_binary);
        message = "parameter " + std::to_string(i) + " of kernel '" + want.name + "' has " +
                  std::to_string(have.size) + " bytes in the image but " + std::to_string(meta.size) +
                  " in its metadata";
        if (have.size == meta.size)
          message = "parameter " + std::to_string(i) + " of kernel '" + want.name +
                    "' is aligned to " + std::to_string(have.align) + " in the image but " +
                    std::to_string(meta.align) + " in its metadata";
        return false;
      }
    }
  }
  auto& r = b.resolved[index];
  r.function = fn;
  r.params.clear();
  std::size_t end = 0;
  for (const auto& p : want.params) {
    const std::size_t off = next_param_offset(end, p.align);
    r.params.push_back({off, p.size, p.align, p.pointer});
    end = off + p.size;
  }
  r.args_size = align_up(end, 8);
  r.ready.store(true, std::memory_order_release);
  return true;
}

}  // namespace

std::shared_ptr<kernel_state> make_kernel(const std::shared_ptr<binary_state>& b, std::size_t index,
                                          std::error_code& ec) {
  auto& r = b->resolved[index];
  if (!r.ready.load(std::memory_order_acquire)) {
    // First lookups of any kernel of the binary take turns; later ones never lock.
    std::lock_guard lock(b->resolve_mutex);
    if (!r.ready.load(std::memory_order_acquire)) {
      std::string message;
      if (!resolve(*b, index, ec, message)) {
        set_error(ec, ec, message);
        return nullptr;
      }
    }
  }
  auto k = std::make_shared<kernel_state>();
  k->binary = b;
  k->desc = &b->kernels[index];
  k->function = r.function;
  k->params = r.params;
  k->args_size = r.args_size;
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

void* kernel::code_address() const noexcept {
  if (!s_) return nullptr;
  std::lock_guard lock(s_->binary->mutex);
  if (s_->binary->unloaded.load(std::memory_order_relaxed) || !s_->binary->module) return nullptr;
  return s_->binary->module->code_address(s_->function);
}

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

device_global binary::global(std::string_view name, std::error_code& ec) const {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty binary handle");
    return {};
  }
  if (s_->unloaded.load(std::memory_order_acquire)) {
    detail::set_error(ec, errc::binary_unloaded, "the binary was unloaded");
    return {};
  }
  if (name.empty() || name.find('\0') != std::string_view::npos) {
    detail::set_error(ec, errc::invalid_argument, "a global's name must be non-empty, without NUL characters");
    return {};
  }
  std::string message;
  auto module = s_->ensure_loaded(ec, message);
  if (ec) {
    if (!message.empty()) detail::set_error(ec, ec, std::move(message));
    return {};
  }
  device_global g;
  g.address = module->global(std::string(name), g.size, ec, message);
  if (ec) {
    detail::set_error(ec, ec, std::move(message));
    return {};
  }
  return g;
}

device_global binary::global(std::string_view name) const {
  std::error_code ec;
  auto g = global(name, ec);
  detail::throw_if(ec);
  return g;
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

binary& binary::operator=(const binary& other) noexcept {
  if (this != &other) {
    detail::handle_release here;
    s_ = other.s_;
  }
  return *this;
}

binary& binary::operator=(binary&& other) noexcept {
  if (this != &other) {
    detail::handle_release here;
    s_ = std::move(other.s_);
  }
  return *this;
}

binary::~binary() {
  detail::handle_release here;
  s_.reset();
}

void binary::unload(std::error_code& ec) {
  detail::handle_release here;  // declared first: `last` below goes within it
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
  last.reset();  // unloaded on a cora thread once launches in flight let go of it
  ec.clear();
}

void binary::unload() {
  std::error_code ec;
  unload(ec);
  detail::throw_if(ec);
}

bool binary::loaded() const noexcept { return s_ && !s_->unloaded.load(std::memory_order_acquire); }

void* binary::native_handle() const noexcept {
  if (!s_) return nullptr;
  std::lock_guard lock(s_->mutex);
  return s_->module ? s_->module->native_handle() : nullptr;
}

}  // namespace cora
