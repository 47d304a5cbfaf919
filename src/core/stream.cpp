#include "cora/stream.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/graph_state.hpp"
#include "core/host_memory_probe.hpp"
#include "core/state.hpp"
#include "core/file_to_device.hpp"
#include "cora/device.hpp"

namespace cora {

namespace {

using detail::memory_region;

pending<void> fail(errc e, std::string message, detail::stream_state* s) {
  return pending<void>(detail::failed_op(make_error_code(e), std::move(message), s));
}

pending<void> fail(std::error_code ec, detail::stream_state* s) {
  return pending<void>(detail::failed_op(ec, last_error_message(), s));
}

pending<void> done_op() {
  auto st = detail::make_intrusive<detail::async_state<void>>();
  st->complete({});
  return pending<void>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(st)), 0));
}

std::string dims(const dim3& d) {
  return std::to_string(d.x) + "x" + std::to_string(d.y) + "x" + std::to_string(d.z);
}

// Checks what every backend needs of a launch configuration.
bool check_config(const detail::device_state& dev, const launch_config& cfg, std::string& message) {
  const auto& p = dev.properties;
  if (cfg.grid.volume() == 0) {
    message = "the grid has no blocks (" + dims(cfg.grid) + ")";
    return false;
  }
  if (cfg.grid.x > p.max_grid.x || cfg.grid.y > p.max_grid.y || cfg.grid.z > p.max_grid.z ||
      cfg.grid.volume() > 0xffffffffull) {
    message = "grid " + dims(cfg.grid) + " exceeds the device limit " + dims(p.max_grid);
    return false;
  }
  if (cfg.block.volume() == 0 || cfg.block.volume() > p.max_threads_per_block ||
      cfg.block.x > p.max_block.x || cfg.block.y > p.max_block.y || cfg.block.z > p.max_block.z) {
    message = "block " + dims(cfg.block) + " exceeds the device limit " + dims(p.max_block) +
              " (" + std::to_string(p.max_threads_per_block) + " threads)";
    return false;
  }
  if (cfg.timeout.count() < 0) {
    message = "negative timeout";
    return false;
  }
  return true;
}

}  // namespace

bool detail::check_launch_config(const detail::device_state& dev, const launch_config& cfg,
                                 std::string& message) {
  return check_config(dev, cfg, message);
}

namespace {
// A pageable host range (not cora's memory) must be mapped: a wild address fails when the op is
// queued, not in a device worker. The CPU device reads it directly, so it must be readable too;
// a GPU may be given unified addresses of memory its driver allocated outside cora, which are
// reserved (PROT_NONE) on the host.
bool unmapped_host(const detail::device_state& dev, const memory_region& r, const void* p,
                   std::size_t bytes) {
  return r.k == memory_region::kind::pageable_host &&
         !detail::host_range_mapped(p, bytes, dev.properties.backend == backend_kind::cpu);
}

pending<void> fail_unmapped(const char* what, const void* p, std::size_t bytes,
                            detail::stream_state* s) {
  char addr[32];
  std::snprintf(addr, sizeof(addr), "%p", p);
  return fail(errc::invalid_pointer,
              std::string(what) + " [" + addr + ", +" + std::to_string(bytes) +
                  ") is neither an allocation nor mapped host memory",
              s);
}

// The slots of a raw argument block that the kernel's records mark as pointers must hold null,
// an address in a live allocation, or mapped host memory. (Addresses the kernel computes
// itself are not seen: a wild one faults on a CPU as in native code.)
bool pointer_slots_ok(const detail::device_state& dev, const kernel& k,
                      std::span<const std::byte> block,
                      std::span<const placeholder_info> placeholders, std::string& message) {
  const auto params = k.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.pointer || p.offset + sizeof(void*) > block.size()) continue;
    if (std::any_of(placeholders.begin(), placeholders.end(),
                    [&](const placeholder_info& ph) { return ph.addr_offset == p.offset; }))
      continue;  // replaced by the staged data's address
    const void* v;
    std::memcpy(&v, block.data() + p.offset, sizeof(v));
    if (!v) continue;
    std::error_code ec;
    const memory_region r = dev.classify(v, 1, ec);
    if (ec || unmapped_host(dev, r, v, 1)) {
      message = "pointer parameter " + std::to_string(i) + " of kernel '" + std::string(k.name()) +
                "' holds an address that is " +
                (ec ? "in no live allocation (" + last_error_message() + ")"
                    : std::string("neither an allocation nor mapped host memory"));
      return false;
    }
  }
  return true;
}


}  // namespace

