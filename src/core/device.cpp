#include "cora/device.hpp"

#include <asio/post.hpp>

#include "core/binary_loader.hpp"
#include "core/host_pool.hpp"
#include "core/state.hpp"
#include "io/file_reader.hpp"

namespace cora {

namespace detail {

void free_device_memory(device_state& dev, void* p) noexcept { dev.remove_allocation(p); }

void free_host_memory(device_state& dev, void* p) noexcept {
  if (alloc_record* r = dev.runtime->pinned.drop(p)) release_allocation(r);
}

namespace {

/// Completes an async_state once every stream of a list has completed its synchronize.
struct multi_wait {
  struct node : wait_node {
    multi_wait* owner;
  };
  explicit multi_wait(std::size_t n, intrusive_ptr<async_state<void>> st)
      : nodes(n), remaining(n + 1), state(std::move(st)) {
    handles.reserve(n);
  }
  std::vector<node> nodes;
  std::atomic<std::size_t> remaining;
  intrusive_ptr<async_state<void>> state;
  std::mutex mutex;
  std::error_code first;
  std::string message;
  std::vector<op_handle> handles;

  static void on_complete(wait_node& n, bool) noexcept {
    auto& self = *static_cast<node&>(n).owner;
    if (n.ec) {
      std::lock_guard lock(self.mutex);
      if (!self.first) {
        self.first = n.ec;
        self.message = n.source ? n.source->message(n.seq) : std::string();
      }
    }
    self.arrive();
  }
  void arrive() noexcept {
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    auto st = std::move(state);
    std::error_code ec = first;
    std::string m = std::move(message);
    delete this;
    try {
      st->complete(ec, std::move(m));
    } catch (...) {
    }
  }
};

}  // namespace
}  // namespace detail

std::shared_ptr<detail::device_state> device::state() const noexcept { return s_->shared_from_this(); }

const device_properties& device::properties() const noexcept { return s_->properties; }

std::size_t device::index() const noexcept { return s_->index; }

void* device::malloc(std::size_t bytes, std::error_code& ec) {
  if (s_->shut_down.load(std::memory_order_acquire)) {
    detail::set_error(ec, errc::runtime_shut_down, "the runtime was shut down");
    return nullptr;
  }
  if (bytes == 0) {
    detail::set_error(ec, errc::invalid_argument, "cannot allocate 0 bytes");
    return nullptr;
  }
  // Counted before the backend allocates, so concurrent allocations never pass the limit.
  const std::size_t limit = s_->runtime->options.device_memory_limit;
  if (!s_->count_bytes(bytes, limit)) {
    detail::set_error(ec, errc::out_of_memory,
                      "cannot allocate " + std::to_string(bytes) + " bytes on " + s_->properties.name +
                          ": the device memory limit of " + std::to_string(limit) +
                          " bytes would be exceeded (" + std::to_string(s_->memory_in_use()) +
                          " in use)");
    return nullptr;
  }
  void* p = s_->backend->alloc(bytes, ec);
  if (ec) {
    s_->uncount_bytes(bytes);
    detail::set_error(ec, ec,
                      "cannot allocate " + std::to_string(bytes) + " bytes on " + s_->properties.name);
    return nullptr;
  }
  s_->add_allocation(p, bytes, true);
  return p;
}

void* device::malloc(std::size_t bytes) {
  std::error_code ec;
  void* p = malloc(bytes, ec);
  detail::throw_if(ec);
  return p;
}

void device::free(void* p, std::error_code& ec) {
  if (!p || !s_->remove_allocation(p)) {
    detail::set_error(ec, errc::invalid_pointer,
                      "free of a pointer that is no live allocation of " + s_->properties.name);
    return;
  }
  ec.clear();
}

void device::free(void* p) {
  std::error_code ec;
  free(p, ec);
  detail::throw_if(ec);
}

void* device::malloc_host(std::size_t bytes, std::error_code& ec) {
  if (s_->shut_down.load(std::memory_order_acquire)) {
    detail::set_error(ec, errc::runtime_shut_down, "the runtime was shut down");
    return nullptr;
  }
  if (bytes == 0) {
    detail::set_error(ec, errc::invalid_argument, "cannot allocate 0 bytes");
    return nullptr;
  }
  void* p = s_->pinned_alloc(bytes, ec);
  if (ec) {
    detail::set_error(ec, ec, "cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory");
    return nullptr;
  }
  return p;
}

void* device::malloc_host(std::size_t bytes) {
  std::error_code ec;
  void* p = malloc_host(bytes, ec);
  detail::throw_if(ec);
  return p;
}

void device::free_host(void* p, std::error_code& ec) {
  detail::alloc_record* r = p ? s_->runtime->pinned.drop(p) : nullptr;
  if (!r) {
    detail::set_error(ec, errc::invalid_pointer, "free_host of a pointer that is no pinned allocation");
    return;
  }
  detail::release_allocation(r);
  ec.clear();
}

void device::free_host(void* p) {
  std::error_code ec;
  free_host(p, ec);
  detail::throw_if(ec);
}

std::size_t device::memory_in_use() const noexcept { return s_->memory_in_use(); }

cora::memory_stats device::memory_stats() const noexcept {
  cora::memory_stats m;
  m.device_in_use = s_->memory_in_use();
  m.device_reserved = s_->backend->memory().reserved;
  m.pinned_in_use = s_->pinned_in_use();
  m.pinned_reserved = s_->pinned_reserved();
  return m;
}

void device::trim_memory(std::size_t keep) noexcept { s_->trim_memory(keep); }

void* device::native_handle() const noexcept { return s_->backend->native_handle(); }

cora::stream device::make_stream(const stream_options& options) {
  if (s_->shut_down.load(std::memory_order_acquire))
    throw error(errc::runtime_shut_down, "the runtime was shut down");
  std::error_code ec;
  auto bs = s_->take_stream(options.priority, ec);
  if (ec) throw error(ec, "cannot create a stream on " + s_->properties.name);
  auto st = detail::make_intrusive<detail::stream_state>(state(), std::move(bs));
  st->pooled = options.priority == 0 && s_->backend->pool_streams();
  return cora::stream(detail::intrusive_ptr<detail::completion_source>(std::move(st)));
}

cora::stream device::adopt_stream(void* native_stream) {
  if (s_->shut_down.load(std::memory_order_acquire))
    throw error(errc::runtime_shut_down, "the runtime was shut down");
  if (!native_stream) throw error(errc::invalid_argument, "adopt_stream of a null stream");
  std::error_code ec;
  auto bs = s_->backend->adopt_stream(native_stream, s_->marker_wakeup(), ec);
  if (ec) throw error(ec, "cannot adopt a native stream on " + s_->properties.name);
  return cora::stream(detail::intrusive_ptr<detail::completion_source>(
      detail::make_intrusive<detail::stream_state>(state(), std::move(bs))));
}

cora::event device::make_event(const event_options& options) {
  if (s_->shut_down.load(std::memory_order_acquire))
    throw error(errc::runtime_shut_down, "the runtime was shut down");
  std::error_code ec;
  auto be = s_->backend->create_event(options.timing, ec);
  if (ec) throw error(ec, "cannot create an event on " + s_->properties.name);
  auto st = std::make_shared<detail::event_state>();
  st->device = state();
  st->backend = std::move(be);
  st->timing = options.timing;
  return cora::event(std::move(st));
}

namespace {

/// Completes a load's state with its binary, or with its error.
void deliver(detail::async_state<binary>& st, std::error_code ec, const std::string& message,
             std::shared_ptr<detail::binary_state> b) {
  if (ec) {
    st.complete(ec, message);
    return;
  }
  st.set_value(binary(std::move(b)));
  st.complete({});
}

pending<binary> finish_load(std::shared_ptr<detail::device_state> dev,
                            detail::intrusive_ptr<detail::async_state<binary>> st,
                            std::span<const std::byte> bytes, const load_options& options) {
  auto handle = [&] {
    return pending<binary>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(st), 0));
  };
  std::error_code ec;
  std::string message;
  // Recognising the bytes and checking a container's metadata is cheap: done here, so that
  // only the image the device runs is copied, and only for a load on another thread.
  detail::load_plan plan;
  if (!detail::plan_load(*dev, bytes, bytes.size(), plan, ec, message)) {
    st->complete(ec, message);
    return handle();
  }
  const auto image = bytes.subspan(plan.image.offset, plan.part_size);
  if (detail::loads_inline(*dev, image.size())) {
    // A small CPU image loads on the calling thread, straight from the caller's bytes.
    auto b = detail::load_planned(dev, std::move(plan), image, options, ec, message);
    deliver(*st, ec, message, std::move(b));
    return handle();
  }
  // A GPU load calls the driver, which waits for the device's running kernels and holds other
  // threads' copies and launches meanwhile: it runs while cora's streams are idle, here when
  // they are now (a small image, straight from the caller's bytes), else on a cora thread once
  // the work in flight has finished.
  if (dev->backend->load_waits()) {
    if (image.size() <= detail::inline_cpu_load_bytes && dev->streams_idle()) {
      std::shared_ptr<detail::binary_state> b;
      // The plan is taken only if the load runs here; otherwise the cora thread's load takes it.
      if (dev->run_while_idle([&] { b = detail::load_planned(dev, std::move(plan), image, options, ec, message); })) {
        deliver(*st, ec, message, std::move(b));
        return handle();
      }
    }
    auto* d = dev.get();
    const detail::host_func_scope* h = detail::host_func_scope::current();
    const detail::stream_state* host_func_stream = h && h->device == d ? h->stream : nullptr;
    d->run_when_idle(
        [dev = std::move(dev), st, copy = std::vector<std::byte>(image.begin(), image.end()),
         plan = std::move(plan), options]() mutable {
          std::error_code e;
          std::string m;
          if (dev->shut_down.load(std::memory_order_acquire)) {
            st->complete(make_error_code(errc::runtime_shut_down), "the runtime was shut down");
            return;
          }
          std::shared_ptr<detail::binary_state> b;
          try {
            b = detail::load_planned(dev, std::move(plan), copy, options, e, m);
          } catch (...) {
            e = std::make_error_code(std::errc::not_enough_memory);
            m = "out of memory while loading the image";
          }
          deliver(*st, e, m, std::move(b));
        },
        false, host_func_stream);
    return handle();
  }
  // A large CPU image loads on a cora thread.
  asio::post(detail::host_pool(), [dev = std::move(dev), st, copy = std::vector<std::byte>(image.begin(), image.end()),
                                   plan = std::move(plan), options]() mutable {
    std::error_code e;
    std::string m;
    auto b = detail::load_planned(dev, std::move(plan), copy, options, e, m);
    deliver(*st, e, m, std::move(b));
  });
  return handle();
}

}  // namespace

