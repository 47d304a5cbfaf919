#include "cora/graph.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/graph_state.hpp"
#include "cora/device.hpp"
#include "cora/stream.hpp"

namespace cora {

namespace detail {

namespace {

using kind = backend::graph_node_desc::kind;

pending<void> done_op() {
  auto st = make_intrusive<async_state<void>>();
  st->complete({});
  return pending<void>(op_handle(intrusive_ptr<completion_source>(std::move(st)), 0));
}

pending<void> failed(std::error_code ec, std::string message) {
  return pending<void>(failed_op(ec, std::move(message), nullptr));
}

bool is_host(const memory_region& r) { return r.k != memory_region::kind::device; }

// Checks a copy or fill range as stream::copy does; `src` may be null (fills).
bool check_memory(device_state& dev, void* dst, const void* src, std::size_t bytes, bool& dst_host,
                  bool& src_host, std::error_code& ec) {
  if (bytes == 0) {
    set_error(ec, errc::invalid_argument, "a graph copy or fill of 0 bytes");
    return false;
  }
  const memory_region d = dev.classify(dst, bytes, ec);
  if (ec) return false;
  memory_region s;
  if (src) {
    s = dev.classify(src, bytes, ec);
    if (ec) return false;
  }
  const memory_region* regions[] = {&d, &s};
  for (const memory_region* r : regions)
    if (r->k == memory_region::kind::device && r->device != &dev &&
        r->device->properties.backend != dev.properties.backend) {
      set_error(ec, errc::wrong_device,
                "the graph's copy involves memory of " + r->device->properties.name +
                    ", which " + dev.properties.name + " cannot reach");
      return false;
    }
  dst_host = is_host(d);
  src_host = src && is_host(s);
  return true;
}

// Packs typed arguments into the canonical block with the checks of stream::launch.
bool pack_typed(device_state& dev, const kernel_state& ks, std::span<const arg_view> args,
                std::vector<std::byte>& block, std::error_code& ec) {
  const auto& params = ks.params;
  const std::string& name = ks.desc->name;
  if (args.size() != params.size()) {
    set_error(ec, errc::argument_mismatch,
              "kernel '" + name + "' takes " + std::to_string(params.size()) + " arguments, " +
                  std::to_string(args.size()) + " given");
    return false;
  }
  block.assign(ks.args_size, std::byte{0});
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a.size != params[i].size) {
      set_error(ec, errc::argument_mismatch,
                "argument " + std::to_string(i) + " of kernel '" + name + "' has " +
                    std::to_string(a.size) + " bytes; the parameter has " +
                    std::to_string(params[i].size));
      return false;
    }
    if (a.k == arg_view::kind::buffer && a.owner != &dev) {
      set_error(ec, errc::wrong_device, "argument " + std::to_string(i) + " is memory of another device");
      return false;
    }
    if (a.k == arg_view::kind::pointer) {
      const void* p;
      std::memcpy(&p, a.data, sizeof(p));
      if (p) {
        std::error_code cec;
        const auto r = dev.classify(p, 1, cec);
        if (cec || r.k == memory_region::kind::pageable_host) {
          set_error(ec, errc::invalid_pointer,
                    "argument " + std::to_string(i) + " of kernel '" + name +
                        "' is no pointer into a live allocation" +
                        (cec ? " (" + last_error_message() + ")" : " (it points to host memory)"));
          return false;
        }
        if (r.k == memory_region::kind::device && r.device != &dev) {
          set_error(ec, errc::wrong_device,
                    "argument " + std::to_string(i) + " points to memory of another device");
          return false;
        }
      }
    }
    std::memcpy(block.data() + params[i].offset, a.data, a.size);
  }
  ec.clear();
  return true;
}

backend::launch_desc launch_desc_of(const graph_node_rec& n) {
  backend::launch_desc d = n.desc.launch;
  d.args = n.args.empty() ? nullptr : n.args.data();
  d.args_size = n.args.size();
  return d;
}

// A launch node for kernel `ks` with a packed block; checks what every launch checks.
bool make_launch(device_state& dev, const std::shared_ptr<kernel_state>& ks,
                 std::shared_ptr<backend::module> module, const launch_config& cfg,
                 std::vector<std::byte> block, const void* device_block, graph_node_rec& rec,
                 std::error_code& ec) {
  if (!module) {
    module = ks->binary->module_for_launch(ec);
    if (ec) return false;
  }
  if (ks->binary->device.get() != &dev) {
    set_error(ec, errc::wrong_device,
              "kernel '" + ks->desc->name + "' was loaded on " + ks->binary->device->properties.name +
                  ", not on " + dev.properties.name);
    return false;
  }
  std::string message;
  if (!check_launch_config(dev, cfg, message)) {
    set_error(ec, errc::invalid_launch_config, message);
    return false;
  }
  rec.desc.k = kind::launch;
  rec.desc.launch.function = ks->function;
  rec.desc.launch.kernel = ks->desc;
  rec.desc.launch.config = cfg;
  rec.desc.launch.device_args = device_block;
  rec.args = std::move(block);
  rec.kernel = ks;
  rec.module = std::move(module);
  return true;
}

std::shared_ptr<graph_state> new_graph(const std::shared_ptr<device_state>& dev) {
  auto g = std::make_shared<graph_state>();
  g->device = dev;
  return g;
}

std::vector<std::size_t> indices(const after& deps) {
  std::vector<std::size_t> out;
  out.reserve(deps.nodes().size());
  for (const graph_node& n : deps.nodes()) out.push_back(n.index);
  return out;
}

// Adds a node to the capture `s` takes part in, after the stream's last nodes.
pending<void> capture_add(stream_state& s, graph_node_rec rec) {
  auto cs = capture_of(s);
  if (!cs) return failed(make_error_code(errc::illegal_in_capture), "the capture has ended");
  std::lock_guard lock(cs->mutex);
  auto* m = cs->find(&s);
  if (cs->ended || !m) return failed(make_error_code(errc::illegal_in_capture), "the capture has ended");
  if (cs->error) return failed(cs->error, "the capture was abandoned: " + cs->message);
  const std::size_t n = cs->graph->add(std::move(rec), m->frontier);
  m->frontier.assign(1, n);
  return done_op();
}

void leave_capture(stream_state& s) {
  std::lock_guard lock(s.enqueue_mutex());
  s.capture.reset();
  s.capturing.store(false, std::memory_order_release);
}

}  // namespace

