// The interface between cora's core and a device backend. Core code talks to devices only
// through these classes; backends never see core types beyond the plain ones used here.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "cora/error.hpp"
#include "cora/launch.hpp"

namespace cora::backend {

using clock = std::chrono::steady_clock;

/// What a device reports about itself.
struct device_info {
  std::string name;
  std::string backend;           // "cpu", "cuda"
  unsigned ordinal = 0;          // index among the backend's devices
  unsigned compute_units = 0;    // SMs, or worker threads
  std::size_t total_memory = 0;  // bytes of device memory
  dim3 max_grid{1, 1, 1};
  dim3 max_block{1, 1, 1};
  std::uint32_t max_threads_per_block = 1;
  std::uint32_t max_shared_bytes = 0;
  int compute_major = 0, compute_minor = 0;  // CUDA compute capability
  std::string driver;            // driver version or description
  std::string pci_bus_id;
  std::string uuid;
};

/// Kinds of kernel image a backend may load.
enum class image_kind { cpu_elf, cuda_cubin, cuda_fatbin, cuda_ptx };

/// Names the bytes of an image: the checksum the core verified them against, and their size.
/// A backend may keep what it made of them after their module unloads, to load them again
/// without the bytes (device::load_kept). Empty (size 0): not named.
struct image_key {
  std::uint64_t checksum = 0;
  std::uint64_t size = 0;
  explicit operator bool() const noexcept { return size != 0; }
  friend bool operator==(const image_key&, const image_key&) = default;
};

/// One kernel parameter: size and alignment, and its offset in the backend's native block.
struct param_desc {
  std::uint32_t size = 0;
  std::uint32_t align = 1;
  bool pointer = false;  // declared a pointer (CPU kernel records); false when unknown
};

/// A kernel found in a loaded module.
struct kernel_desc {
  std::string name;
  std::optional<std::uint64_t> entry_key;
  std::vector<param_desc> params;
  bool params_known = true;  // false when the backend cannot report the parameter layout
  std::uint32_t form = 0;    // CORA_KERNEL_FLAG_PHASED / _RAW_BARRIER of a CPU kernel's source
};

/// A loaded kernel image. Loading reads no more than it must: a kernel's handle, parameter
/// layout and attributes are resolved by find() at its first lookup.
class module {
 public:
  virtual ~module() = default;
  /// Lists the kernels the image defines, for images without metadata of their own (a backend
  /// may do it at load, or only here).
  virtual bool list_kernels(std::error_code& ec, std::string& message) {
    ec.clear();
    (void)message;
    return true;
  }
  /// The kernels listed so far (all of them after list_kernels).
  virtual const std::vector<kernel_desc>& kernels() const = 0;
  /// Backend handle of kernel `index` (of kernels()), resolved once.
  virtual void* function(std::size_t index, std::error_code& ec, std::string& message) = 0;
  /// The backend's own handle (CUmodule on CUDA; null where there is none).
  virtual void* native_handle() const noexcept { return nullptr; }
  /// Where the code of the kernel whose handle is `function` (from find) lies in the device's
  /// address space; null where a handle is no code address (CUDA's CUfunction).
  virtual void* code_address(void* function) const noexcept {
    (void)function;
    return nullptr;
  }
  /// The global variable `name` of the image (CORA_GLOBAL): its address in the device's address
  /// space, and in `size` its size in bytes. errc::kernel_not_found when the image lacks it.
  virtual void* global(const std::string& name, std::size_t& size, std::error_code& ec,
                       std::string& message) {
    (void)name;
    size = 0;
    ec = make_error_code(errc::not_supported);
    message = "this backend cannot look up globals";
    return nullptr;
  }
  /// Kernel `name`: its handle, and in `layout` the parameters as the image reports them
  /// (params_known false when it reports none). Resolved at the first call and cached; safe
  /// from several threads at once. errc::kernel_not_found when the image lacks it.
  virtual void* find(const std::string& name, kernel_desc& layout, std::error_code& ec,
                     std::string& message) = 0;
};

/// Backend side of an event.
class event {
 public:
  virtual ~event() = default;
  /// The backend's own handle (CUevent on CUDA; null where there is none).
  virtual void* native_handle() const noexcept { return nullptr; }
};

/// A marker's state as seen by a query.
enum class marker_state { pending, done, failed };

/// A failure a stream reports: the first failing op (0 when unknown), its code and message.
struct fault {
  std::uint64_t seq = 0;
  std::error_code ec;
  std::string message;
};

/// How the core will mostly wait for a stream's markers: by polling query() (spin and hybrid
/// policies), or by sleeping in wait_marker() (the callback policy), where a backend may have
/// its markers signalled by the driver's host callbacks instead of being polled.
enum class marker_wakeup { poll, host_callback };

/// An opaque completion marker recorded after an op.
struct marker {
  std::uint64_t seq = 0;
  void* handle = nullptr;
  /// The stream's doorbell (stream::bell()) reaches `seq` when this marker completes.
  bool rings = false;
};

/// A word a stream's device writes, in stream order, with the low 32 bits of the position of
/// each ringing marker as it completes. Pollers read it with plain loads and take the stream's
/// lock only when it moved, so a poll of a stream with nothing new costs one load, not a lock
/// and a driver query. The word lives as long as the backend stream.
struct doorbell {
  const std::uint32_t* word = nullptr;  ///< null: markers must be queried
  /// While the word stands still, query the stream at least this often anyway, since a fault
  /// may keep it from ever moving; 0 when a fault moves it too.
  std::chrono::microseconds recheck{0};
};

/// A launch as the core hands it over: the argument block is in cora's canonical layout
/// (see cora/detail/arg_layout.hpp) and has been validated against the kernel's parameters.
struct launch_desc {
  void* function = nullptr;               // from module::function
  const kernel_desc* kernel = nullptr;
  launch_config config;
  const void* args = nullptr;             // canonical argument block (host memory)
  std::size_t args_size = 0;
  const void* device_args = nullptr;      // or: a canonical block in device memory
};

/// One node of a graph as the core hands it to a backend (cora/graph.hpp). Nodes come in a
/// topological order: every dependency is an earlier node.
struct graph_node_desc {
  enum class kind { empty, copy, fill, launch, host_call };
  kind k = kind::empty;
  std::vector<std::size_t> deps;
  // copy and fill: a copy reads its source each time the graph runs.
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  std::uint8_t value = 0;
  bool dst_host = false;  // host memory (pinned or pageable), not device memory
  bool src_host = false;
  launch_desc launch;     // launch: the argument block is read during the call only
  std::function<void()> fn;  // host_call
};

/// An instantiated graph (cora::graph_exec). Parameter changes apply to later launches of it;
/// launches already enqueued keep the parameters they were enqueued with.
class graph_exec {
 public:
  virtual ~graph_exec() = default;
  /// New arguments (same kernel) for launch node `node`.
  virtual void set_launch(std::size_t node, const launch_desc& launch, std::error_code& ec,
                          std::string& message) = 0;
  /// New addresses and size for copy node `node`.
  virtual void set_copy(std::size_t node, void* dst, const void* src, std::size_t bytes,
                        bool dst_host, bool src_host, std::error_code& ec,
                        std::string& message) = 0;
  /// Takes every parameter of `nodes` (same node kinds and dependencies as instantiated).
  /// Returns false, with `message` saying why, when the backend refuses: the core then
  /// instantiates anew.
  virtual bool update(std::span<const graph_node_desc> nodes, std::string& message) = 0;
};

/// What the word of a memory-value op (stream::wait_value, write_value) lies in, as the core
/// classified it: some devices reach only some kinds with their stream memory operations.
enum class value_memory {
  allocation,   // device memory the runtime allocated on this device
  pinned_host,  // pinned host memory the runtime allocated (alloc_host, its slabs)
  foreign,      // memory of another allocator that describe_pointer knew (device or host)
};

/// An in-order queue of device work. Every enqueue carries the core's sequence number of the
/// op, strictly increasing; ops complete in that order. The core makes the enqueues and
/// record_marker one at a time (its submission lock), and query, release_marker, take_fault
/// and resume one at a time (its completion lock): a call of the first group may run beside
/// one of the second. wait_marker may run beside either.
class stream {
 public:
  virtual ~stream() = default;