stream::stream(detail::intrusive_ptr<detail::completion_source> s) noexcept : s_(std::move(s)) {}

detail::stream_state* stream::st() const noexcept { return static_cast<detail::stream_state*>(s_.get()); }
detail::stream_state* stream::state() const noexcept { return st(); }
stream::stream(stream&&) noexcept = default;
stream& stream::operator=(stream&& o) noexcept {
  if (this != &o) {
    stream old(std::move(*this));
    s_ = std::move(o.s_);
  }
  return *this;
}

stream::~stream() {
  if (s_ && st()->capturing.load(std::memory_order_acquire)) abandon_capture();
  // A borrowed native stream may be destroyed by its owner as soon as this handle is gone.
  if (s_ && st()->backend->borrowed()) st()->detach_native();
  // Work still in flight keeps the stream alive: the engine releases it when the work is done.
  if (s_ && !st()->idle_observed())
    detail::engine::get().drain(detail::intrusive_ptr<detail::stream_state>::share(st()));
}

cora::device& stream::device() const {
  if (!s_) throw error(errc::invalid_handle, "empty stream handle");
  return st()->device->handle;
}

bool stream::idle() const { return !s_ || st()->query_idle(); }

void* stream::native_handle() const noexcept { return s_ ? st()->backend->native_handle() : nullptr; }

void* stream::alloc_raw(std::size_t bytes, std::shared_ptr<detail::device_state>& owner,
                        std::error_code& ec) {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty stream handle");
    return nullptr;
  }
  owner = st()->device;
  return st()->device->handle.malloc(bytes, ec);
}

void stream::free_after(detail::device_state* owner, void* p, bool host) noexcept {
  if (!p || !owner) return;
  detail::alloc_record* r = host ? owner->runtime->pinned.drop(p) : owner->drop_allocation(p);
  if (!r) return;
  detail::alloc_ref ref(r);  // the handle's reference, now tied to this stream's tail
  if (!s_) return;
  try {
    detail::op_keep keep;
    keep.add(std::move(ref));
    st()->keep_until_tail(std::move(keep));
  } catch (...) {
  }
}

// --- copies ---------------------------------------------------------------------------------

pending<void> stream::copy(void* dst, const void* src, std::size_t bytes) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (bytes == 0) return done_op();
  auto& dev = *st()->device;
  std::error_code ec;
  // The op holds the allocations it touches until it completes (DESIGN rule 7).
  detail::op_keep keep;
  detail::alloc_ref ref;
  const memory_region d = dev.classify(dst, bytes, ec, &ref);
  if (ec) return fail(ec.value() == static_cast<int>(errc::invalid_pointer)
                          ? make_error_code(errc::invalid_pointer)
                          : ec,
                      st());
  keep.add(std::move(ref));
  const memory_region s = dev.classify(src, bytes, ec, &ref);
  if (ec) return fail(ec, st());
  keep.add(std::move(ref));
  for (const memory_region* r : {&d, &s})
    if (r->k == memory_region::kind::device && r->device->properties.backend != dev.properties.backend)
      return fail(errc::wrong_device, "copy involves memory of " + r->device->properties.name +
                                          ", which this stream's device cannot reach", st());
  if (unmapped_host(dev, d, dst, bytes)) return fail_unmapped("destination", dst, bytes, st());
  if (unmapped_host(dev, s, src, bytes)) return fail_unmapped("source", src, bytes, st());
  const bool pageable = s.k == memory_region::kind::pageable_host;
  if (st()->capturing.load(std::memory_order_acquire))
    return detail::capture_copy(*st(), dst, src, bytes, d.k != memory_region::kind::device,
                                s.k != memory_region::kind::device);
  return pending<void>(st()->enqueue(
      [&](std::uint64_t seq, std::error_code&, std::string&) {
        st()->backend->copy(seq, dst, src, bytes, pageable);
      },
      std::move(keep)));
}

