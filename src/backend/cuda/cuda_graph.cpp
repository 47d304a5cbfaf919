#include "backend/cuda/cuda_graph.hpp"

#include <cstring>

#include "backend/cuda/cuda_device.hpp"
#include "backend/cuda/cuda_module.hpp"
#include "cora/detail/arg_layout.hpp"

namespace cora::backend::cuda {

namespace {

void CUDA_CB run_graph_host_call(void* data) {
  auto* call = static_cast<graph_host_call*>(data);
  auto report = [&](std::string what) {
    std::lock_guard lock(call->sink->mutex);
    if (call->sink->faults)
      call->sink->faults->record(call->sink->seq, make_error_code(errc::kernel_fault), std::move(what));
  };
  try {
    call->fn();
  } catch (const std::exception& e) {
    report(std::string("host function threw: ") + e.what());
  } catch (...) {
    report("host function threw");
  }
}

CUDA_MEMCPY3D copy_params(void* dst, const void* src, std::size_t bytes, bool dst_host, bool src_host) {
  CUDA_MEMCPY3D p{};
  if (src_host) {
    p.srcMemoryType = CU_MEMORYTYPE_HOST;
    p.srcHost = src;
  } else {
    p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = reinterpret_cast<CUdeviceptr>(src);
  }
  if (dst_host) {
    p.dstMemoryType = CU_MEMORYTYPE_HOST;
    p.dstHost = dst;
  } else {
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
  }
  p.WidthInBytes = bytes;
  p.Height = 1;
  p.Depth = 1;
  return p;
}

// Kernel node parameters; `pointers` receives one pointer per parameter into the canonical
// block (the driver copies the values when it takes the parameters).
bool kernel_params(const launch_desc& l, cuda_device& device, std::vector<void*>& pointers,
                   CUDA_KERNEL_NODE_PARAMS& p, std::error_code& ec, std::string& message) {
  auto* fn = static_cast<cuda_function*>(l.function);
  const kernel_desc& k = *l.kernel;
  const launch_config& cfg = l.config;
  auto reject = [&](errc e, std::string why) {
    ec = make_error_code(e);
    message = "kernel '" + k.name + "': " + std::move(why);
    return false;
  };
  if (l.device_args)
    return reject(errc::not_supported, "the CUDA backend takes launch arguments from host memory only");
  if (cfg.timeout.count() != 0)
    return reject(errc::not_supported, "CUDA cannot stop a kernel after a timeout: launch_config::timeout must be 0");
  if (cfg.cooperative || cfg.schedule == schedule_mode::batch || cfg.cluster || cfg.priority)
    return reject(errc::not_supported,
                  "graph launches take no cooperative, batch, cluster or priority attributes yet");
  const std::size_t n = k.params.size();
  if (n != fn->sizes.size())
    return reject(errc::argument_mismatch, "the device image has " + std::to_string(fn->sizes.size()) +
                                               " parameters, its metadata " + std::to_string(n));
  pointers.resize(n);
  std::size_t end = 0;
  auto* block = static_cast<std::byte*>(const_cast<void*>(l.args));
  for (std::size_t i = 0; i < n; ++i) {
    if (k.params[i].size != fn->sizes[i])
      return reject(errc::argument_mismatch, "parameter " + std::to_string(i) + " has " +
                                                 std::to_string(fn->sizes[i]) + " bytes in the device image but " +
                                                 std::to_string(k.params[i].size) + " in its metadata");
    const std::size_t offset = detail::next_param_offset(end, k.params[i].align);
    end = offset + k.params[i].size;
    pointers[i] = block + offset;
  }
  if (n && (!block || end > l.args_size))
    return reject(errc::argument_mismatch, "the argument block holds " + std::to_string(l.args_size) +
                                               " bytes; the parameters need " + std::to_string(end));
  // Beyond what the kernel allows so far (48 KiB by default), it must opt in first.
  std::uint32_t allowed = fn->dynamic_shared_limit.load(std::memory_order_relaxed);
  if (cfg.shared_bytes > allowed) {
    const std::uint64_t total = std::uint64_t{cfg.shared_bytes} + static_cast<std::uint64_t>(fn->static_shared);
    if (total > device.limits().max_shared_optin)
      return reject(errc::invalid_launch_config, "a block needs " + std::to_string(total) +
                                                     " bytes of shared memory; " + device.label() + " allows " +
                                                     std::to_string(device.limits().max_shared_optin));
    const CUresult r = device.ctx()->api.cuFuncSetAttribute(
        fn->handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(cfg.shared_bytes));
    if (r != CUDA_SUCCESS)
      return reject(errc::invalid_launch_config, "cannot allow " + std::to_string(cfg.shared_bytes) +
                                                     " bytes of dynamic shared memory: " + describe(r));
    while (allowed < cfg.shared_bytes &&
           !fn->dynamic_shared_limit.compare_exchange_weak(allowed, cfg.shared_bytes, std::memory_order_relaxed)) {
    }
  }
  p = CUDA_KERNEL_NODE_PARAMS{};
  p.func = fn->handle;
  p.gridDimX = cfg.grid.x;
  p.gridDimY = cfg.grid.y;
  p.gridDimZ = cfg.grid.z;
  p.blockDimX = cfg.block.x;
  p.blockDimY = cfg.block.y;
  p.blockDimZ = cfg.block.z;
  p.sharedMemBytes = cfg.shared_bytes;
  p.kernelParams = n ? pointers.data() : nullptr;
  return true;
}

}  // namespace

cuda_graph_exec::~cuda_graph_exec() {
  // The core destroys an instantiation only once no launch of it is in flight.
  current_context cur(*ctx_);
  if (exec_) ctx_->api.cuGraphExecDestroy(exec_);
  if (graph_) ctx_->api.cuGraphDestroy(graph_);
}

bool cuda_graph_exec::add_nodes(CUgraph g, std::span<const graph_node_desc> nodes,
                                std::vector<CUgraphNode>& handles,
                                std::vector<std::unique_ptr<graph_host_call>>& host, std::error_code& ec,
                                std::string& message) {
  const driver_api& api = ctx_->api;
  handles.assign(nodes.size(), nullptr);
  std::vector<CUgraphNode> deps;
  std::vector<void*> pointers;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const graph_node_desc& d = nodes[i];
    deps.clear();
    for (std::size_t j : d.deps) deps.push_back(handles[j]);
    const CUgraphNode* dp = deps.empty() ? nullptr : deps.data();
    CUresult r = CUDA_SUCCESS;
    const char* what = "";
    auto add_host = [&](std::function<void()> fn) {
      host.push_back(std::make_unique<graph_host_call>(graph_host_call{std::move(fn), sink_}));
      CUDA_HOST_NODE_PARAMS hp{};
      hp.fn = &run_graph_host_call;
      hp.userData = host.back().get();
      what = "cuGraphAddHostNode";
      return api.cuGraphAddHostNode(&handles[i], g, dp, deps.size(), &hp);
    };
    switch (d.k) {
      case graph_node_desc::kind::empty:
        what = "cuGraphAddEmptyNode";
        r = api.cuGraphAddEmptyNode(&handles[i], g, dp, deps.size());
        break;
      case graph_node_desc::kind::copy: {
        const CUDA_MEMCPY3D p = copy_params(d.dst, d.src, d.bytes, d.dst_host, d.src_host);
        what = "cuGraphAddMemcpyNode";
        r = api.cuGraphAddMemcpyNode(&handles[i], g, dp, deps.size(), &p, ctx_->handle);
        break;
      }
      case graph_node_desc::kind::fill:
        if (d.dst_host) {
          // Host memory the device cannot address: set it on the host, in graph order.
          void* dst = d.dst;
          const std::uint8_t value = d.value;
          const std::size_t bytes = d.bytes;
          r = add_host([dst, value, bytes] { std::memset(dst, value, bytes); });
        } else {
          CUDA_MEMSET_NODE_PARAMS p{};
          p.dst = reinterpret_cast<CUdeviceptr>(d.dst);
          p.value = d.value;
          p.elementSize = 1;
          p.width = d.bytes;
          p.height = 1;
          what = "cuGraphAddMemsetNode";
          r = api.cuGraphAddMemsetNode(&handles[i], g, dp, deps.size(), &p, ctx_->handle);
        }
        break;
      case graph_node_desc::kind::launch: {
        CUDA_KERNEL_NODE_PARAMS p;
        if (!kernel_params(d.launch, device_, pointers, p, ec, message)) {
          message = "node " + std::to_string(i) + ": " + message;
          return false;
        }
        what = "cuGraphAddKernelNode";
        r = api.cuGraphAddKernelNode(&handles[i], g, dp, deps.size(), &p);
        break;
      }
      case graph_node_desc::kind::host_call:
        r = add_host(d.fn);
        break;
    }
    if (r != CUDA_SUCCESS) {
      ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
      message = "node " + std::to_string(i) + ": " + what + ": " + describe(r);
      return false;
    }
  }
  return true;
}