  /// `src_pageable`: the source is ordinary host memory the caller may reuse as soon as this
  /// returns (the backend must read or snapshot it first).
  virtual void copy(std::uint64_t seq, void* dst, const void* src, std::size_t bytes,
                    bool src_pageable) = 0;
  virtual void fill(std::uint64_t seq, void* dst, std::uint8_t value, std::size_t bytes) = 0;
  virtual void launch(std::uint64_t seq, const launch_desc& launch, std::error_code& ec,
                      std::string& message) = 0;
  virtual void host_func(std::uint64_t seq, std::function<void()> fn, std::error_code& ec) = 0;
  virtual void record(std::uint64_t seq, event& ev) = 0;
  /// Later work waits until `ev`'s latest record (on any stream of the device) has completed.
  virtual void wait(std::uint64_t seq, event& ev) = 0;

  /// Records a marker after op `seq` (the last op enqueued).
  virtual marker record_marker(std::uint64_t seq) = 0;
  /// Queries a marker without blocking.
  virtual marker_state query(const marker& m) = 0;
  /// The stream's doorbell, if it has one; fixed for the stream's life.
  virtual doorbell bell() const noexcept { return {}; }
  /// Blocks until the marker completes or `deadline` passes; returns false on timeout.
  virtual bool wait_marker(const marker& m, clock::time_point deadline) = 0;
  virtual void release_marker(const marker& m) noexcept = 0;
  /// The failure behind a failed marker; clears it where the backend can go on.
  virtual fault take_fault() = 0;
  /// The backend's own handle (CUstream on CUDA; null where there is none).
  virtual void* native_handle() const noexcept { return nullptr; }
  /// True for a stream adopted from another library (its destruction only lets go of it).
  virtual bool borrowed() const noexcept { return false; }
  /// A borrowed stream whose cora handle is gone: its library may destroy the native stream
  /// at any time from now on, so make no more driver calls on it (markers already recorded
  /// are still polled, from memory or events that do not belong to the stream).
  virtual void detach() noexcept {}
  /// Readies a drained stream (every marker reached) for a new cora stream, as if new; false
  /// when it cannot serve again (a fault was recorded, the context is lost...).
  virtual bool recycle() noexcept { return false; }