std::size_t graph_state::add(graph_node_rec rec, std::span<const std::size_t> deps) {
  std::lock_guard lock(mutex);
  std::vector<std::size_t> d(deps.begin(), deps.end());
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  for (std::size_t i : d)
    if (i >= nodes.size())
      throw error(errc::out_of_range, "a dependency names node " + std::to_string(i) + " of a graph of " +
                                          std::to_string(nodes.size()) + " nodes");
  rec.desc.deps = std::move(d);
  nodes.push_back(std::move(rec));
  return nodes.size() - 1;
}

std::vector<backend::graph_node_desc> graph_state::descs(const std::vector<graph_node_rec>& nodes) {
  std::vector<backend::graph_node_desc> out;
  out.reserve(nodes.size());
  for (const auto& n : nodes) {
    out.push_back(n.desc);
    if (n.desc.k == kind::launch) out.back().launch = launch_desc_of(n);
  }
  return out;
}

capture_session::member* capture_session::find(const stream_state* s) {
  for (auto& m : streams)
    if (m.stream.get() == s) return &m;
  return nullptr;
}

std::shared_ptr<capture_session> capture_of(stream_state& s) {
  if (!s.capturing.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(s.enqueue_mutex());
  return s.capture;
}

pending<void> capture_copy(stream_state& s, void* dst, const void* src, std::size_t bytes,
                           bool dst_host, bool src_host) {
  graph_node_rec rec;
  rec.desc.k = kind::copy;
  rec.desc.dst = dst;
  rec.desc.src = src;
  rec.desc.bytes = bytes;
  rec.desc.dst_host = dst_host;
  rec.desc.src_host = src_host;
  return capture_add(s, std::move(rec));
}

pending<void> capture_fill(stream_state& s, void* dst, std::uint8_t value, std::size_t bytes,
                           bool dst_host) {
  graph_node_rec rec;
  rec.desc.k = kind::fill;
  rec.desc.dst = dst;
  rec.desc.value = value;
  rec.desc.bytes = bytes;
  rec.desc.dst_host = dst_host;
  return capture_add(s, std::move(rec));
}

pending<void> capture_launch(stream_state& s, const std::shared_ptr<kernel_state>& k,
                             std::shared_ptr<backend::module> module, const launch_config& cfg,
                             std::span<const std::byte> params, bool placeholders,
                             const void* device_block) {
  // Placeholder data is staged per launch in the stream's arena, which a graph replay cannot
  // reuse safely.
  if (placeholders)
    return capture_illegal(s, "a launch with placeholder arguments (kernel '" + k->desc->name +
                                  "'): pass the tiling data in device memory instead");
  graph_node_rec rec;
  std::error_code ec;
  if (!make_launch(*s.device, k, std::move(module), cfg,
                   std::vector<std::byte>(params.begin(), params.end()), device_block, rec, ec))
    return pending<void>(failed_op(ec, last_error_message(), &s));
  return capture_add(s, std::move(rec));
}

pending<void> capture_host_call(stream_state& s, std::function<void()> fn) {
  graph_node_rec rec;
  rec.desc.k = kind::host_call;
  rec.desc.fn = std::move(fn);
  return capture_add(s, std::move(rec));
}

pending<void> capture_record(stream_state& s, event_state& ev) {
  auto cs = capture_of(s);
  if (!cs) return failed(make_error_code(errc::illegal_in_capture), "the capture has ended");
  std::vector<std::size_t> nodes;
  {
    std::lock_guard lock(cs->mutex);
    auto* m = cs->find(&s);
    if (cs->ended || !m) return failed(make_error_code(errc::illegal_in_capture), "the capture has ended");
    nodes = m->frontier;
  }
  std::lock_guard lock(ev.mutex);
  ev.capture = cs;
  ev.capture_nodes = std::move(nodes);
  return done_op();
}

bool capture_wait(stream_state& s, event_state& ev, pending<void>& out) {
  std::shared_ptr<capture_session> from;
  std::vector<std::size_t> nodes;
  bool recorded_outside;
  {
    std::lock_guard lock(ev.mutex);
    from = ev.capture;
    nodes = ev.capture_nodes;
    recorded_outside = !from && ev.stream;
  }
  auto cs = capture_of(s);
  if (from) {
    std::lock_guard lock(from->mutex);
    if (from->ended) from.reset();  // a record of a finished capture stands for no work
  }
  if (!cs && !from) return false;
  if (cs && !from) {
    if (!recorded_outside) {  // never recorded: nothing to wait for
      out = done_op();
      return true;
    }
    out = capture_illegal(s, "stream.wait(event) on an event recorded outside the capture");
    return true;
  }
  if (cs && cs != from) {
    out = capture_illegal(s, "stream.wait(event) on an event recorded in another capture");
    return true;
  }
  if (!cs) {
    // A fork: the stream joins the capture, its next ops depending on the event's nodes.
    std::lock_guard slock(s.enqueue_mutex());
    if (s.capturing.load(std::memory_order_relaxed)) {
      out = failed(make_error_code(errc::illegal_in_capture), "the stream joined another capture meanwhile");
      return true;
    }
    std::lock_guard lock(from->mutex);
    if (from->ended) {
      out = failed(make_error_code(errc::illegal_in_capture), "the capture ended meanwhile");
      return true;
    }
    from->streams.push_back({intrusive_ptr<stream_state>::share(&s), std::move(nodes)});
    s.capture = from;
    s.capturing.store(true, std::memory_order_release);
    out = done_op();
    return true;
  }
  std::lock_guard lock(cs->mutex);
  auto* m = cs->find(&s);
  if (m) {
    m->frontier.insert(m->frontier.end(), nodes.begin(), nodes.end());
    std::sort(m->frontier.begin(), m->frontier.end());
    m->frontier.erase(std::unique(m->frontier.begin(), m->frontier.end()), m->frontier.end());
  }
  out = done_op();
  return true;
}

void capture_invalidate(stream_state& s, std::error_code ec, const std::string& message) noexcept {
  auto cs = capture_of(s);
  if (!cs) return;
  std::lock_guard lock(cs->mutex);
  if (cs->error) return;
  cs->error = ec;
  try {
    cs->message = message;
  } catch (...) {
  }
}

pending<void> capture_illegal(stream_state& s, const std::string& op) {
  const std::string message = op + " is not allowed while the stream is capturing a graph; the capture is abandoned";
  capture_invalidate(s, make_error_code(errc::illegal_in_capture), message);
  return failed(make_error_code(errc::illegal_in_capture), message);
}

}  // namespace detail

