#include <algorithm>

#include "core/state.hpp"
#include "cora/detail/arg_layout.hpp"

namespace cora::detail {

namespace {
constexpr std::size_t chunk_size = 64 * 1024;
}

staging_arena::slice staging_arena::take(device_state& dev, std::size_t bytes, std::uint64_t seq,
                                         std::uint64_t completed, std::error_code& ec) {
  const std::size_t need = align_up(bytes, 256);
  // Reuse the newest chunk while it has room; recycle the oldest once its last user finished.
  if (!chunks_.empty() && chunks_.back().size - chunks_.back().used >= need) {
    auto& c = chunks_.back();
    slice s{c.host + c.used, c.device + c.used};
    c.used += need;
    c.last_seq = seq;
    ec.clear();
    return s;
  }
  if (!chunks_.empty() && chunks_.front().last_seq <= completed && chunks_.front().size >= need &&
      chunks_.size() > 1) {
    chunk c = chunks_.front();
    chunks_.pop_front();
    c.used = need;
    c.last_seq = seq;
    chunks_.push_back(c);
    ec.clear();
    return {c.host, c.device};
  }
  chunk c;
  c.size = std::max(chunk_size, need);
  c.device = static_cast<std::byte*>(dev.backend->alloc(c.size, ec));
  if (ec) return {};
  // Pinned memory from the device's slab pool: no driver call once the pool is warm.
  c.host = static_cast<std::byte*>(dev.pinned_alloc(c.size, ec));
  if (ec) {
    dev.backend->free(c.device, c.size);
    return {};
  }
  c.used = need;
  c.last_seq = seq;
  chunks_.push_back(c);
  return {c.host, c.device};
}

void staging_arena::release(device_state& dev) noexcept {
  for (auto& c : chunks_) {
    dev.backend->free(c.device, c.size);
    free_host_memory(dev, c.host);
  }
  chunks_.clear();
}

}  // namespace cora::detail