bool cuda_graph_exec::build(std::span<const graph_node_desc> nodes, std::error_code& ec,
                            std::string& message) {
  const driver_api& api = ctx_->api;
  if (!api.cuGraphCreate || !api.cuGraphInstantiateWithFlags || !api.cuGraphLaunch ||
      !api.cuGraphExecUpdate || !api.cuGraphAddKernelNode) {
    ec = make_error_code(errc::not_supported);
    message = "the NVIDIA driver lacks the graph API of CUDA 12";
    return false;
  }
  current_context cur(*ctx_);
  if (!cur) {
    ec = ctx_->note(cur.result) ? make_error_code(errc::device_lost) : to_error_code(cur.result);
    message = "cannot make the context current: " + describe(cur.result);
    return false;
  }
  CUresult r = api.cuGraphCreate(&graph_, 0);
  if (r != CUDA_SUCCESS) {
    ec = to_error_code(r);
    message = "cuGraphCreate: " + describe(r);
    return false;
  }
  if (!add_nodes(graph_, nodes, nodes_, host_, ec, message)) return false;
  r = api.cuGraphInstantiateWithFlags(&exec_, graph_, 0);
  if (r != CUDA_SUCCESS) {
    exec_ = nullptr;
    ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
    message = "cuGraphInstantiateWithFlags: " + describe(r);
    return false;
  }
  // Uploading now keeps the first launch as cheap as the later ones.
  if (api.cuGraphUpload) {
    r = api.cuGraphUpload(exec_, nullptr);
    if (r != CUDA_SUCCESS) {
      ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
      message = "cuGraphUpload: " + describe(r);
      return false;
    }
  }
  ec.clear();
  return true;
}

