#include <algorithm>

#include <asio/error.hpp>

#include "core/state.hpp"

namespace cora::detail {

// ---------------------------------------------------------------------------------------------
// runtime_core: pinned host memory of every device

void runtime_core::add_pinned(void* p, std::size_t size, device_state* owner) {
  std::unique_lock lock(pinned_mutex_);
  pinned_[reinterpret_cast<std::uintptr_t>(p)] = {size, owner};
}

bool runtime_core::remove_pinned(void* p, device_state*& owner) {
  std::unique_lock lock(pinned_mutex_);
  auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == pinned_.end()) return false;
  owner = it->second.second;
  pinned_.erase(it);
  return true;
}

bool runtime_core::find_pinned(const void* p, memory_region& out) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lock(pinned_mutex_);
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return false;
  --it;
  if (a >= it->first + it->second.first) return false;
  out = {memory_region::kind::pinned_host, nullptr, it->first, it->second.first};
  return true;
}

// ---------------------------------------------------------------------------------------------
// device_state

device_state::device_state(std::shared_ptr<runtime_core> rt, std::unique_ptr<backend::device> dev,
                           std::size_t idx)
    : runtime(std::move(rt)), backend(std::move(dev)), index(idx) {
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
}

void device_state::add_allocation(void* p, std::size_t size) {
  std::unique_lock lock(alloc_mutex_);
  allocations_[reinterpret_cast<std::uintptr_t>(p)] = size;
  in_use_ += size;
}

bool device_state::remove_allocation(void* p) {
  std::unique_lock lock(alloc_mutex_);
  auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == allocations_.end()) return false;
  in_use_ -= it->second;
  allocations_.erase(it);
  return true;
}

bool device_state::find_allocation(const void* p, memory_region& out) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lock(alloc_mutex_);
  auto it = allocations_.upper_bound(a);
  if (it == allocations_.begin()) return false;
  --it;
  if (a >= it->first + it->second) return false;
  out = {memory_region::kind::device, const_cast<device_state*>(this), it->first, it->second};
  return true;
}

std::size_t device_state::memory_in_use() const noexcept {
  std::shared_lock lock(alloc_mutex_);
  return in_use_;
}

memory_region device_state::classify(const void* p, std::size_t bytes, std::error_code& ec) const {
  memory_region r;
  if (!p) {
    set_error(ec, errc::invalid_pointer, "null pointer");
    return r;
  }
  bool found = find_allocation(p, r);
  if (!found) {
    std::lock_guard lock(runtime->devices_mutex);
    for (device_state* d : runtime->devices)
      if (d != this && d->find_allocation(p, r)) {
        found = true;
        break;
      }
  }
  if (!found) found = runtime->find_pinned(p, r);
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
    ec.clear();
    return {memory_region::kind::pageable_host, nullptr, reinterpret_cast<std::uintptr_t>(p), bytes};
  }
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > r.base + r.size - a) {
    set_error(ec, errc::out_of_range,
              "range of " + std::to_string(bytes) + " bytes runs " +
                  std::to_string(bytes - (r.base + r.size - a)) +
                  " bytes past the end of its allocation");
    return r;
  }
  ec.clear();
  return r;
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
  backend->shutdown();
}

void device_state::on_shutdown(std::function<void()> fn) {
  std::lock_guard lock(hooks_mutex_);
  shutdown_hooks_.push_back(std::move(fn));
}

}  // namespace cora::detail
