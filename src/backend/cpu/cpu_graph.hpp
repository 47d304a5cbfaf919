// Graphs on the CPU device: an instantiated graph is its list of nodes, replayed in order (an
// order the core guarantees to be topological, so every dependency has run before its node)
// as one op of the stream that launches it. Each node runs as a child op on the worker pool,
// with the pool's parallelism inside launches and large copies.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_device.hpp"

namespace cora::backend::cpu {

struct graph_node {
  graph_node_desc::kind k = graph_node_desc::kind::empty;
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::size_t bytes = 0;
  std::uint8_t value = 0;
  cora_cpu_entry_fn entry = nullptr;
  std::vector<std::byte> args;
  const void* device_args = nullptr;
  launch_config config;
  std::function<void()> fn;
};

/// The node list a launch replays; immutable once a launch holds it.
struct graph_nodes {
  std::vector<graph_node> nodes;
};

class cpu_graph_exec final : public graph_exec {
 public:
  cpu_graph_exec(cpu_device& device, std::shared_ptr<const graph_nodes> nodes)
      : device_(device), nodes_(std::move(nodes)) {}

  void set_launch(std::size_t node, const launch_desc& launch, std::error_code& ec,
                  std::string& message) override;
  void set_copy(std::size_t node, void* dst, const void* src, std::size_t bytes, bool dst_host,
                bool src_host, std::error_code& ec, std::string& message) override;
  bool update(std::span<const graph_node_desc> nodes, std::string& message) override;

  /// The nodes a launch enqueued now runs.
  std::shared_ptr<const graph_nodes> snapshot() const;

 private:
  /// A fresh copy of the node list to change (launches in flight keep the one they hold).
  graph_nodes& writable();

  cpu_device& device_;
  mutable std::mutex mutex_;
  std::shared_ptr<const graph_nodes> nodes_;
};

/// Converts and checks the nodes as the device would check each op.
bool make_nodes(cpu_device& device, std::span<const graph_node_desc> in, graph_nodes& out,
                std::error_code& ec, std::string& message);

}  // namespace cora::backend::cpu
