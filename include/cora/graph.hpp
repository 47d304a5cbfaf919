// cora::graph and cora::graph_exec: device work captured once (or built node by node),
// instantiated, and replayed as one awaitable op.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <system_error>
#include <tuple>
#include <vector>

#include "cora/binary.hpp"
#include "cora/detail/kernel_arg.hpp"
#include "cora/launch.hpp"
#include "cora/pending.hpp"

namespace cora {

class device;
class stream;

namespace detail {
class graph_state;
class graph_exec_state;
}  // namespace detail

/// A node of a graph: its index, in the order the nodes were added (a captured graph numbers
/// its nodes in the order the ops were made).
struct graph_node {
  static constexpr std::size_t none = ~std::size_t{0};
  std::size_t index = none;
  explicit operator bool() const noexcept { return index != none; }
  friend bool operator==(const graph_node&, const graph_node&) = default;
};

/// What a node does.
enum class graph_node_kind { empty, copy, fill, launch, host_call };

/// The nodes a new node waits for.
class after {
 public:
  after() = default;
  after(std::initializer_list<graph_node> nodes) : nodes_(nodes) {}  // NOLINT
  after(std::span<const graph_node> nodes) : nodes_(nodes.begin(), nodes.end()) {}  // NOLINT
  after(graph_node node) : nodes_{node} {}  // NOLINT
  std::span<const graph_node> nodes() const noexcept { return nodes_; }

 private:
  std::vector<graph_node> nodes_;
};

/// How exec.update() took a new graph.
enum class graph_update {
  in_place,        ///< the instantiated graph took the new parameters
  reinstantiated,  ///< the backend refused (another shape); a new instantiation replaced it
};

class graph_exec;

/// A graph template: copies, fills, launches and host calls with dependencies between them,
/// for one device. Made by capturing a stream (stream::capture, begin_capture/end_capture) or
/// node by node with add_*; each add_* checks its op as the stream op would be checked
/// (pointers, argument count and sizes, launch configuration) and throws cora::error on a
/// mismatch. Nothing runs until an instantiation of it is launched.
///
/// A copy node reads its source each time the graph runs; the memory a graph uses must
/// outlive its launches (kernels and binaries are kept alive by the graph).
///
/// Copies share the template.
class graph {
 public:
  graph() noexcept = default;
  /// An empty graph for `dev`.
  explicit graph(cora::device& dev);
  explicit graph(std::shared_ptr<detail::graph_state> s) noexcept : s_(std::move(s)) {}

  /// Copies `bytes` from `src` to `dst` (any direction, as stream::copy).
  graph_node add_copy(void* dst, const void* src, std::size_t bytes) { return add_copy({}, dst, src, bytes); }
  graph_node add_copy(const after& deps, void* dst, const void* src, std::size_t bytes);
  /// Sets `bytes` bytes at `dst` to `value`.
  graph_node add_fill(void* dst, std::uint8_t value, std::size_t bytes) { return add_fill({}, dst, value, bytes); }
  graph_node add_fill(const after& deps, void* dst, std::uint8_t value, std::size_t bytes);
  /// Launches `k` with typed arguments, checked like stream::launch.
  template <class... Args>
  graph_node add_launch(const kernel& k, const launch_config& cfg, Args&&... args) {
    return add_launch(after{}, k, cfg, std::forward<Args>(args)...);
  }
  template <class... Args>
  graph_node add_launch(const after& deps, const kernel& k, const launch_config& cfg, Args&&... args) {
    auto values = std::make_tuple(detail::to_launch_arg(args)...);
    return std::apply(
        [&](auto&... a) {
          const std::array<detail::arg_view, sizeof...(Args)> views{detail::view_of(a)...};
          return add_launch_typed(deps, k, cfg, views);
        },
        values);
  }
  /// Runs `fn` on a host thread when the node's dependencies have run.
  graph_node add_host_call(std::function<void()> fn) { return add_host_call({}, std::move(fn)); }
  graph_node add_host_call(const after& deps, std::function<void()> fn);
  /// A node that does nothing: joins `deps`.
  graph_node add_empty(const after& deps);

  /// Number of nodes.
  std::size_t size() const noexcept;
  /// The kind of node `n`. @throws cora::error (errc::out_of_range).
  graph_node_kind kind(graph_node n) const;
  /// Node `i` (in the order added or captured). @throws cora::error (errc::out_of_range).
  graph_node node(std::size_t i) const;

  /// Instantiates the graph for launches on streams of its device (cuGraphInstantiate +
  /// cuGraphUpload on CUDA). @throws cora::error.
  graph_exec instantiate() const;
  graph_exec instantiate(std::error_code& ec) const;

  cora::device& device() const;
  explicit operator bool() const noexcept { return static_cast<bool>(s_); }
  const std::shared_ptr<detail::graph_state>& state() const noexcept { return s_; }

 private:
  graph_node add_launch_typed(const after& deps, const kernel& k, const launch_config& cfg,
                              std::span<const detail::arg_view> args);
  std::shared_ptr<detail::graph_state> s_;
};

/// An instantiated graph. launch(stream) enqueues the whole graph as one op of the stream
/// and returns its pending, with the rules of every op: completion on the waiter's
/// executor, cancellation stops the wait (the graph runs on), a fault in any node fails the
/// op and reaches every waiter, and what the graph uses (kernels, the instantiation itself)
/// stays alive until it has run, even when the graph_exec is destroyed first.
///
/// Parameter changes (update, set_launch_args, set_copy) apply to later launches only.
/// Launching from several threads is safe; changing parameters concurrently with launches
/// is safe (each launch sees all of a change or none of it).
class graph_exec {
 public:
  graph_exec() noexcept = default;
  explicit graph_exec(std::shared_ptr<detail::graph_exec_state> s) noexcept : s_(std::move(s)) {}

  /// Enqueues one run of the graph on `s`, a stream of the device the graph was instantiated
  /// for (else errc::wrong_device).
  pending<void> launch(stream& s);

  /// Takes the parameters of `g`. In place when `g` has the same nodes (kinds and
  /// dependencies) and the backend accepts it (cuGraphExecUpdate), else by instantiating `g`.
  graph_update update(const graph& g);
  graph_update update(const graph& g, std::error_code& ec);

  /// New arguments for launch node `n` (same kernel), checked like stream::launch.
  template <class... Args>
  void set_launch_args(graph_node n, Args&&... args) {
    auto values = std::make_tuple(detail::to_launch_arg(args)...);
    std::apply(
        [&](auto&... a) {
          const std::array<detail::arg_view, sizeof...(Args)> views{detail::view_of(a)...};
          std::error_code ec;
          set_launch_typed(n, views, ec);
          throw_if_error(ec);
        },
        values);
  }
  /// New addresses and size for copy node `n`, checked like stream::copy.
  void set_copy(graph_node n, void* dst, const void* src, std::size_t bytes);
  void set_copy(graph_node n, void* dst, const void* src, std::size_t bytes, std::error_code& ec);

  cora::device& device() const;
  explicit operator bool() const noexcept { return static_cast<bool>(s_); }
  const std::shared_ptr<detail::graph_exec_state>& state() const noexcept { return s_; }

 private:
  void set_launch_typed(graph_node n, std::span<const detail::arg_view> args, std::error_code& ec);
  static void throw_if_error(const std::error_code& ec);
  std::shared_ptr<detail::graph_exec_state> s_;
};

}  // namespace cora