// --- graph --------------------------------------------------------------------------------

namespace {

using detail::graph_node_rec;
using kind = backend::graph_node_desc::kind;

detail::graph_state& checked(const std::shared_ptr<detail::graph_state>& s) {
  if (!s) throw error(errc::invalid_handle, "empty graph handle");
  return *s;
}

}  // namespace

graph::graph(cora::device& dev) : s_(detail::new_graph(dev.state())) {}

graph_node graph::add_copy(const after& deps, void* dst, const void* src, std::size_t bytes) {
  auto& g = checked(s_);
  std::error_code ec;
  bool dst_host = false, src_host = false;
  if (!detail::check_memory(*g.device, dst, src, bytes, dst_host, src_host, ec)) detail::throw_if(ec);
  graph_node_rec rec;
  rec.desc.k = kind::copy;
  rec.desc.dst = dst;
  rec.desc.src = src;
  rec.desc.bytes = bytes;
  rec.desc.dst_host = dst_host;
  rec.desc.src_host = src_host;
  return {g.add(std::move(rec), detail::indices(deps))};
}

graph_node graph::add_fill(const after& deps, void* dst, std::uint8_t value, std::size_t bytes) {
  auto& g = checked(s_);
  std::error_code ec;
  bool dst_host = false, src_host = false;
  if (!detail::check_memory(*g.device, dst, nullptr, bytes, dst_host, src_host, ec)) detail::throw_if(ec);
  graph_node_rec rec;
  rec.desc.k = kind::fill;
  rec.desc.dst = dst;
  rec.desc.value = value;
  rec.desc.bytes = bytes;
  rec.desc.dst_host = dst_host;
  return {g.add(std::move(rec), detail::indices(deps))};
}

