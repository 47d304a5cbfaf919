#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

#include <asio/error.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include "core/host_pool.hpp"
#include "core/state.hpp"

namespace cora::detail {

// ---------------------------------------------------------------------------------------------
// allocation records

alloc_table::~alloc_table() {
  // Records still here belong to handles that outlived their device's table (the process is
  // exiting, or a leak): nothing can free them any more. Each is deleted from the shard of
  // its base only (it may be in others too).
  for (unsigned i = 0; i < shard_count; ++i)
    for (auto& [a, r] : shards_[i].records)
      if (shard_of(a) == i) delete r;
}

void alloc_table::span_of(const alloc_record& r, unsigned& first, unsigned& n) noexcept {
  first = shard_of(r.base);
  const std::uintptr_t last = r.base + (r.size ? r.size - 1 : 0);
  const std::uintptr_t granules = (last >> granule_shift) - (r.base >> granule_shift) + 1;
  n = granules < shard_count ? static_cast<unsigned>(granules) : shard_count;
}

unsigned alloc_table::my_slot() noexcept {
  static std::atomic<unsigned> next{0};
  thread_local const unsigned slot = next.fetch_add(1, std::memory_order_relaxed) % reader_slots;
  return slot;
}

alloc_table::write_lock::write_lock(const shard& s) noexcept : s_(s) {
  for (const auto& slot : s_.slots) slot.mutex.lock();  // in order: writers never deadlock
}

alloc_table::write_lock::~write_lock() {
  for (auto it = s_.slots.rbegin(); it != s_.slots.rend(); ++it) it->mutex.unlock();
}

void alloc_table::insert(alloc_record* r) {
  unsigned first = 0, n = 0;
  span_of(*r, first, n);
  for (unsigned i = 0; i < n; ++i) {
    auto& sh = shards_[(first + i) % shard_count];
    write_lock lock(sh);
    sh.records[r->base] = r;
  }
}

alloc_record* alloc_table::drop(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto& sh = shards_[shard_of(a)];
  // A reader's lock is enough: the record cannot be erased while it is held, and of two drops
  // of the same pointer the flag lets one win.
  std::shared_lock lock(sh.slots[my_slot()].mutex);
  auto it = sh.records.find(a);
  if (it == sh.records.end()) return nullptr;
  bool expected = false;
  if (!it->second->dropped.compare_exchange_strong(expected, true, std::memory_order_acq_rel))
    return nullptr;
  return it->second;
}

void alloc_table::erase(alloc_record* r) noexcept {
  unsigned first = 0, n = 0;
  span_of(*r, first, n);
  for (unsigned i = 0; i < n; ++i) {
    auto& sh = shards_[(first + i) % shard_count];
    write_lock lock(sh);
    auto it = sh.records.find(r->base);
    if (it != sh.records.end() && it->second == r) sh.records.erase(it);
  }
}

bool alloc_table::find(const void* p, memory_region& out, memory_region::kind k, alloc_ref* ref) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto& sh = shards_[shard_of(a)];
  std::shared_lock lock(sh.slots[my_slot()].mutex);
  auto it = sh.records.upper_bound(a);
  if (it == sh.records.begin()) return false;
  --it;
  alloc_record* r = it->second;
  if (a >= r->base + r->size) return false;
  out = {k, k == memory_region::kind::device ? r->owner : nullptr, r->base, r->size, r};
  if (r->dropped.load(std::memory_order_acquire)) {
    out.record = nullptr;  // freed by its handle; in-flight work alone keeps it
    return true;
  }
  if (ref) {
    // The record stays in the table, hence alive, while the lock is held; a count of zero
    // means its last reference is going right now.
    std::uint32_t n = r->refs.load(std::memory_order_relaxed);
    do {
      if (n == 0) {
        out.record = nullptr;
        return true;
      }
    } while (!r->refs.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel));
    *ref = alloc_ref(r);
  }
  return true;
}

