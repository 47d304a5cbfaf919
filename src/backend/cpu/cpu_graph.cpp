#include "backend/cpu/cpu_graph.hpp"

namespace cora::backend::cpu {

namespace {

bool make_node(cpu_device& device, const graph_node_desc& d, graph_node& n, std::error_code& ec,
               std::string& message) {
  n = graph_node{};
  n.k = d.k;
  switch (d.k) {
    case graph_node_desc::kind::empty:
      return true;
    case graph_node_desc::kind::copy:
    case graph_node_desc::kind::fill:
      n.dst = static_cast<std::byte*>(d.dst);
      n.src = static_cast<const std::byte*>(d.src);
      n.bytes = d.bytes;
      n.value = d.value;
      return true;
    case graph_node_desc::kind::launch:
      if (!device.check_launch(d.launch.config, ec, message)) return false;
      n.entry = reinterpret_cast<cora_cpu_entry_fn>(d.launch.function);
      n.config = d.launch.config;
      if (d.launch.device_args)
        n.device_args = d.launch.device_args;
      else
        n.args.assign(static_cast<const std::byte*>(d.launch.args),
                      static_cast<const std::byte*>(d.launch.args) + d.launch.args_size);
      return true;
    case graph_node_desc::kind::host_call:
      n.fn = d.fn;
      return true;
  }
  return true;
}

}  // namespace

bool make_nodes(cpu_device& device, std::span<const graph_node_desc> in, graph_nodes& out,
                std::error_code& ec, std::string& message) {
  out.nodes.resize(in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    if (!make_node(device, in[i], out.nodes[i], ec, message)) {
      message = "node " + std::to_string(i) + ": " + message;
      return false;
    }
  return true;
}

std::shared_ptr<const graph_nodes> cpu_graph_exec::snapshot() const {
  std::lock_guard lock(mutex_);
  return nodes_;
}

graph_nodes& cpu_graph_exec::writable() {
  // Launches in flight read the list they hold without a lock, so a change always goes to a
  // fresh copy (use_count() == 1 would not tell that the last reader is done with it).
  auto copy = std::make_shared<graph_nodes>(*nodes_);
  graph_nodes& out = *copy;
  nodes_ = std::move(copy);
  return out;
}

void cpu_graph_exec::set_launch(std::size_t node, const launch_desc& launch, std::error_code& ec,
                                std::string& message) {
  std::lock_guard lock(mutex_);
  if (node >= nodes_->nodes.size() || nodes_->nodes[node].k != graph_node_desc::kind::launch) {
    ec = make_error_code(errc::invalid_argument);
    message = "no launch node";
    return;
  }
  graph_node n;
  graph_node_desc d;
  d.k = graph_node_desc::kind::launch;
  d.launch = launch;
  if (!make_node(device_, d, n, ec, message)) return;
  writable().nodes[node] = std::move(n);
  ec.clear();
}

void cpu_graph_exec::set_copy(std::size_t node, void* dst, const void* src, std::size_t bytes, bool,
                              bool, std::error_code& ec, std::string& message) {
  std::lock_guard lock(mutex_);
  if (node >= nodes_->nodes.size() || nodes_->nodes[node].k != graph_node_desc::kind::copy) {
    ec = make_error_code(errc::invalid_argument);
    message = "no copy node";
    return;
  }
  auto& n = writable().nodes[node];
  n.dst = static_cast<std::byte*>(dst);
  n.src = static_cast<const std::byte*>(src);
  n.bytes = bytes;
  ec.clear();
}

bool cpu_graph_exec::update(std::span<const graph_node_desc> nodes, std::string& message) {
  auto fresh = std::make_shared<graph_nodes>();
  std::error_code ec;
  if (!make_nodes(device_, nodes, *fresh, ec, message)) return false;
  std::lock_guard lock(mutex_);
  nodes_ = std::move(fresh);
  return true;
}

std::unique_ptr<graph_exec> cpu_device::instantiate(std::span<const graph_node_desc> nodes,
                                                    std::error_code& ec, std::string& message) {
  if (lost()) {
    ec = make_error_code(errc::device_lost);
    message = "device lost";
    return nullptr;
  }
  auto list = std::make_shared<graph_nodes>();
  if (!make_nodes(*this, nodes, *list, ec, message)) return nullptr;
  ec.clear();
  return std::make_unique<cpu_graph_exec>(*this, std::move(list));
}

void cpu_stream::launch_graph(std::uint64_t seq, graph_exec& graph, std::error_code& ec,
                              std::string&) {
  auto* o = device_.ops().take();
  o->k = op::kind::graph;
  o->seq = seq;
  o->graph = static_cast<cpu_graph_exec&>(graph).snapshot();
  ec.clear();
  push(o);
}

op* cpu_device::next_graph_op(op* parent) {
  const auto& nodes = parent->graph->nodes;
  while (parent->graph_next < nodes.size()) {
    // A failed node ends the graph: later nodes may depend on it.
    if (parent->status.load(std::memory_order_acquire) != CORA_CPU_OK) return nullptr;
    if (__atomic_load_n(&parent->abort, __ATOMIC_RELAXED) != 0 || lost()) {
      int expected = CORA_CPU_OK;
      if (parent->status.compare_exchange_strong(expected, CORA_CPU_ABORTED, std::memory_order_acq_rel))
        parent->message = "graph aborted: device lost or shut down";
      return nullptr;
    }
    const graph_node& n = nodes[parent->graph_next++];
    if (n.k == graph_node_desc::kind::empty) continue;
    auto* o = ops_.take();
    o->parent = parent;
    o->stream = parent->stream;
    o->seq = parent->seq;
    switch (n.k) {
      case graph_node_desc::kind::copy:
      case graph_node_desc::kind::fill:
        o->k = n.k == graph_node_desc::kind::copy ? op::kind::copy : op::kind::fill;
        o->dst = n.dst;
        o->src = n.src;
        o->bytes = n.bytes;
        o->value = n.value;
        if (fault_injection::take(faults_.copy_faults)) o->fault = op::injected::copy_fault;
        break;
      case graph_node_desc::kind::launch: {
        const auto& cfg = n.config;
        o->k = op::kind::launch;
        o->entry = n.entry;
        // The node's block lives as long as the launch holds the node list.
        o->device_args = n.device_args ? n.device_args : static_cast<const void*>(n.args.data());
        o->grid = static_cast<std::uint32_t>(cfg.grid.volume());
        o->launch.grid[0] = cfg.grid.x;
        o->launch.grid[1] = cfg.grid.y;
        o->launch.grid[2] = cfg.grid.z;
        o->launch.block_count = o->grid;
        o->timeout_ns = static_cast<std::uint64_t>(cfg.timeout.count()) * 1000u;
        if (fault_injection::take(faults_.kernel_traps))
          o->fault = op::injected::trap;
        else if (fault_injection::take(faults_.stuck_kernels))
          o->fault = op::injected::stuck;
        break;
      }
      case graph_node_desc::kind::host_call:
        o->k = op::kind::host_func;
        o->fn = n.fn;
        break;
      case graph_node_desc::kind::empty:
        break;
    }
    return o;
  }
  return nullptr;
}

}  // namespace cora::backend::cpu