void cuda_graph_exec::set_launch(std::size_t node, const launch_desc& launch, std::error_code& ec,
                                 std::string& message) {
  std::vector<void*> pointers;
  CUDA_KERNEL_NODE_PARAMS p;
  if (!kernel_params(launch, device_, pointers, p, ec, message)) return;
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuGraphExecKernelNodeSetParams(exec_, nodes_.at(node), &p) : cur.result;
  if (r != CUDA_SUCCESS) {
    ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
    message = "cuGraphExecKernelNodeSetParams: " + describe(r);
    return;
  }
  ec.clear();
}

void cuda_graph_exec::set_copy(std::size_t node, void* dst, const void* src, std::size_t bytes,
                               bool dst_host, bool src_host, std::error_code& ec, std::string& message) {
  const CUDA_MEMCPY3D p = copy_params(dst, src, bytes, dst_host, src_host);
  current_context cur(*ctx_);
  const CUresult r =
      cur ? ctx_->api.cuGraphExecMemcpyNodeSetParams(exec_, nodes_.at(node), &p, ctx_->handle) : cur.result;
  if (r != CUDA_SUCCESS) {
    ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
    message = "cuGraphExecMemcpyNodeSetParams: " + describe(r);
    return;
  }
  ec.clear();
}

bool cuda_graph_exec::update(std::span<const graph_node_desc> nodes, std::string& message) {
  const driver_api& api = ctx_->api;
  current_context cur(*ctx_);
  if (!cur) {
    message = "cannot make the context current: " + describe(cur.result);
    return false;
  }
  CUgraph g = nullptr;
  CUresult r = api.cuGraphCreate(&g, 0);
  if (r != CUDA_SUCCESS) {
    message = "cuGraphCreate: " + describe(r);
    return false;
  }
  std::vector<CUgraphNode> handles;
  std::vector<std::unique_ptr<graph_host_call>> host;
  std::error_code ec;
  bool ok = add_nodes(g, nodes, handles, host, ec, message);
  if (ok) {
    CUgraphExecUpdateResultInfo info{};
    r = api.cuGraphExecUpdate(exec_, g, &info);
    ok = r == CUDA_SUCCESS;
    if (!ok) message = "cuGraphExecUpdate refused the graph: " + describe(r) + " (result " +
                       std::to_string(static_cast<int>(info.result)) + ")";
  }
  api.cuGraphDestroy(g);
  // Host calls of the new graph are what the exec now calls; those of earlier graphs may still
  // be called by launches in flight.
  if (ok)
    for (auto& h : host) host_.push_back(std::move(h));
  return ok;
}

std::unique_ptr<graph_exec> cuda_device::instantiate(std::span<const graph_node_desc> nodes,
                                                     std::error_code& ec, std::string& message) {
  if (ctx_->lost()) {
    ec = make_error_code(errc::device_lost);
    message = label_ + " is unusable after an earlier fault: " + ctx_->lost_message();
    return nullptr;
  }
  auto exec = std::make_unique<cuda_graph_exec>(*this, ctx_);
  if (!exec->build(nodes, ec, message)) return nullptr;
  return exec;
}

void cuda_stream::launch_graph(std::uint64_t seq, graph_exec& graph, std::error_code& ec,
                               std::string& message) {
  auto& g = static_cast<cuda_graph_exec&>(graph);
  if (ctx_->lost()) {
    ec = make_error_code(errc::device_lost);
    message = device_.label() + " is unusable after an earlier fault: " + ctx_->lost_message();
    return;
  }
  {
    // A host-call node that throws fails this op.
    std::lock_guard lock(g.sink().mutex);
    g.sink().faults = faults_;
    g.sink().seq = seq;
  }
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuGraphLaunch(g.handle(), stream_) : cur.result;
  if (r != CUDA_SUCCESS) {
    ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
    message = "cuGraphLaunch: " + describe(r);
    return;
  }
  ec.clear();
}

}  // namespace cora::backend::cuda