void release_allocation(alloc_record* r) noexcept {
  if (r->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  r->owner->free_record(r);
}

// ---------------------------------------------------------------------------------------------
// runtime_core: pinned host memory of every device

void runtime_core::add_pinned(void* p, std::size_t size, device_state* owner) {
  auto* r = new alloc_record;
  r->base = reinterpret_cast<std::uintptr_t>(p);
  r->size = size;
  r->owner = owner;
  r->from = alloc_record::origin::pinned_direct;
  owner->add_pinned_in_use(static_cast<std::ptrdiff_t>(size));
  pinned.insert(r);
}

bool runtime_core::find_pinned(const void* p, memory_region& out, alloc_ref* ref) const {
  return pinned.find(p, out, memory_region::kind::pinned_host, ref);
}

// ---------------------------------------------------------------------------------------------
// pinned slab pool

/// Large pinned slabs, sub-allocated best fit. The backend's pinned allocation (which may wait
/// for the device on CUDA) runs when the pool grows, and ahead of need on the host pool's
/// threads, so that an allocation from a warm pool never calls the driver.
struct device_state::pinned_pool {
  static constexpr std::size_t granule = 256;

  struct block {
    std::size_t size;
    std::size_t slab;  // index into slabs: blocks of different slabs never merge
  };
  struct slab {
    std::byte* base = nullptr;
    std::size_t size = 0;
    std::size_t used = 0;
  };

  std::mutex mutex;
  std::vector<slab> slabs;
  std::map<std::uintptr_t, block> free;           // address ordered
  std::multimap<std::size_t, std::uintptr_t> by_size;
  std::map<std::uintptr_t, std::size_t> used;    // address -> slab index
  std::size_t reserved = 0;
  std::size_t free_bytes = 0;
  bool growing = false;

  // Freed blocks of up to 1 MiB kept by size, under a lock of their own: the best fit above
  // costs several tree updates (and their node allocations) under the pool's lock, and the
  // kernel server's workers, which allocate and free per request, queued on it (H200). A kept
  // block stays "used" for the slabs; it goes back to them when an allocation finds nothing
  // that fits, and on trim.
  static constexpr std::size_t max_kept_block = std::size_t{1} << 20;
  static constexpr std::size_t max_kept_bytes = std::size_t{32} << 20;
  std::mutex kept_mutex;
  std::unordered_map<std::size_t, std::vector<std::uintptr_t>> kept;
  std::atomic<std::size_t> kept_bytes{0};  // changed under kept_mutex; read without it

  std::uintptr_t take_kept(std::size_t size) {
    if (size > max_kept_block) return 0;
    std::lock_guard lock(kept_mutex);
    auto it = kept.find(size);
    if (it == kept.end() || it->second.empty()) return 0;
    const std::uintptr_t a = it->second.back();
    it->second.pop_back();
    kept_bytes.store(kept_bytes.load(std::memory_order_relaxed) - size, std::memory_order_relaxed);
    return a;
  }
  bool keep(std::uintptr_t a, std::size_t size) {
    if (size > max_kept_block) return false;
    std::lock_guard lock(kept_mutex);
    const std::size_t now = kept_bytes.load(std::memory_order_relaxed);
    if (now + size > max_kept_bytes) return false;
    kept[size].push_back(a);  // the vector keeps its capacity: a warm cache allocates nothing
    kept_bytes.store(now + size, std::memory_order_relaxed);
    return true;
  }
  // Gives every kept block back to the slabs. Call with `mutex` held.
  void return_kept_locked() {
    std::unordered_map<std::size_t, std::vector<std::uintptr_t>> out;
    {
      std::lock_guard lock(kept_mutex);
      for (auto& [size, blocks] : kept) {
        if (blocks.empty()) continue;
        out[size].swap(blocks);
      }
      kept_bytes.store(0, std::memory_order_relaxed);
    }
    for (auto& [size, blocks] : out)
      for (std::uintptr_t a : blocks) give_back(a, size);
  }

  void insert_free(std::uintptr_t a, std::size_t size, std::size_t s) {
    free.emplace(a, block{size, s});
    by_size.emplace(size, a);
    free_bytes += size;
  }
  void erase_free(std::map<std::uintptr_t, block>::iterator it) {
    for (auto [b, e] = by_size.equal_range(it->second.size); b != e; ++b)
      if (b->second == it->first) {
        by_size.erase(b);
        break;
      }
    free_bytes -= it->second.size;
    free.erase(it);
  }
  void add_slab(std::byte* base, std::size_t size) {
    slabs.push_back({base, size, 0});
    reserved += size;
    insert_free(reinterpret_cast<std::uintptr_t>(base), size, slabs.size() - 1);
  }
  // Takes `size` bytes (a multiple of granule) from the free lists; 0 when nothing fits.
  std::uintptr_t take(std::size_t size) {
    auto it = by_size.lower_bound(size);
    if (it == by_size.end()) return 0;
    const std::uintptr_t a = it->second;
    auto f = free.find(a);
    const block b = f->second;
    erase_free(f);
    if (b.size > size) insert_free(a + size, b.size - size, b.slab);
    used.emplace(a, b.slab);
    slabs[b.slab].used += size;
    return a;
  }
  void give_back(std::uintptr_t a, std::size_t size) {
    auto u = used.find(a);
    if (u == used.end()) return;
    const std::size_t s = u->second;
    used.erase(u);
    slabs[s].used -= size;
    auto next = free.lower_bound(a);
    if (next != free.end() && next->first == a + size && next->second.slab == s) {
      size += next->second.size;
      auto n = next++;
      erase_free(n);
    }
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->second.slab == s && prev->first + prev->second.size == a) {
        a = prev->first;
        size += prev->second.size;
        erase_free(prev);
      }
    }
    insert_free(a, size, s);
  }
};