  /// Later work waits until the `wide` (64-bit, else 32-bit) word at `addr` (device memory or
  /// pinned host memory, naturally aligned; `where` says which, as the core found it)
  /// satisfies `condition` against `value`: 0 (signed) (*addr - value) >= 0, 1 *addr == value,
  /// 2 (*addr & value) != 0, 3 ~(*addr | value) != 0 (cora::wait_condition, CUDA's
  /// CU_STREAM_WAIT_VALUE_*). Fails with ec, enqueuing nothing, for memory or a condition the
  /// device cannot watch.
  virtual void wait_value(std::uint64_t seq, const void* addr, value_memory where,
                          std::uint64_t value, unsigned condition, bool wide, std::error_code& ec,
                          std::string& message) {
    (void)seq, (void)addr, (void)where, (void)value, (void)condition, (void)wide;
    ec = make_error_code(errc::not_supported);
    message = "this backend cannot wait for a memory value";
  }
  /// Writes the `wide` (64-bit, else 32-bit) word `value` at `addr` (as wait_value) as op `seq`,
  /// in one store that a wait_value of another stream observes whole.
  virtual void write_value(std::uint64_t seq, void* addr, value_memory where, std::uint64_t value,
                           bool wide, std::error_code& ec, std::string& message) {
    (void)seq, (void)addr, (void)where, (void)value, (void)wide;
    ec = make_error_code(errc::not_supported);
    message = "this backend cannot write a memory value";
  }

