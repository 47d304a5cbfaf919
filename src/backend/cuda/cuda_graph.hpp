// Graphs on CUDA: the core's node list becomes a CUgraph built node by node
// (cuGraphAddKernelNode, cuGraphAddMemcpyNode, cuGraphAddMemsetNode, cuGraphAddHostNode,
// cuGraphAddEmptyNode), instantiated with cuGraphInstantiateWithFlags and uploaded with
// cuGraphUpload; a launch is one cuGraphLaunch, after which the core records its usual marker.
// Parameter changes go through cuGraphExecKernelNodeSetParams, cuGraphExecMemcpyNodeSetParams
// and cuGraphExecUpdate (which may refuse: the core then instantiates anew).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_stream.hpp"

namespace cora::backend::cuda {

class cuda_device;
class cuda_graph_exec;

/// Where a host-call node reports an exception: the stream and op of the latest launch.
struct graph_fault_sink {
  std::mutex mutex;
  std::shared_ptr<stream_faults> faults;
  std::uint64_t seq = 0;
};

/// A host-call node's function; owned by the instantiation.
struct graph_host_call {
  std::function<void()> fn;
  std::shared_ptr<graph_fault_sink> sink;
};

class cuda_graph_exec final : public graph_exec {
 public:
  cuda_graph_exec(cuda_device& device, std::shared_ptr<context> ctx) noexcept
      : device_(device), ctx_(std::move(ctx)), sink_(std::make_shared<graph_fault_sink>()) {}
  ~cuda_graph_exec() override;

  /// Builds, instantiates and uploads `nodes`.
  bool build(std::span<const graph_node_desc> nodes, std::error_code& ec, std::string& message);

  void set_launch(std::size_t node, const launch_desc& launch, std::error_code& ec,
                  std::string& message) override;
  void set_copy(std::size_t node, void* dst, const void* src, std::size_t bytes, bool dst_host,
                bool src_host, std::error_code& ec, std::string& message) override;
  bool update(std::span<const graph_node_desc> nodes, std::string& message) override;

  CUgraphExec handle() const noexcept { return exec_; }
  graph_fault_sink& sink() noexcept { return *sink_; }

 private:
  /// Adds `nodes` to a new graph `g`; node handles go to `handles`, host calls to `host`.
  bool add_nodes(CUgraph g, std::span<const graph_node_desc> nodes, std::vector<CUgraphNode>& handles,
                 std::vector<std::unique_ptr<graph_host_call>>& host, std::error_code& ec,
                 std::string& message);

  cuda_device& device_;
  std::shared_ptr<context> ctx_;
  std::shared_ptr<graph_fault_sink> sink_;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  std::vector<CUgraphNode> nodes_;
  std::vector<std::unique_ptr<graph_host_call>> host_;  // of every graph the exec took
};

}  // namespace cora::backend::cuda