graph_node graph::add_launch_typed(const after& deps, const kernel& k, const launch_config& cfg,
                                   std::span<const detail::arg_view> args) {
  auto& g = checked(s_);
  if (!k) throw error(errc::invalid_handle, "empty kernel handle");
  std::error_code ec;
  std::vector<std::byte> block;
  graph_node_rec rec;
  if (!detail::pack_typed(*g.device, *k.state(), args, block, ec) ||
      !detail::make_launch(*g.device, k.state(), nullptr, cfg, std::move(block), nullptr, rec, ec))
    detail::throw_if(ec);
  return {g.add(std::move(rec), detail::indices(deps))};
}

graph_node graph::add_host_call(const after& deps, std::function<void()> fn) {
  auto& g = checked(s_);
  if (!fn) throw error(errc::invalid_argument, "empty host function");
  graph_node_rec rec;
  rec.desc.k = kind::host_call;
  rec.desc.fn = std::move(fn);
  return {g.add(std::move(rec), detail::indices(deps))};
}

graph_node graph::add_empty(const after& deps) {
  auto& g = checked(s_);
  graph_node_rec rec;
  rec.desc.k = kind::empty;
  return {g.add(std::move(rec), detail::indices(deps))};
}

std::size_t graph::size() const noexcept {
  if (!s_) return 0;
  std::lock_guard lock(s_->mutex);
  return s_->nodes.size();
}