  /// Failure mode. With `stop`, once an op of this stream fails, the ops behind it that have
  /// not started are not run: each fails with the first failure's status, until resume().
  /// Returns false, leaving the mode as it was, where the backend cannot hold back work it has
  /// already handed over.
  virtual bool stop_on_failure(bool stop) noexcept { return !stop; }
  /// Ends the halt after a failure (the core calls it once synchronize has reported it).
  virtual void resume() noexcept {}
  /// Discards the ops not started yet: they complete, failed with errc::aborted (a memory-value
  /// wait in progress too); other running ops finish. False, doing nothing, where the backend
  /// cannot recall work it has handed over.
  virtual bool abort() noexcept { return false; }

  /// Enqueues one launch of an instantiated graph of this stream's device as op `seq`.
  virtual void launch_graph(std::uint64_t seq, graph_exec& graph, std::error_code& ec,
                            std::string& message) {
    (void)seq;
    (void)graph;
    ec = make_error_code(errc::not_supported);
    message = "this backend has no graphs";
  }
};

/// What a backend knows of memory cora did not allocate (another library's allocation).
struct foreign_memory {
  enum class kind {
    unknown,  // not the backend's: ordinary (pageable) host memory
    device,   // device memory of this device (another allocator's, a stream-ordered pool's)
    managed,  // managed memory, usable by host and device
    host,     // pinned or registered host memory the device can reach
  } k = kind::unknown;
  std::uintptr_t base = 0;  // the allocation's bounds when the backend reports them, else 0
  std::size_t size = 0;
  bool stream_ordered = false;  // from a stream-ordered pool (CUDA: cuMemAllocAsync)
};

/// Memory held by a backend's own pools.
struct memory_counters {
  std::size_t reserved = 0;  // bytes the device pool holds (in use or cached)
};

/// One device of a backend.
class device {
 public:
  virtual ~device() = default;
  virtual const device_info& info() const = 0;

  /// Device memory usable by every stream once this returns. Never waits for device work
  /// (CUDA: stream-ordered allocation from cora's pool on an internal idle stream).
  virtual void* alloc(std::size_t bytes, std::error_code& ec) = 0;
  /// Frees device memory no op in flight uses any more (the core makes sure of that); `bytes` is
  /// the size it was allocated with. Never blocks (CUDA: kept for reuse, or a stream-ordered
  /// free).
  virtual void free(void* p, std::size_t bytes) noexcept = 0;
  /// What the backend's pools hold.
  virtual memory_counters memory() const noexcept { return {}; }
  /// Memory the device pool keeps cached when idle (bytes); set from runtime_options.
  virtual void set_pool_release_threshold(std::size_t) noexcept {}
  /// Returns cached pool memory beyond `keep` bytes to the system.
  virtual void trim(std::size_t /*keep*/) noexcept {}
  /// True where creating a stream may wait for the device (the core then keeps a pool of
  /// created streams, filled on its own threads).
  virtual bool pool_streams() const noexcept { return false; }
  /// True where unloading a module waits for the device's running work and holds other
  /// threads' driver calls meanwhile (cuModuleUnload): the core then unloads only while its
  /// streams are idle.
  virtual bool unload_waits() const noexcept { return false; }
  /// True where loading a module waits for the device's running work and holds other
  /// threads' driver calls meanwhile (cuModuleLoadDataEx): the core then loads only while its
  /// streams are idle (device_state::run_when_idle).
  virtual bool load_waits() const noexcept { return false; }
  /// device_lost once the device is lost (pooled streams are then no longer handed out).
  virtual std::error_code health() const noexcept { return {}; }
  /// Describes memory cora did not allocate.
  virtual foreign_memory describe_pointer(const void*) noexcept { return {}; }
  /// The backend's own handle (the primary CUcontext on CUDA; null where there is none).
  virtual void* native_handle() const noexcept { return nullptr; }
  /// A stream around a foreign native stream that cora must never destroy; null with
  /// errc::not_supported where the backend has no native streams.
  virtual std::unique_ptr<stream> adopt_stream(void* /*native*/, marker_wakeup, std::error_code& ec) {
    ec = make_error_code(errc::not_supported);
    return nullptr;
  }
  virtual void* alloc_host(std::size_t bytes, std::error_code& ec) = 0;
  virtual void free_host(void* p) noexcept = 0;
  /// True if `p` lies in address space this device reserves for device memory, allocated or
  /// not (lets the core tell freed device memory from host memory). False when unknown.
  virtual bool owns_address(const void* p) const noexcept = 0;
  /// Synchronous copy between any memories of this device (used for small host-side reads).
  virtual void copy_sync(void* dst, const void* src, std::size_t bytes, std::error_code& ec) = 0;

