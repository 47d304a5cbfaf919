#include "core/staging_pool.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/state.hpp"
#include "io/io_queue.hpp"

namespace cora::detail::io {

namespace {

// Per device: enough for a few reads with the default options (4 MiB x 4).
constexpr std::size_t cache_limit = std::size_t{64} << 20;

std::atomic<std::size_t> in_use{0};

struct cache {
  std::mutex mutex;
  std::unordered_map<device_state*, std::vector<staging_buffer>> free;  // by device
};

cache& the_cache() {
  static auto* c = new cache();  // never destroyed: reads may end while the process exits
  return *c;
}

std::size_t bytes_of(const std::vector<staging_buffer>& v) {
  std::size_t n = 0;
  for (const auto& b : v) n += b.size;
  return n;
}

void release(device_state& dev, const staging_buffer& b) noexcept {
  if (b.queue) b.queue->unregister_buffer(b.reg);
  free_host_memory(dev, b.alloc);
}

}  // namespace

staging_buffer take_staging(device_state& dev, std::size_t size, io_queue* register_with,
                            std::error_code& ec) {
  ec.clear();
  auto& c = the_cache();
  staging_buffer b;
  bool first_use = false;
  {
    std::lock_guard lock(c.mutex);
    auto [it, inserted] = c.free.try_emplace(&dev);
    first_use = inserted;
    auto& v = it->second;
    // The smallest cached buffer that fits, preferring one registered with the wanted queue.
    auto best = v.end();
    for (auto i = v.begin(); i != v.end(); ++i) {
      if (i->size < size) continue;
      const bool reg_ok = !register_with || (i->queue == register_with && i->reg >= 0);
      const bool best_reg_ok =
          best != v.end() && (!register_with || (best->queue == register_with && best->reg >= 0));
      if (best == v.end() || (reg_ok && !best_reg_ok) ||
          (reg_ok == best_reg_ok && i->size < best->size))
        best = i;
    }
    if (best != v.end()) {
      b = *best;
      v.erase(best);
    }
  }
  if (first_use) {
    // The cached buffers go before the backend stops.
    dev.on_shutdown([&dev] {
      auto& cc = the_cache();
      std::vector<staging_buffer> v;
      {
        std::lock_guard lock(cc.mutex);
        auto it = cc.free.find(&dev);
        if (it == cc.free.end()) return;
        v = std::move(it->second);
        cc.free.erase(it);
      }
      for (const auto& x : v) release(dev, x);
    });
  }
  if (!b.alloc) {
    // Extra room so that `host` can start on an O_DIRECT boundary whatever the allocator gives.
    const std::size_t bytes = size + direct_alignment;
    void* p = dev.backend->alloc_host(bytes, ec);
    if (ec) return {};
    dev.runtime->add_pinned(p, bytes, &dev);
    b.alloc = static_cast<std::byte*>(p);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    b.host = b.alloc + ((a + direct_alignment - 1) / direct_alignment * direct_alignment - a);
    b.size = size;
  }
  if (register_with && (b.queue != register_with || b.reg < 0)) {
    if (b.queue) b.queue->unregister_buffer(b.reg);
    b.queue = register_with;
    b.reg = register_with->register_buffer(b.host, b.size);
  }
  in_use.fetch_add(b.size, std::memory_order_relaxed);
  return b;
}

void give_back_staging(device_state& dev, staging_buffer b) noexcept {
  in_use.fetch_sub(b.size, std::memory_order_relaxed);
  auto& c = the_cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free.find(&dev);
    if (it != c.free.end() && !dev.shut_down.load(std::memory_order_acquire) &&
        bytes_of(it->second) + b.size <= cache_limit) {
      try {
        it->second.push_back(b);
        return;
      } catch (...) {
      }
    }
  }
  release(dev, b);
}

std::size_t staging_bytes_in_use() noexcept { return in_use.load(std::memory_order_relaxed); }

}  // namespace cora::detail::io