graph_node_kind graph::kind(graph_node n) const {
  auto& g = checked(s_);
  std::lock_guard lock(g.mutex);
  if (n.index >= g.nodes.size()) throw error(errc::out_of_range, "no such node in the graph");
  switch (g.nodes[n.index].desc.k) {
    case kind::empty: return graph_node_kind::empty;
    case kind::copy: return graph_node_kind::copy;
    case kind::fill: return graph_node_kind::fill;
    case kind::launch: return graph_node_kind::launch;
    case kind::host_call: return graph_node_kind::host_call;
  }
  return graph_node_kind::empty;
}

graph_node graph::node(std::size_t i) const {
  if (i >= size()) throw error(errc::out_of_range, "no node " + std::to_string(i) + " in the graph");
  return {i};
}

cora::device& graph::device() const { return checked(s_).device->handle; }

namespace {

std::shared_ptr<detail::exec_instance> instantiate_nodes(detail::device_state& dev,
                                                         std::vector<graph_node_rec> nodes,
                                                         std::error_code& ec) {
  if (dev.shut_down.load(std::memory_order_acquire)) {
    detail::set_error(ec, errc::runtime_shut_down, "the runtime was shut down");
    return nullptr;
  }
  auto inst = std::make_shared<detail::exec_instance>();
  inst->nodes = std::move(nodes);
  const auto descs = detail::graph_state::descs(inst->nodes);
  std::string message;
  inst->backend = dev.backend->instantiate(descs, ec, message);
  if (ec || !inst->backend) {
    if (!ec) ec = make_error_code(errc::driver_error);
    detail::set_error(ec, ec, "cannot instantiate the graph on " + dev.properties.name + ": " + message);
    return nullptr;
  }
  return inst;
}

std::vector<graph_node_rec> snapshot(const detail::graph_state& g) {
  std::lock_guard lock(g.mutex);
  return g.nodes;
}

}  // namespace

graph_exec graph::instantiate(std::error_code& ec) const {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty graph handle");
    return {};
  }
  auto inst = instantiate_nodes(*s_->device, snapshot(*s_), ec);
  if (!inst) return {};
  auto st = std::make_shared<detail::graph_exec_state>();
  st->device = s_->device;
  st->current = std::move(inst);
  ec.clear();
  return graph_exec(std::move(st));
}

graph_exec graph::instantiate() const {
  std::error_code ec;
  graph_exec e = instantiate(ec);
  detail::throw_if(ec);
  return e;
}

// --- graph_exec ---------------------------------------------------------------------------

namespace {

// The same nodes (kinds, dependencies, kernels): what may be updated in place.
bool same_shape(const std::vector<graph_node_rec>& a, const std::vector<graph_node_rec>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].desc.k != b[i].desc.k || a[i].desc.deps != b[i].desc.deps || a[i].kernel != b[i].kernel ||
        a[i].desc.launch.config.grid != b[i].desc.launch.config.grid ||
        a[i].desc.launch.config.block != b[i].desc.launch.config.block)
      return false;
  return true;
}

}  // namespace

pending<void> graph_exec::launch(stream& s) {
  if (!s_) return pending<void>(detail::failed_op(make_error_code(errc::invalid_handle), "empty graph_exec handle", nullptr));
  if (!s) return pending<void>(detail::failed_op(make_error_code(errc::invalid_handle), "empty stream handle", nullptr));
  auto* st = s.state();
  if (st->device != s_->device)
    return pending<void>(detail::failed_op(make_error_code(errc::wrong_device),
                                           "the graph was instantiated for " + s_->device->properties.name +
                                               ", not for " + st->device->properties.name,
                                           st));
  if (st->capturing.load(std::memory_order_acquire))
    return detail::capture_illegal(*st, "graph_exec.launch()");
  // The instantiation's lock is held while the backend enqueues it, so a concurrent
  // parameter change is seen whole or not at all (lock order: instantiation, then stream).
  std::lock_guard lock(s_->mutex);
  const std::shared_ptr<detail::exec_instance>& inst = s_->current;
  return pending<void>(st->enqueue(
      [&](std::uint64_t seq, std::error_code& ec, std::string& message) {
        st->backend->launch_graph(seq, *inst->backend, ec, message);
      },
      std::shared_ptr<const void>(inst)));
}