pending<void> stream::copy_checked(void* dst, std::size_t dst_bytes, const void* src,
                                   std::size_t src_bytes) {
  if (src_bytes > dst_bytes)
    return fail(errc::out_of_range,
                "copy of " + std::to_string(src_bytes) + " bytes into a buffer of " +
                    std::to_string(dst_bytes) + " bytes",
                st());
  return copy(dst, src, src_bytes);
}

pending<void> stream::fill(void* dst, std::uint8_t value, std::size_t bytes) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (bytes == 0) return done_op();
  std::error_code ec;
  detail::alloc_ref ref;
  const memory_region d = st()->device->classify(dst, bytes, ec, &ref);
  if (ec) return fail(ec, st());
  if (unmapped_host(*st()->device, d, dst, bytes))
    return fail_unmapped("destination", dst, bytes, st());
  if (st()->capturing.load(std::memory_order_acquire))
    return detail::capture_fill(*st(), dst, value, bytes, d.k != memory_region::kind::device);
  detail::op_keep keep;
  keep.add(std::move(ref));
  return pending<void>(st()->enqueue(
      [&](std::uint64_t seq, std::error_code&, std::string&) {
        st()->backend->fill(seq, dst, value, bytes);
      },
      std::move(keep)));
}

// --- launches -------------------------------------------------------------------------------

namespace detail {

// Validates the kernel against the stream, enqueues the staging copy of placeholder data (if
// any) and the launch, as one position in the stream.
pending<void> launch_block(stream_state* s, const kernel& k, const launch_config& cfg,
                           std::span<const std::byte> block, std::span<const placeholder_info> phs,
                           const void* device_block, alloc_ref device_block_ref = {},
                           op_keep* found = nullptr) {
  auto& dev = *s->device;
  const auto& ks = k.state();
  std::error_code ec;
  auto module = ks->binary->module_for_launch(ec);
  if (ec) return pending<void>(failed_op(ec, last_error_message(), s));
  if (ks->binary->device.get() != &dev)
    return pending<void>(failed_op(make_error_code(errc::wrong_device),
                                   "kernel '" + ks->desc->name + "' was loaded on " +
                                       ks->binary->device->properties.name + ", not on " +
                                       dev.properties.name,
                                   s));
  std::string message;
  if (!check_config(dev, cfg, message))
    return pending<void>(failed_op(make_error_code(errc::invalid_launch_config), message, s));

  if (s->capturing.load(std::memory_order_acquire))
    return detail::capture_launch(*s, ks, std::move(module), cfg, block.first(std::min(block.size(), ks->args_size)),
                                  !phs.empty(), device_block);
  // Placeholder slots get the device address of the staged copy of the whole block.
  std::vector<std::byte> patched;
  std::span<const std::byte> params = block.first(std::min(block.size(), ks->args_size));
  if (!phs.empty()) patched.assign(params.begin(), params.end());

  // What the launch holds until it completes: its module and kernel, and every allocation a
  // pointer-sized parameter points into (a value that merely looks like such an address only
  // keeps that memory a little longer). A typed launch has `found` them already, knowing which
  // arguments are pointers. No heap allocation for the usual launch.
  op_keep keep;
  if (found) keep = std::move(*found);
  keep.module = std::move(module);
  keep.kernel = ks;
  keep.add(std::move(device_block_ref));
  if (!found)
    for (const auto& p : ks->params) {
      if (p.size != sizeof(void*) || p.offset + sizeof(void*) > params.size()) continue;
      const void* ptr;
      std::memcpy(&ptr, params.data() + p.offset, sizeof(ptr));
      // Two arguments in one allocation (x and y of one buffer) need one reference: each one
      // taken is an atomic on a line every thread using the buffer shares.
      if (!ptr || keep.covers(ptr)) continue;
      memory_region r;
      alloc_ref ref;
      if (dev.find_allocation(ptr, r, &ref) || dev.runtime->find_pinned(ptr, r, &ref))
        keep.add(std::move(ref));
    }
  backend::launch_desc desc;
  desc.function = ks->function;
  desc.kernel = ks->desc;
  desc.config = cfg;
  desc.device_args = device_block;
  return pending<void>(s->enqueue(
      [&](std::uint64_t& seq, std::error_code& e, std::string& m) {
        if (!phs.empty()) {
          const std::uint64_t launch_seq = seq + 1;
          auto slice = s->arena().take(dev, block.size(), launch_seq, s->completed_position(), e);
          if (e) {
            m = "cannot stage placeholder data: " + e.message();
            return;
          }
          std::memcpy(slice.host, block.data(), block.size());
          for (const auto& ph : phs) {
            const auto addr = reinterpret_cast<std::uintptr_t>(slice.device + ph.data_offset);
            std::memcpy(patched.data() + ph.addr_offset, &addr, sizeof(addr));
          }
          s->backend->copy(seq, slice.device, slice.host, block.size(), false);
          s->commit_locked(seq);
          seq = launch_seq;
          desc.args = patched.data();
          desc.args_size = patched.size();
        } else if (!device_block) {
          desc.args = params.data();
          desc.args_size = params.size();
        }
        s->backend->launch(seq, desc, e, m);
      },
      std::move(keep)));
}

}  // namespace detail