pending<binary> device::load_binary(std::span<const std::byte> bytes, const load_options& options) {
  auto st = detail::make_intrusive<detail::async_state<binary>>();
  if (s_->shut_down.load(std::memory_order_acquire)) {
    st->complete(make_error_code(errc::runtime_shut_down), "the runtime was shut down");
    return pending<binary>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(st)), 0));
  }
  return finish_load(state(), std::move(st), bytes, options);
}

pending<binary> device::load_binary(const std::filesystem::path& path, const load_options& options) {
  auto st = detail::make_intrusive<detail::async_state<binary>>();
  if (s_->shut_down.load(std::memory_order_acquire)) {
    st->complete(make_error_code(errc::runtime_shut_down), "the runtime was shut down");
    return pending<binary>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(st)), 0));
  }
  // The reads go through the I/O queue, unless a small file is cached (read here without
  // waiting); a GPU load then runs when the device is idle (see load_binary_file).
  detail::load_binary_file(state(), path, options,
                           [st](std::error_code ec, std::string message, std::shared_ptr<detail::binary_state> b) {
                             if (ec) {
                               st->complete(ec, std::move(message));
                               return;
                             }
                             st->set_value(binary(std::move(b)));
                             st->complete({});
                           });
  return pending<binary>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(st)), 0));
}