  virtual std::unique_ptr<stream> create_stream(int priority, marker_wakeup wakeup,
                                                std::error_code& ec) = 0;
  virtual std::unique_ptr<event> create_event(bool timing, std::error_code& ec) = 0;
  /// Time between two completed records, in milliseconds.
  virtual double elapsed_ms(event& start, event& end, std::error_code& ec) = 0;
  /// True once the event's latest record has completed (or it was never recorded).
  virtual bool event_done(event& ev, std::error_code& ec) = 0;

  /// Whether the device runs images of this kind.
  virtual bool accepts(image_kind kind) const = 0;
  /// Loads `image`. `key`, if not empty, names the bytes (checked against it): a backend that
  /// keeps what it made of an unloaded module's bytes (keeps_images()) loads them from that
  /// instead where it has it, and keeps this module's once it unloads.
  virtual std::unique_ptr<module> load(std::span<const std::byte> image, image_kind kind,
                                       const image_key& key, std::error_code& ec,
                                       std::string& message) = 0;
  /// Loads the bytes named `key` again from what an unloaded module of them left, without the
  /// bytes; null with `ec` clear when nothing of them is kept (or it is in use by a module
  /// loaded now: two loads of one image stay two modules).
  virtual std::unique_ptr<module> load_kept(const image_key& key, image_kind kind,
                                            std::error_code& ec, std::string& message) {
    (void)key;
    (void)kind;
    (void)message;
    ec.clear();
    return nullptr;
  }
  /// Whether load() keeps anything, so that a core that skips reading an image's bytes for
  /// load_kept() gains something.
  virtual bool keeps_images() const noexcept { return false; }

  /// Instantiates a graph (nodes in topological order) for launches on this device's streams.
  virtual std::unique_ptr<graph_exec> instantiate(std::span<const graph_node_desc> nodes,
                                                  std::error_code& ec, std::string& message) {
    (void)nodes;
    ec = make_error_code(errc::not_supported);
    message = "this backend has no graphs";
    return nullptr;
  }

  /// Markers recorded so far (the engine's cost; tests check that unwaited ops record none).
  virtual std::uint64_t markers_recorded() const = 0;

  /// Stops the device's own threads; called once, when the runtime shuts down.
  virtual void shutdown() noexcept = 0;

  /// True on a thread where the device must not be destroyed, because a host function's
  /// captures are dropped there: a CPU device's workers (destroying the device joins them) and,
  /// on CUDA, the driver's callback thread (which must make no CUDA call).
  virtual bool on_own_thread() const noexcept { return false; }
};

/// Options the CPU backend takes.
struct cpu_options {
  unsigned devices = 1;
  unsigned compute_units = 0;     // 0: hardware threads
  std::size_t memory = 0;         // 0: default
};

/// Enumerates the CPU devices (always at least one).
std::vector<std::unique_ptr<device>> make_cpu_devices(const cpu_options& options);

/// Enumerates the CUDA devices; empty, with `reason` set, when there is no driver or GPU or
/// the backend was not built.
std::vector<std::unique_ptr<device>> make_cuda_devices(std::string& reason);

/// The process is exiting: from now on the CUDA backend calls no driver entry point (each one
/// fails with CUDA_ERROR_DEINITIALIZED). Called by cora's exit handler, before the driver's own
/// handlers tear the driver down.
void stop_cuda_calls_for_exit() noexcept;

}  // namespace cora::backend