pending<void> stream::launch_typed(const kernel& k, const launch_config& cfg,
                                   std::span<const detail::arg_view> args) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!k) return fail(errc::invalid_handle, "empty kernel handle", st());
  const auto& params = k.state()->params;
  const std::string& name = k.state()->desc->name;
  if (args.size() != params.size())
    return fail(errc::argument_mismatch,
                "kernel '" + name + "' takes " + std::to_string(params.size()) + " arguments, " +
                    std::to_string(args.size()) + " given",
                st());
  // Canonical block, on the stack for the usual few arguments.
  std::byte small[256];
  std::vector<std::byte> big;
  std::byte* block = small;
  if (k.args_size() > sizeof(small)) {
    big.resize(k.args_size());
    block = big.data();
  }
  std::memset(block, 0, k.args_size());
  auto& dev = *st()->device;
  // The allocations the pointer arguments name, each looked up once: the check below takes
  // the reference the launch holds.
  detail::op_keep found;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a.size != params[i].size)
      return fail(errc::argument_mismatch,
                  "argument " + std::to_string(i) + " of kernel '" + name + "' has " +
                      std::to_string(a.size) + " bytes; the parameter has " +
                      std::to_string(params[i].size),
                  st());
    if (a.k == detail::arg_view::kind::buffer && a.owner != &dev)
      return fail(errc::wrong_device,
                  "argument " + std::to_string(i) + " is memory of another device", st());
    const void* p = nullptr;
    if (a.k != detail::arg_view::kind::value) std::memcpy(&p, a.data, sizeof(p));
    // Inside an allocation already checked and held (x and y of one buffer): nothing to do.
    if (p && !found.covers(p)) {
      detail::memory_region r;
      detail::alloc_ref ref;
      if (a.k == detail::arg_view::kind::buffer) {
        // A device buffer of this device: its allocation only needs holding.
        if (dev.find_allocation(p, r, &ref)) found.add(std::move(ref));
      } else {
        std::error_code ec;
        r = dev.classify(p, 1, ec, &ref);
        if (ec || r.k == detail::memory_region::kind::pageable_host)
          return fail(errc::invalid_pointer,
                      "argument " + std::to_string(i) + " of kernel '" + name +
                          "' is no pointer into a live allocation" +
                          (ec ? " (" + last_error_message() + ")" : " (it points to host memory)"),
                      st());
        if (r.k == detail::memory_region::kind::device && r.device != &dev)
          return fail(errc::wrong_device,
                      "argument " + std::to_string(i) + " points to memory of another device",
                      st());
        found.add(std::move(ref));
      }
    }
    std::memcpy(block + params[i].offset, a.data, a.size);
  }
  return detail::launch_block(st(), k, cfg, {block, k.args_size()}, {}, nullptr, {}, &found);
}