// ---------------------------------------------------------------------------------------------
// device_state

device_state::device_state(std::shared_ptr<runtime_core> rt, std::unique_ptr<backend::device> dev,
                           std::size_t idx)
    : runtime(std::move(rt)), backend(std::move(dev)), index(idx), pinned_pool_(std::make_unique<pinned_pool>()) {
  const auto& info = backend->info();
  properties.name = info.name;
  properties.backend = info.backend == "cuda" ? backend_kind::cuda : backend_kind::cpu;
  properties.ordinal = info.ordinal;
  properties.compute_units = info.compute_units;
  properties.total_memory = info.total_memory;
  properties.max_grid = info.max_grid;
  properties.max_block = info.max_block;
  properties.max_threads_per_block = info.max_threads_per_block;
  properties.max_shared_bytes = info.max_shared_bytes;
  properties.compute_major = info.compute_major;
  properties.compute_minor = info.compute_minor;
  properties.driver = info.driver;
  properties.pci_bus_id = info.pci_bus_id;
  properties.uuid = info.uuid;
  backend->set_pool_release_threshold(runtime->options.pool_release_threshold);
  std::lock_guard lock(runtime->devices_mutex);
  runtime->devices.push_back(this);
}

device_state::~device_state() {
  {
    std::lock_guard lock(runtime->devices_mutex);
    auto& d = runtime->devices;
    d.erase(std::remove(d.begin(), d.end(), this), d.end());
  }
  shutdown();
  // No module is queued for its unload here: a queued one keeps a drain scheduled, and the
  // drain holds the device until the queue is empty.
  // Nothing refers to the device any more: no handle, stream or op holds pinned memory.
  if (pinned_pool_) {
    std::lock_guard lock(pinned_pool_->mutex);
    for (auto& sl : pinned_pool_->slabs)
      if (sl.base) backend->free_host(sl.base);
    pinned_pool_->slabs.clear();
  }
}

void device_state::add_allocation(void* p, std::size_t size, bool counted) {
  auto* r = new alloc_record;
  r->base = reinterpret_cast<std::uintptr_t>(p);
  r->size = size;
  r->owner = this;
  r->from = alloc_record::origin::device;
  if (!counted) in_use_.fetch_add(size, std::memory_order_relaxed);
  allocations_.insert(r);
}