graph_update graph_exec::update(const graph& g, std::error_code& ec) {
  if (!s_ || !g) {
    detail::set_error(ec, errc::invalid_handle, !s_ ? "empty graph_exec handle" : "empty graph handle");
    return graph_update::in_place;
  }
  if (g.state()->device != s_->device) {
    detail::set_error(ec, errc::wrong_device, "the graph belongs to another device than the instantiation");
    return graph_update::in_place;
  }
  auto nodes = snapshot(*g.state());
  {
    std::lock_guard lock(s_->mutex);
    auto& cur = *s_->current;
    if (same_shape(cur.nodes, nodes)) {
      const auto descs = detail::graph_state::descs(nodes);
      std::string why;
      if (cur.backend->update(descs, why)) {
        // The kernels are the same objects, so launches in flight that keep this instance
        // still keep theirs alive with the new records.
        cur.nodes = std::move(nodes);
        ec.clear();
        return graph_update::in_place;
      }
    }
  }
  auto inst = instantiate_nodes(*s_->device, std::move(nodes), ec);
  if (!inst) return graph_update::reinstantiated;
  std::lock_guard lock(s_->mutex);
  s_->current = std::move(inst);  // launches in flight keep the previous one
  ec.clear();
  return graph_update::reinstantiated;
}

graph_update graph_exec::update(const graph& g) {
  std::error_code ec;
  const graph_update u = update(g, ec);
  detail::throw_if(ec);
  return u;
}

void graph_exec::set_launch_typed(graph_node n, std::span<const detail::arg_view> args, std::error_code& ec) {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty graph_exec handle");
    return;
  }
  std::lock_guard lock(s_->mutex);
  auto& inst = *s_->current;
  if (n.index >= inst.nodes.size() || inst.nodes[n.index].desc.k != kind::launch) {
    detail::set_error(ec, errc::invalid_argument,
                      "node " + (n ? std::to_string(n.index) : std::string("(none)")) +
                          " is no launch node of the graph");
    return;
  }
  const auto& rec = inst.nodes[n.index];
  std::vector<std::byte> block;
  if (!detail::pack_typed(*s_->device, *rec.kernel, args, block, ec)) return;
  backend::launch_desc d = rec.desc.launch;
  d.args = block.data();
  d.args_size = block.size();
  d.device_args = nullptr;
  std::string message;
  inst.backend->set_launch(n.index, d, ec, message);
  if (ec) detail::set_error(ec, ec, "cannot set the arguments of node " + std::to_string(n.index) + ": " + message);
}

void graph_exec::set_copy(graph_node n, void* dst, const void* src, std::size_t bytes, std::error_code& ec) {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty graph_exec handle");
    return;
  }
  bool dst_host = false, src_host = false;
  if (!detail::check_memory(*s_->device, dst, src, bytes, dst_host, src_host, ec)) return;
  std::lock_guard lock(s_->mutex);
  auto& inst = *s_->current;
  if (n.index >= inst.nodes.size() || inst.nodes[n.index].desc.k != kind::copy) {
    detail::set_error(ec, errc::invalid_argument,
                      "node " + (n ? std::to_string(n.index) : std::string("(none)")) +
                          " is no copy node of the graph");
    return;
  }
  std::string message;
  inst.backend->set_copy(n.index, dst, src, bytes, dst_host, src_host, ec, message);
  if (ec) detail::set_error(ec, ec, "cannot set copy node " + std::to_string(n.index) + ": " + message);
}

void graph_exec::set_copy(graph_node n, void* dst, const void* src, std::size_t bytes) {
  std::error_code ec;
  set_copy(n, dst, src, bytes, ec);
  detail::throw_if(ec);
}

void graph_exec::throw_if_error(const std::error_code& ec) { detail::throw_if(ec); }

cora::device& graph_exec::device() const {
  if (!s_) throw error(errc::invalid_handle, "empty graph_exec handle");
  return s_->device->handle;
}

// --- capture ------------------------------------------------------------------------------