pending<void> stream::launch(const kernel& k, const launch_config& cfg, const kernel_args& args) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!k) return fail(errc::invalid_handle, "empty kernel handle", st());
  if (args.kernel().state() != k.state())
    return fail(errc::argument_mismatch, "the argument list was built for another kernel", st());
  if (!args.finalized())
    return fail(errc::args_not_finalized, "the argument list was not finalized", st());
  std::string message;
  if (!pointer_slots_ok(*st()->device, k, args.block(), args.placeholders(), message))
    return fail(errc::invalid_pointer, std::move(message), st());
  return detail::launch_block(st(), k, cfg, args.block(), args.placeholders(), nullptr);
}

pending<void> stream::launch_host_block(const kernel& k, const launch_config& cfg,
                                        std::span<const std::byte> block,
                                        std::span<const placeholder_info> placeholders) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!k) return fail(errc::invalid_handle, "empty kernel handle", st());
  const std::size_t need = k.args_size();
  if (block.data() == nullptr)
    return fail(errc::invalid_argument, "the argument block is null", st());
  if (block.size() < need || (placeholders.empty() && block.size() != need))
    return fail(errc::argument_mismatch,
                "kernel '" + std::string(k.name()) + "' takes a " + std::to_string(need) +
                    "-byte argument block; " + std::to_string(block.size()) + " bytes given",
                st());
  const auto params = k.params();
  for (const auto& ph : placeholders) {
    const bool slot_ok = std::any_of(params.begin(), params.end(), [&](const param_info& p) {
      return p.offset == ph.addr_offset && p.size == sizeof(void*);
    });
    if (!slot_ok)
      return fail(errc::placeholder_misuse,
                  "placeholder address offset " + std::to_string(ph.addr_offset) +
                      " is not the offset of a pointer parameter",
                  st());
    if (ph.data_offset < need || ph.data_offset >= block.size())
      return fail(errc::placeholder_misuse,
                  "placeholder data offset " + std::to_string(ph.data_offset) +
                      " lies outside the data part of the block (" + std::to_string(need) + ".." +
                      std::to_string(block.size()) + ")",
                  st());
  }
  std::string message;
  if (!pointer_slots_ok(*st()->device, k, block, placeholders, message))
    return fail(errc::invalid_pointer, std::move(message), st());
  return detail::launch_block(st(), k, cfg, block, placeholders, nullptr);
}

pending<void> stream::launch_pointer_array(const kernel& k, const launch_config& cfg,
                                           const void* const* args) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!k) return fail(errc::invalid_handle, "empty kernel handle", st());
  const auto params = k.params();
  if (!args && !params.empty())
    return fail(errc::invalid_argument, "the argument array is null", st());
  std::vector<std::byte> block(k.args_size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!args[i])
      return fail(errc::invalid_argument, "args[" + std::to_string(i) + "] is null", st());
    std::memcpy(block.data() + params[i].offset, args[i], params[i].size);
  }
  std::string message;
  if (!pointer_slots_ok(*st()->device, k, block, {}, message))
    return fail(errc::invalid_pointer, std::move(message), st());
  return detail::launch_block(st(), k, cfg, block, {}, nullptr);
}

pending<void> stream::launch_device_block(const kernel& k, const launch_config& cfg,
                                          const void* device_block, std::size_t bytes) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!k) return fail(errc::invalid_handle, "empty kernel handle", st());
  if (bytes != k.args_size())
    return fail(errc::argument_mismatch,
                "kernel '" + std::string(k.name()) + "' takes a " + std::to_string(k.args_size()) +
                    "-byte argument block; " + std::to_string(bytes) + " bytes given",
                st());
  std::error_code ec;
  detail::alloc_ref ref;
  const auto r = st()->device->classify(device_block, bytes, ec, &ref);
  if (ec) return fail(ec, st());
  if (r.k != detail::memory_region::kind::device || r.device != st()->device.get())
    return fail(errc::invalid_pointer, "the argument block is not in this device's memory", st());
  return detail::launch_block(st(), k, cfg, {}, {}, device_block, std::move(ref));
}