bool device_state::count_bytes(std::size_t bytes, std::size_t limit) noexcept {
  std::size_t now = in_use_.load(std::memory_order_relaxed);
  do {
    if (limit != 0 && (bytes > limit || now > limit - bytes)) return false;
  } while (!in_use_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  return true;
}

void device_state::uncount_bytes(std::size_t bytes) noexcept {
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

bool device_state::remove_allocation(void* p) {
  alloc_record* r = allocations_.drop(p);
  if (!r) return false;
  release_allocation(r);  // the handle's reference
  return true;
}

bool device_state::find_allocation(const void* p, memory_region& out, alloc_ref* ref) const {
  return allocations_.find(p, out, memory_region::kind::device, ref);
}

std::size_t device_state::memory_in_use() const noexcept {
  return in_use_.load(std::memory_order_relaxed);
}

void device_state::free_record(alloc_record* r) noexcept {
  void* p = reinterpret_cast<void*>(r->base);
  switch (r->from) {
    case alloc_record::origin::device:
      allocations_.erase(r);
      // Stream-ordered where the backend has it (CUDA: cuMemFreeAsync on cora's memory
      // stream): never waits for the device.
      backend->free(p, r->size);
      in_use_.fetch_sub(r->size, std::memory_order_relaxed);
      break;
    case alloc_record::origin::pinned_direct:
      runtime->pinned.erase(r);
      backend->free_host(p);
      add_pinned_in_use(-static_cast<std::ptrdiff_t>(r->size));
      break;
    case alloc_record::origin::pinned_pool: {
      runtime->pinned.erase(r);
      if (!pinned_pool_->keep(r->base, r->size)) {
        std::lock_guard lock(pinned_pool_->mutex);
        pinned_pool_->give_back(r->base, r->size);
      }
      add_pinned_in_use(-static_cast<std::ptrdiff_t>(r->size));
      break;
    }
  }
  delete r;
}

namespace {
constexpr std::size_t default_slab = std::size_t{4} << 20;
constexpr std::size_t slab_round = std::size_t{2} << 20;
}  // namespace

void device_state::grow_pinned_slab() {
  auto& pl = *pinned_pool_;
  std::error_code e;
  void* p = shut_down.load(std::memory_order_acquire) ? nullptr : backend->alloc_host(default_slab, e);
  std::lock_guard lock(pl.mutex);
  pl.reserved -= default_slab;
  if (p) pl.add_slab(static_cast<std::byte*>(p), default_slab);
  pl.growing = false;
}

void* device_state::pinned_alloc(std::size_t bytes, std::error_code& ec) {
  auto& pool = *pinned_pool_;
  // Rounded up to granules and then to slabs: a size near SIZE_MAX must not wrap to a small one.
  if (bytes > std::numeric_limits<std::size_t>::max() - slab_round) {
    ec = make_error_code(errc::out_of_memory);
    return nullptr;
  }
  const std::size_t size = (bytes + pinned_pool::granule - 1) / pinned_pool::granule * pinned_pool::granule;
  const std::size_t limit = runtime->options.pinned_memory_limit;
  std::uintptr_t a = pool.take_kept(size);
  bool prefetch = false;
  if (!a) {
    std::lock_guard lock(pool.mutex);
    a = pool.take(size);
    if (!a && pool.kept_bytes.load(std::memory_order_relaxed) != 0) {
      pool.return_kept_locked();  // kept blocks of other sizes may make room
      a = pool.take(size);
    }
    if (a) {
      // Running low: grow ahead of need on a cora thread, so the next allocations find room.
      if (pool.free_bytes < default_slab / 2 && !pool.growing &&
          (limit == 0 || pool.reserved + default_slab <= limit)) {
        pool.growing = true;
        pool.reserved += default_slab;  // counted from now, against the limit
        prefetch = true;
      }
    }
  }
  if (!a) {
    // Nothing fits: a slab of its own size (at least the default), allocated now.
    const std::size_t slab = std::max(default_slab, (size + slab_round - 1) / slab_round * slab_round);
    {
      // Reserved before the backend allocates, so concurrent growth never passes the limit.
      std::lock_guard lock(pool.mutex);
      if (limit != 0 && pool.reserved + slab > limit) {
        ec = make_error_code(errc::out_of_memory);
        return nullptr;
      }
      pool.reserved += slab;
    }
    void* p = backend->alloc_host(slab, ec);
    std::lock_guard lock(pool.mutex);
    pool.reserved -= slab;
    if (ec) return nullptr;
    pool.add_slab(static_cast<std::byte*>(p), slab);
    a = pool.take(size);
    if (!a) {
      ec = make_error_code(errc::out_of_memory);
      return nullptr;
    }
  }
  if (prefetch) {
    try {
      asio::post(device_wait_pool(), [self = shared_from_this()] { self->grow_pinned_slab(); });
    } catch (...) {
      std::lock_guard lock(pool.mutex);
      pool.reserved -= default_slab;
      pool.growing = false;
    }
  }
  auto* r = new alloc_record;
  r->base = a;
  r->size = size;
  r->owner = this;
  r->from = alloc_record::origin::pinned_pool;
  add_pinned_in_use(static_cast<std::ptrdiff_t>(size));
  runtime->pinned.insert(r);
  ec.clear();
  return reinterpret_cast<void*>(a);
}

std::size_t device_state::pinned_reserved() const noexcept {
  std::lock_guard lock(pinned_pool_->mutex);
  return pinned_pool_->reserved;
}

memory_region device_state::classify(const void* p, std::size_t bytes, std::error_code& ec) const {
  return classify(p, bytes, ec, nullptr);
}

memory_region device_state::classify(const void* p, std::size_t bytes, std::error_code& ec,
                                     alloc_ref* keep) const {
  memory_region r;
  if (!p) {
    set_error(ec, errc::invalid_pointer, "null pointer");
    return r;
  }
  // This device, then pinned host memory (every copy names some), then the other devices: the
  // last takes the runtime's device list lock, which every thread's ops would share.
  bool found = find_allocation(p, r, keep) || runtime->find_pinned(p, r, keep);
  if (!found) {
    std::lock_guard lock(runtime->devices_mutex);
    for (device_state* d : runtime->devices)
      if (d != this && d->find_allocation(p, r, keep)) {
        found = true;
        break;
      }
  }
  if (found && !r.record) {
    set_error(ec, errc::invalid_pointer,
              "pointer lies in an allocation that was freed (in-flight work may still use it)");
    return r;
  }
  if (!found) {
    bool reserved = backend->owns_address(p);
    if (!reserved) {
      std::lock_guard lock(runtime->devices_mutex);
      for (device_state* d : runtime->devices) reserved |= d->backend->owns_address(p);
    }
    if (reserved) {
      set_error(ec, errc::invalid_pointer,
                "pointer lies in device memory but in no live allocation (freed?)");
      return r;
    }
    // Memory cora did not allocate: the backend may know it (another library's device,
    // managed or registered host memory).
    const backend::foreign_memory f = backend->describe_pointer(p);
    if (f.k == backend::foreign_memory::kind::unknown) {
      ec.clear();
      return {memory_region::kind::pageable_host, nullptr, reinterpret_cast<std::uintptr_t>(p), bytes};
    }
    r.k = f.k == backend::foreign_memory::kind::host ? memory_region::kind::pinned_host
                                                      : memory_region::kind::device;
    r.device = r.k == memory_region::kind::device ? const_cast<device_state*>(this) : nullptr;
    if (f.size) {
      r.base = f.base;
      r.size = f.size;
    } else {
      // The driver reports no bounds: the range is taken as given.
      r.base = reinterpret_cast<std::uintptr_t>(p);
      r.size = bytes;
    }
    r.record = nullptr;
  }
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > r.base + r.size - a) {
    if (keep) keep->reset();
    set_error(ec, errc::out_of_range,
              "range of " + std::to_string(bytes) + " bytes runs " +
                  std::to_string(bytes - (r.base + r.size - a)) +
                  " bytes past the end of its allocation");
    return r;
  }
  ec.clear();
  return r;
}

void device_state::trim_memory(std::size_t keep) noexcept {
  backend->trim(keep);
  // Wholly free pinned slabs go back on a cora thread (the driver's free may wait).
  std::vector<std::byte*> release;
  {
    std::lock_guard lock(pinned_pool_->mutex);
    auto& pool = *pinned_pool_;
    pool.return_kept_locked();
    for (std::size_t i = 0; i < pool.slabs.size(); ++i) {
      auto& sl = pool.slabs[i];
      if (!sl.base || sl.used != 0) continue;
      auto it = pool.free.find(reinterpret_cast<std::uintptr_t>(sl.base));
      if (it == pool.free.end() || it->second.size != sl.size) continue;
      pool.erase_free(it);
      pool.reserved -= sl.size;
      release.push_back(sl.base);
      sl = {};  // a tombstone: slab indices stay valid
    }
  }
  if (release.empty()) return;
  try {
    asio::post(device_wait_pool(), [self = shared_from_this(), release = std::move(release)] {
      for (std::byte* p : release) self->backend->free_host(p);
    });
  } catch (...) {
  }
}

namespace {
// Created ahead on a cora thread: a CUDA context creates its first few dozen streams at once,
// but later ones may wait for running kernels.
constexpr std::size_t stream_pool_size = 32;
}  // namespace

backend::marker_wakeup device_state::marker_wakeup() const noexcept {
  return runtime->options.completion == completion_policy::callback ? backend::marker_wakeup::host_callback
                                                                    : backend::marker_wakeup::poll;
}

std::unique_ptr<backend::stream> device_state::take_stream(int priority, std::error_code& ec) {
  const auto wakeup = marker_wakeup();
  if (!backend->pool_streams() || priority != 0) return backend->create_stream(priority, wakeup, ec);
  if (auto h = backend->health()) {
    ec = h;
    return nullptr;
  }
  // The pool is made when the device opens and refilled by drained streams only: a CUDA
  // context that creates streams beyond its first few dozen waits for running kernels, and
  // while it waits the driver holds other threads' calls too, so no cora thread creates
  // streams in the background once work may run.
  std::unique_ptr<backend::stream> s;
  {
    std::lock_guard lock(spare_mutex_);
    if (!spare_streams_.empty()) {
      s = std::move(spare_streams_.back());
      spare_streams_.pop_back();
    }
  }
  if (s) {
    ec.clear();
    return s;
  }
  return backend->create_stream(priority, wakeup, ec);  // the pool is empty: the first stream
}

void device_state::warm_up() noexcept {
  // The first pinned slab (within the limit) and the pool of streams, both on a cora thread.
  bool grow = false;
  {
    std::lock_guard lock(pinned_pool_->mutex);
    const std::size_t limit = runtime->options.pinned_memory_limit;
    if (!pinned_pool_->growing && (limit == 0 || default_slab <= limit)) {
      pinned_pool_->growing = true;
      pinned_pool_->reserved += default_slab;
      grow = true;
    }
  }
  const bool streams = backend->pool_streams();
  if (!grow && !streams) return;
  try {
    asio::post(device_wait_pool(), [self = shared_from_this(), grow, streams] {
      if (grow) self->grow_pinned_slab();
      if (streams) self->fill_stream_pool();
    });
  } catch (...) {
    if (!grow) return;
    std::lock_guard lock(pinned_pool_->mutex);
    pinned_pool_->reserved -= default_slab;
    pinned_pool_->growing = false;
  }
}

void device_state::fill_stream_pool(std::chrono::milliseconds retry) noexcept {
  const auto wakeup = marker_wakeup();
  for (;;) {
    {
      std::lock_guard lock(spare_mutex_);
      if (spare_streams_.size() >= stream_pool_size || shut_down.load(std::memory_order_acquire)) return;
    }
    std::error_code ec;
    std::unique_ptr<backend::stream> s;
    try {
      // Only while cora's streams are idle, with their submission locks held: once work runs,
      // a created stream may wait for it, and the driver holds other threads' calls meanwhile
      // (see take_stream). Otherwise later, on a timer of this cora pool; not through
      // run_when_idle, which runs its function anyway once its tries are spent.
      if (!streams_idle() || !run_while_idle([&] { s = backend->create_stream(0, wakeup, ec); })) {
        auto timer = std::make_shared<asio::steady_timer>(device_wait_pool().get_executor(), retry);
        const auto next = std::min(retry * 2, std::chrono::milliseconds(100));
        timer->async_wait([self = shared_from_this(), timer, next](const std::error_code&) {
          self->fill_stream_pool(next);
        });
        return;
      }
    } catch (...) {
      return;
    }
    if (ec || !s) return;
    std::lock_guard lock(spare_mutex_);
    try {
      spare_streams_.push_back(std::move(s));
    } catch (...) {
      return;
    }
  }
}

void device_state::retire_stream(std::unique_ptr<backend::stream> s, bool reusable) noexcept {
  if (!s) return;
  // An adopted stream belongs to its library, which may destroy it as soon as cora's handle
  // is gone: let go of it now (that waits for nothing).
  if (s->borrowed()) return;
  // A drained stream serves again: creating streams may wait for the device once a context
  // has a few dozen, and a warm pool makes make_stream cheap.
  if (reusable && !shut_down.load(std::memory_order_acquire)) {
    std::lock_guard lock(spare_mutex_);
    if (spare_streams_.size() < stream_pool_size && s->recycle()) {
      try {
        spare_streams_.push_back(std::move(s));
        return;
      } catch (...) {
      }
    }
  }
  try {
    // The handler owns the stream; should posting fail, it is destroyed here instead.
    asio::post(device_wait_pool(), [self = shared_from_this(), s = std::shared_ptr<backend::stream>(std::move(s))]() mutable {
      s.reset();
    });
  } catch (...) {
  }
}

// ---------------------------------------------------------------------------------------------
// module unloads

namespace {
thread_local unsigned handle_releases = 0;
}  // namespace

handle_release::handle_release() noexcept { ++handle_releases; }
handle_release::~handle_release() { --handle_releases; }
bool handle_release::active() noexcept { return handle_releases > 0; }

std::shared_ptr<backend::module> device_state::own_module(std::unique_ptr<backend::module> m) {
  std::weak_ptr<device_state> owner = weak_from_this();
  return std::shared_ptr<backend::module>(m.release(), [owner](backend::module* raw) noexcept {
    std::unique_ptr<backend::module> last(raw);
    // A user's handle let it go: unloaded here when that waits for nothing, so that the
    // user's next load on this thread finds the driver's state where the unload left it
    // (docs/architecture.md, "Memory and resources").
    if (handle_release::active()) {
      if (auto dev = owner.lock(); dev && dev->unload_here(last)) {
        // The device's last reference must not go on this thread either (see below).
        if (dev.use_count() == 1) {
          try {
            asio::post(device_wait_pool(), [dev = std::move(dev)] {});
          } catch (...) {
          }
        }
        return;
      }
    }
    // Handed to a cora thread first: the device's last reference may go with the module, and
    // neither its destruction nor the unload may run inside whatever dropped the module (a
    // poll step, a completion handler, a user's thread while the device is busy).
    try {
      asio::post(device_wait_pool(), [owner, m = std::move(last)]() mutable {
        auto dev = owner.lock();
        if (dev && dev->backend->unload_waits())
          dev->unload_later(std::move(m));
        else
          m.reset();  // unloading does not wait for the device, or the device is gone
      });
    } catch (...) {
      // No memory to post: unload here rather than never.
    }
  });
}

bool device_state::unload_here(std::unique_ptr<backend::module>& m) noexcept {
  // Not on the engine thread: an unload there would hold up every other wait's completion.
  if (shut_down.load(std::memory_order_acquire) || engine::get().on_engine_thread()) return false;
  if (!backend->unload_waits()) {
    m.reset();
    return true;
  }
  try {
    // On an idle device, with every submission lock held, the unload waits for no cora kernel.
    return streams_idle() && run_while_idle([&m] { m.reset(); });
  } catch (...) {
    return false;
  }
}

void device_state::unload_later(std::unique_ptr<backend::module> m) noexcept {
  if (!m) return;
  try {
    std::lock_guard lock(unload_mutex_);
    unloads_.push_back({std::move(m), clock::now()});
    if (unload_scheduled_) return;
    unload_scheduled_ = true;
  } catch (...) {
    return;  // out of memory: `m`, if still here, unloads on this cora thread
  }
  schedule_unloads(std::chrono::microseconds(0));
}

std::unique_ptr<backend::module> device_state::take_oldest_unload() noexcept {
  std::lock_guard lock(unload_mutex_);
  if (unloads_.empty()) return nullptr;
  auto m = std::move(unloads_.front().module);
  unloads_.pop_front();
  return m;
}

std::size_t device_state::unloads_pending() const noexcept {
  std::lock_guard lock(unload_mutex_);
  return unloads_.size();
}

void device_state::schedule_unloads(std::chrono::microseconds delay) noexcept {
  try {
    auto timer = std::make_shared<asio::steady_timer>(device_wait_pool().get_executor(), delay);
    timer->async_wait([self = shared_from_this(), timer](const std::error_code&) { self->drain_unloads(); });
  } catch (...) {
    // No timer: unload now, on this cora thread, rather than never.
    std::deque<pending_unload> all;
    {
      std::lock_guard lock(unload_mutex_);
      all.swap(unloads_);
      unload_scheduled_ = false;
    }
  }
}

bool device_state::streams_idle() {
  for (auto& s : streams())
    if (!s->idle_observed() && !s->query_idle()) return false;
  return true;
}

bool device_state::run_while_idle(const std::function<void()>& fn) {
  // Every stream's submission lock, taken without waiting (a holder may be submitting: then
  // this round gives way). Holding them all, and the list's lock so that no new stream
  // appears, no cora work can start: a device seen idle stays idle for cora's part while `fn`
  // runs. Raw pointers: a listed stream's destructor has drained it and needs the list's lock
  // (remove_stream) to finish, so it is still whole until that lock is let go.
  std::lock_guard list(streams_mutex_);
  std::vector<stream_state*> held;
  held.reserve(streams_.size());
  bool idle = true;
  for (stream_state* s : streams_) {
    if (!s->enqueue_mutex().try_lock()) {
      idle = false;
      break;
    }
    held.push_back(s);
    if (!s->idle_locked()) {
      idle = false;
      break;
    }
  }
  try {
    if (idle) fn();
  } catch (...) {
    for (stream_state* s : held) s->enqueue_mutex().unlock();
    throw;
  }
  for (stream_state* s : held) s->enqueue_mutex().unlock();
  return idle;
}

bool device_state::unload_one_while_idle() {
  // The unload: on an idle device it waits for no kernel.
  return run_while_idle([this] { take_oldest_unload().reset(); });
}

namespace {

/// run_when_idle's state: first a wait for the work in flight at the call (one node per
/// stream), then tries on a cora thread until the device is seen idle.
struct idle_gate {
  struct node : wait_node {
    idle_gate* owner = nullptr;
  };
  idle_gate(std::shared_ptr<device_state> d, std::function<void()> f,
            std::vector<intrusive_ptr<stream_state>> s)
      : dev(std::move(d)), fn(std::move(f)), streams(std::move(s)), nodes(streams.size()),
        remaining(streams.size() + 1) {}
  std::shared_ptr<device_state> dev;
  std::function<void()> fn;
  std::vector<intrusive_ptr<stream_state>> streams;
  std::vector<node> nodes;
  std::atomic<std::size_t> remaining;
  int tries = 0;
  std::unique_ptr<asio::steady_timer> timer;

  // Whatever the result of the awaited work (a fault is its stream's to report), the gate
  // opens; on the detecting thread, so the tries go to a cora thread.
  static void on_complete(wait_node& n, bool) noexcept { static_cast<node&>(n).owner->arrive(); }
  void arrive() noexcept {
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    streams.clear();
    try {
      asio::post(host_pool(), [this] { attempt(); });
    } catch (...) {
      finish(true);  // no memory to post: run here rather than never
    }
  }
  void attempt() noexcept {
    // After shutdown fn runs at once and reports it.
    if (dev->shut_down.load(std::memory_order_acquire)) return finish(true);
    bool ran = false;
    try {
      ran = dev->streams_idle() && dev->run_while_idle(fn);
    } catch (...) {
    }
    if (ran) return finish(false);
    if (++tries >= device_state::idle_gate_tries) return finish(true);
    try {
      if (!timer) timer = std::make_unique<asio::steady_timer>(host_pool().get_executor());
      timer->expires_after(std::chrono::milliseconds(1));
      timer->async_wait([this](const std::error_code&) { attempt(); });
    } catch (...) {
      finish(true);
    }
  }
  void finish(bool run) noexcept {
    if (run) fn();
    delete this;
  }
};

}  // namespace

void device_state::run_when_idle(std::function<void()> fn, bool here, const stream_state* except) {
  if (here && streams_idle() && run_while_idle(fn)) return;
  auto list = streams();
  auto* gate = new idle_gate(shared_from_this(), std::move(fn), std::move(list));
  for (std::size_t i = 0; i < gate->streams.size(); ++i) {
    auto& n = gate->nodes[i];
    n.owner = gate;
    n.on_complete = &idle_gate::on_complete;
    stream_state& s = *gate->streams[i];
    if (&s == except || !s.arm(n, s.last_position(), nullptr)) idle_gate::on_complete(n, false);
  }
  gate->arrive();
}

void device_state::drain_unloads() noexcept {
  // cuModuleUnload waits for every kernel running on the device and holds other threads'
  // launches and copies while it waits (seen on the H200: a 4 KiB copy behind queued unloads
  // took a whole kernel's time). So a module unloads only while cora's streams are idle, with
  // their submission locks held so that no launch starts meanwhile; one module per round, so
  // a submitter waits for one unload at most. A long or old queue unloads anyway.
  for (;;) {
    bool force = false;
    {
      std::lock_guard lock(unload_mutex_);
      if (unloads_.empty()) {
        unload_scheduled_ = false;
        return;
      }
      force = shut_down.load(std::memory_order_acquire) || unloads_.size() > unload_defer_count ||
              clock::now() - unloads_.front().since > unload_defer_age;
    }
    if (force) {
      take_oldest_unload().reset();
      continue;
    }
    bool done = false;
    try {
      // Polled first without the locks: the markers of finished work are observed.
      done = streams_idle() && unload_one_while_idle();
    } catch (...) {
    }
    if (!done) {
      schedule_unloads(std::chrono::milliseconds(1));
      return;
    }
  }
}

void device_state::add_stream(stream_state* s) {
  std::lock_guard lock(streams_mutex_);
  streams_.insert(s);
}

void device_state::remove_stream(stream_state* s) {
  std::lock_guard lock(streams_mutex_);
  streams_.erase(s);
}

std::vector<intrusive_ptr<stream_state>> device_state::streams() {
  std::vector<intrusive_ptr<stream_state>> out;
  std::lock_guard lock(streams_mutex_);
  for (stream_state* s : streams_) {
    // A stream whose last reference is being dropped right now may still be listed: skip it.
    if (s->try_add_ref()) out.push_back(intrusive_ptr<stream_state>::adopt(s));
  }
  return out;
}

void device_state::shutdown() noexcept {
  if (shut_down.exchange(true)) return;
  // Every armed wait completes now with operation_aborted, delivered to its own executor (or
  // cora's handler thread), never inline on the thread that destroys the runtime.
  auto streams = this->streams();
  for (auto& s : streams) s->abort_waits(asio::error::operation_aborted);
  streams.clear();
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard lock(hooks_mutex_);
    hooks.swap(shutdown_hooks_);
  }
  for (auto& h : hooks) h();
  // The backend stops its own threads. Work it can stop (the CPU device's kernels and queued
  // ops) completes with runtime_shut_down; work it cannot (GPU kernels) runs on, and what it
  // uses stays alive with the streams, which the engine thread releases once they are idle.
  // Nothing here waits for the device.
  {
    std::vector<std::unique_ptr<backend::stream>> spare;
    {
      std::lock_guard lock(spare_mutex_);
      spare.swap(spare_streams_);
    }
  }
  backend->shutdown();
}

void device_state::on_shutdown(std::function<void()> fn) {
  std::lock_guard lock(hooks_mutex_);
  shutdown_hooks_.push_back(std::move(fn));
}

}  // namespace cora::detail