void stream::begin_capture(std::error_code& ec) {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty stream handle");
    return;
  }
  auto* s = st();
  std::lock_guard lock(s->enqueue_mutex());
  if (s->capturing.load(std::memory_order_relaxed)) {
    detail::set_error(ec, errc::illegal_in_capture, "begin_capture() on a stream that is already capturing");
    return;
  }
  auto cs = std::make_shared<detail::capture_session>();
  cs->graph = detail::new_graph(s->device);
  cs->origin = s;
  cs->streams.push_back({detail::intrusive_ptr<detail::stream_state>::share(s), {}});
  s->capture = std::move(cs);
  s->capturing.store(true, std::memory_order_release);
  ec.clear();
}

void stream::begin_capture() {
  std::error_code ec;
  begin_capture(ec);
  detail::throw_if(ec);
}

graph stream::end_capture(std::error_code& ec) {
  if (!s_) {
    detail::set_error(ec, errc::invalid_handle, "empty stream handle");
    return {};
  }
  auto* s = st();
  auto cs = detail::capture_of(*s);
  if (!cs) {
    detail::set_error(ec, errc::invalid_argument, "end_capture() on a stream that is not capturing");
    return {};
  }
  std::vector<detail::capture_session::member> members;
  std::error_code failure;
  std::string message;
  {
    std::lock_guard lock(cs->mutex);
    if (cs->origin != s) {
      detail::set_error(ec, errc::invalid_argument,
                        "end_capture() on a stream that joined the capture; end it on the stream "
                        "that began it");
      return {};
    }
    cs->ended = true;
    members = std::move(cs->streams);
    cs->streams.clear();
    failure = cs->error;
    message = cs->message;
    if (!failure) {
      // Every stream that joined must have been joined back: its last nodes must come before
      // the origin's.
      std::set<std::size_t> before;
      std::vector<std::size_t> todo = members[0].frontier;
      const auto& nodes = cs->graph->nodes;
      while (!todo.empty()) {
        const std::size_t n = todo.back();
        todo.pop_back();
        if (!before.insert(n).second) continue;
        for (std::size_t d : nodes[n].desc.deps) todo.push_back(d);
      }
      for (std::size_t i = 1; i < members.size() && !failure; ++i)
        for (std::size_t n : members[i].frontier)
          if (!before.count(n)) {
            failure = make_error_code(errc::illegal_in_capture);
            message = "a stream that joined the capture was not joined back into the stream that "
                      "began it (record an event on it and wait for that event on the origin "
                      "stream before end_capture())";
            break;
          }
    }
  }
  for (auto& m : members) detail::leave_capture(*m.stream);
  if (failure) {
    detail::set_error(ec, failure, "the capture was abandoned: " + message);
    return {};
  }
  ec.clear();
  return graph(cs->graph);
}

graph stream::end_capture() {
  std::error_code ec;
  graph g = end_capture(ec);
  detail::throw_if(ec);
  return g;
}

bool stream::capturing() const noexcept { return s_ && st()->capturing.load(std::memory_order_acquire); }

pending<graph> stream::capture_result(graph g, std::error_code ec) {
  auto state = detail::make_intrusive<detail::async_state<graph>>();
  if (ec) {
    state->complete(ec, last_error_message());
  } else {
    state->set_value(std::move(g));
    state->complete({});
  }
  return pending<graph>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(state)), 0));
}

void stream::abandon_capture() noexcept {
  if (!s_ || !st()->capturing.load(std::memory_order_acquire)) return;
  auto cs = detail::capture_of(*st());
  if (!cs) return;
  detail::capture_invalidate(*st(), make_error_code(errc::illegal_in_capture),
                             "a stream taking part in it was dropped, or the capture body threw");
  if (cs->origin == st()) {
    std::error_code ec;
    (void)end_capture(ec);
    return;
  }
  // A stream that joined: it leaves; the origin's end_capture() reports the abandoned capture.
  {
    std::lock_guard lock(cs->mutex);
    auto& v = cs->streams;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& m) { return m.stream.get() == st(); }), v.end());
  }
  detail::leave_capture(*st());
}

}  // namespace cora
