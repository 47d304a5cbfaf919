// The core's side of graphs (cora/graph.hpp): templates, instantiations, and stream capture.
//
// Capture happens in the core, not in the driver: while a stream captures, its ops are checked
// as usual and then become nodes of a graph instead of being enqueued (stream.cpp asks
// capturing() before each enqueue and hands the op here). Events recorded during a capture
// carry the capturing stream's last nodes, so a stream that waits for one joins the capture
// (a fork) and an origin stream that waits for an event of a forked stream joins it back. So
// no driver capture is ever open, the engine never sees a captured op (no position, no marker),
// and the same graph runs on every backend.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/state.hpp"
#include "cora/graph.hpp"
#include "cora/pending.hpp"

namespace cora::detail {

/// One node of a template: what the backend gets, and what keeps its kernel alive.
struct graph_node_rec {
  backend::graph_node_desc desc;          // launch.args is set from `args` when handed over
  std::vector<std::byte> args;            // canonical argument block of a launch
  std::shared_ptr<kernel_state> kernel;   // launches: the kernel and its loaded module
  std::shared_ptr<backend::module> module;
};

class graph_state {
 public:
  std::shared_ptr<device_state> device;
  mutable std::mutex mutex;
  std::vector<graph_node_rec> nodes;

  /// Appends a node after `deps` (checked: earlier nodes); returns its index.
  std::size_t add(graph_node_rec rec, std::span<const std::size_t> deps);
  /// The nodes as the backend takes them (argument blocks point into `nodes`).
  static std::vector<backend::graph_node_desc> descs(const std::vector<graph_node_rec>& nodes);
};

/// One instantiation; launches in flight keep it (and so its kernels) alive.
struct exec_instance {
  std::unique_ptr<backend::graph_exec> backend;
  std::vector<graph_node_rec> nodes;
};

class graph_exec_state {
 public:
  std::shared_ptr<device_state> device;
  std::mutex mutex;
  std::shared_ptr<exec_instance> current;
};

/// A capture in progress: the graph being built and, for each stream taking part, the nodes
/// its next op depends on.
struct capture_session {
  std::mutex mutex;
  std::shared_ptr<graph_state> graph;
  stream_state* origin = nullptr;
  struct member {
    intrusive_ptr<stream_state> stream;
    std::vector<std::size_t> frontier;
  };
  std::vector<member> streams;  // [0] is the origin
  std::error_code error;        // the first illegal op: the capture is abandoned
  std::string message;
  bool ended = false;

  member* find(const stream_state* s);
};

/// The capture `s` takes part in, or null.
std::shared_ptr<capture_session> capture_of(stream_state& s);

// Hooks of stream.cpp, called instead of enqueueing while `s` captures (after the checks).
pending<void> capture_copy(stream_state& s, void* dst, const void* src, std::size_t bytes,
                           bool dst_host, bool src_host);
pending<void> capture_fill(stream_state& s, void* dst, std::uint8_t value, std::size_t bytes,
                           bool dst_host);
pending<void> capture_launch(stream_state& s, const std::shared_ptr<kernel_state>& k,
                             std::shared_ptr<backend::module> module, const launch_config& cfg,
                             std::span<const std::byte> params, bool placeholders,
                             const void* device_block);
pending<void> capture_host_call(stream_state& s, std::function<void()> fn);
pending<void> capture_record(stream_state& s, event_state& ev);
/// A wait on `ev` that concerns a capture (the stream captures, or the event was recorded in
/// a capture in progress); false when it does not, and the wait is enqueued as usual.
bool capture_wait(stream_state& s, event_state& ev, pending<void>& out);
/// An op that cannot be captured: abandons the capture, fails with errc::illegal_in_capture.
pending<void> capture_illegal(stream_state& s, const std::string& op);
/// Abandons the capture `s` takes part in with `ec` (a failed check, a dropped stream).
void capture_invalidate(stream_state& s, std::error_code ec, const std::string& message) noexcept;

/// Checks a launch configuration against the device (stream.cpp's checks).
bool check_launch_config(const device_state& dev, const launch_config& cfg, std::string& message);

}  // namespace cora::detail