// --- ordering -------------------------------------------------------------------------------

pending<void> stream::record(event& ev) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!ev) return fail(errc::invalid_handle, "empty event handle", st());
  auto es = ev.state();
  if (es->device.get() != st()->device.get())
    return fail(errc::wrong_device, "the event belongs to another device", st());
  if (st()->capturing.load(std::memory_order_acquire)) return detail::capture_record(*st(), *es);
  std::uint64_t recorded = 0;
  auto h = st()->enqueue(
      [&](std::uint64_t seq, std::error_code&, std::string&) {
        st()->backend->record(seq, *es->backend);
        recorded = seq;
      },
      es);
  if (recorded) {
    // The event may be awaited after later work is enqueued: it gets a marker of its own.
    st()->mark(recorded);
    std::lock_guard lock(es->mutex);
    es->stream = detail::intrusive_ptr<detail::stream_state>::share(st());
    es->seq = recorded;
    es->capture.reset();
  }
  return pending<void>(std::move(h));
}

pending<void> stream::wait(const event& ev) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!ev) return fail(errc::invalid_handle, "empty event handle", st());
  auto es = ev.state();
  if (es->device->properties.backend != st()->device->properties.backend)
    return fail(errc::not_supported, "a stream cannot wait for an event of another backend", st());
  if (pending<void> captured; detail::capture_wait(*st(), *es, captured)) return captured;
  detail::intrusive_ptr<detail::stream_state> source;
  {
    std::lock_guard lock(es->mutex);
    source = es->stream;
  }
  auto keep = std::make_shared<std::pair<std::shared_ptr<detail::event_state>,
                                         detail::intrusive_ptr<detail::stream_state>>>(es, source);
  return pending<void>(st()->enqueue(
      [&](std::uint64_t seq, std::error_code&, std::string&) { st()->backend->wait(seq, *es->backend); },
      keep));
}

pending<void> stream::wait_value(const std::uint32_t* addr, std::uint32_t value, wait_condition cond) {
  return value_op(const_cast<std::uint32_t*>(addr), value, cond, false, false);
}

pending<void> stream::wait_value(const std::uint64_t* addr, std::uint64_t value, wait_condition cond) {
  return value_op(const_cast<std::uint64_t*>(addr), value, cond, true, false);
}

pending<void> stream::write_value(std::uint32_t* addr, std::uint32_t value) {
  return value_op(addr, value, wait_condition::geq, false, true);
}

pending<void> stream::write_value(std::uint64_t* addr, std::uint64_t value) {
  return value_op(addr, value, wait_condition::geq, true, true);
}

pending<void> stream::value_op(void* addr, std::uint64_t value, wait_condition cond, bool wide,
                               bool write) {
  const char* const what = write ? "stream.write_value()" : "stream.wait_value()";
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  const auto c = static_cast<unsigned>(cond);
  if (c > static_cast<unsigned>(wait_condition::nor_nonzero))
    return fail(errc::invalid_argument, "not a wait_condition: " + std::to_string(c), st());
  const std::size_t size = wide ? 8 : 4;
  if (!addr) return fail(errc::invalid_pointer, std::string(what) + ": the address is null", st());
  if (reinterpret_cast<std::uintptr_t>(addr) % size != 0)
    return fail(errc::invalid_pointer,
                std::string(what) + ": the address is not aligned to " + std::to_string(size) + " bytes",
                st());
  std::error_code ec;
  detail::alloc_ref ref;
  const memory_region r = st()->device->classify(addr, size, ec, &ref);
  if (ec) return fail(ec, st());
  // The device reads or writes the word itself: it must be memory the device reaches.
  if ((r.k == memory_region::kind::device && r.device != st()->device.get()) ||
      r.k == memory_region::kind::pageable_host)
    return fail(errc::invalid_pointer,
                std::string(what) + ": the word must be in this device's memory or in pinned host memory",
                st());
  if (st()->capturing.load(std::memory_order_acquire)) return detail::capture_illegal(*st(), what);
  // The backend may reach only some kinds of memory with its stream memory operations (CUDA's
  // refuse pool memory): it is told which kind the word is in.
  const backend::value_memory where = !r.record ? backend::value_memory::foreign
                                      : r.k == memory_region::kind::device
                                          ? backend::value_memory::allocation
                                          : backend::value_memory::pinned_host;
  detail::op_keep keep;
  keep.add(std::move(ref));
  return pending<void>(st()->enqueue(
      [&](std::uint64_t seq, std::error_code& e, std::string& m) {
        if (write)
          st()->backend->write_value(seq, addr, where, value, wide, e, m);
        else
          st()->backend->wait_value(seq, addr, where, value, c, wide, e, m);
        if (e && !m.empty()) m = std::string(what) + ": " + m;
      },
      std::move(keep)));
}