pending<void> device::synchronize() {
  if (const auto* h = detail::host_func_scope::current(); h && h->device == s_) {
    return pending<void>(detail::failed_op(
        std::make_error_code(std::errc::resource_deadlock_would_occur),
        "device.synchronize() in a host function of one of the device's streams would wait for "
        "that host function itself",
        nullptr));
  }
  auto streams = s_->streams();
  auto st = detail::make_intrusive<detail::async_state<void>>();
  detail::op_handle result(detail::intrusive_ptr<detail::completion_source>::share(st.get()), 0);
  if (streams.empty()) {
    st->complete({});
    return pending<void>(std::move(result));
  }
  // One count per stream plus one for this function, so the state outlives the loop.
  auto* mw = new detail::multi_wait(streams.size(), std::move(st));
  for (std::size_t i = 0; i < streams.size(); ++i) {
    auto& n = mw->nodes[i];
    n.owner = mw;
    n.on_complete = &detail::multi_wait::on_complete;
    mw->handles.push_back(streams[i]->synchronize_handle());
    const auto& h = mw->handles.back();
    if (!h.source()->arm(n, h.seq(), nullptr)) detail::multi_wait::on_complete(n, false);
  }
  mw->arrive();
  return pending<void>(std::move(result));
}

}  // namespace cora