void stream::stop_on_failure(bool stop) {
  std::error_code ec;
  stop_on_failure(stop, ec);
  detail::throw_if(ec);
}

void stream::stop_on_failure(bool stop, std::error_code& ec) {
  ec.clear();
  if (!s_) return detail::set_error(ec, errc::invalid_handle, "empty stream handle");
  if (!st()->backend->stop_on_failure(stop))
    detail::set_error(ec, errc::not_supported,
                      "this device cannot hold back work it has handed to its driver: ops behind a "
                      "failed one run (on a GPU, a kernel fault stops the whole context anyway)");
}

void stream::abort() {
  std::error_code ec;
  abort(ec);
  detail::throw_if(ec);
}

void stream::abort(std::error_code& ec) {
  ec.clear();
  if (!s_) return detail::set_error(ec, errc::invalid_handle, "empty stream handle");
  if (!st()->backend->abort())
    detail::set_error(ec, errc::not_supported,
                      "this device cannot recall work it has handed to its driver");
}

pending<void> stream::host_func(std::function<void()> fn) {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (!fn) return fail(errc::invalid_argument, "empty host function", st());
  if (st()->capturing.load(std::memory_order_acquire)) return detail::capture_host_call(*st(), std::move(fn));
  // The stream outlives the call: a stream with work in flight is kept until it is idle.
  auto run = [fn = std::move(fn), s = st()]() {
    detail::host_func_scope scope(s);
    fn();
  };
  return pending<void>(st()->enqueue([&](std::uint64_t seq, std::error_code& e, std::string& m) {
    st()->backend->host_func(seq, std::move(run), e);
    if (e) m = "the device cannot run host functions";
  }));
}

// --- files ----------------------------------------------------------------------------------

pending<std::size_t> stream::read_file(void* dst, const std::filesystem::path& path,
                                       std::uint64_t offset, std::size_t bytes,
                                       const read_options& options) {
  if (!s_) {
    auto st = detail::make_intrusive<detail::async_state<std::size_t>>();
    st->complete(make_error_code(errc::invalid_handle), "empty stream handle");
    return pending<std::size_t>(
        detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(st)), 0));
  }
  if (st()->capturing.load(std::memory_order_acquire)) {
    // The copies would be enqueued later, as the file is read: they cannot be captured.
    (void)detail::capture_illegal(*st(), "stream.read_file()");
    auto failed = detail::make_intrusive<detail::async_state<std::size_t>>();
    failed->complete(make_error_code(errc::illegal_in_capture),
                     "stream.read_file() is not allowed while the stream is capturing a graph; the capture is abandoned");
    return pending<std::size_t>(
        detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(failed)), 0));
  }
  return detail::io::read_file_to_device(*st(), dst, path, offset, bytes, options);
}

pending<void> stream::synchronize() {
  if (!s_) return fail(errc::invalid_handle, "empty stream handle", nullptr);
  if (st()->capturing.load(std::memory_order_acquire))
    return detail::capture_illegal(*st(), "stream.synchronize()");
  return pending<void>(st()->synchronize_handle());
}

}  // namespace cora
