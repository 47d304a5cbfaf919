// The core's private state behind the public handles.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "core/engine.hpp"
#include "cora/binary.hpp"
#include "cora/device.hpp"
#include "cora/detail/wait.hpp"
#include "cora/runtime.hpp"

namespace cora::detail {

class device_state;
class stream_state;
class kernel_state;

/// Sets `ec` and the thread's last error message.
void set_error(std::error_code& ec, std::error_code code, std::string message);
inline void set_error(std::error_code& ec, errc code, std::string message) {
  set_error(ec, make_error_code(code), std::move(message));
}
/// Throws cora::error with the thread's last error message if `ec` is set.
void throw_if(const std::error_code& ec);
/// A pending that has already failed; reported on `stream` if dropped unobserved.
op_handle failed_op(std::error_code ec, std::string message, stream_state* stream);

/// What an address is, as far as the runtime knows.
struct memory_region {
  enum class kind { device, pinned_host, pageable_host } k = kind::pageable_host;
  device_state* device = nullptr;  // for device memory
  std::uintptr_t base = 0;
  std::size_t size = 0;
};

/// State shared by a runtime's devices.
class runtime_core {
 public:
  runtime_options options;
  std::vector<device_state*> devices;  // registered by device_state, guarded by devices_mutex
  std::mutex devices_mutex;

  /// Pinned host allocations of every device.
  void add_pinned(void* p, std::size_t size, device_state* owner);
  bool remove_pinned(void* p, device_state*& owner);
  bool find_pinned(const void* p, memory_region& out) const;

 private:
  mutable std::shared_mutex pinned_mutex_;
  std::map<std::uintptr_t, std::pair<std::size_t, device_state*>> pinned_;
};

class device_state : public std::enable_shared_from_this<device_state> {
 public:
  device_state(std::shared_ptr<runtime_core> rt, std::unique_ptr<backend::device> dev,
               std::size_t index);
  ~device_state();

  std::shared_ptr<runtime_core> runtime;
  std::unique_ptr<backend::device> backend;
  device_properties properties;
  std::size_t index;
  cora::device* handle = nullptr;  // the runtime's public object for this device
  std::atomic<bool> shut_down{false};

  // Allocation table: device memory of this device.
  void add_allocation(void* p, std::size_t size);
  bool remove_allocation(void* p);
  bool find_allocation(const void* p, memory_region& out) const;
  std::size_t memory_in_use() const noexcept;

  /// Classifies [p, p + bytes): device memory of some device of the runtime, pinned host memory,
  /// or other host memory. Fails with invalid_pointer / out_of_range for null pointers, freed
  /// device memory and ranges that run past an allocation.
  memory_region classify(const void* p, std::size_t bytes, std::error_code& ec) const;

  // Streams, for device-wide synchronization and shutdown.
  void add_stream(stream_state* s);
  void remove_stream(stream_state* s);
  std::vector<intrusive_ptr<stream_state>> streams();

  /// Fails every wait, lets the device finish its work (up to `timeout`), runs the shutdown
  /// hooks, stops the backend.
  void shutdown(std::chrono::milliseconds timeout) noexcept;
  /// Runs `fn` at shutdown, once the streams have drained and before the backend stops: for
  /// facilities that keep per-device resources (io's cache of staging buffers).
  void on_shutdown(std::function<void()> fn);

 private:
  mutable std::shared_mutex alloc_mutex_;
  std::map<std::uintptr_t, std::size_t> allocations_;
  std::size_t in_use_ = 0;
  std::mutex streams_mutex_;
  std::set<stream_state*> streams_;
  std::mutex hooks_mutex_;
  std::vector<std::function<void()>> shutdown_hooks_;
};

/// Per-stream ring of device and pinned memory for placeholder payloads: each launch's payload
/// is staged in pinned memory, copied to the device in stream order before the launch, and
/// its space is reused only after that launch has completed.
class staging_arena {
 public:
  struct slice {
    std::byte* host = nullptr;
    std::byte* device = nullptr;
  };
  /// Space for `bytes` bytes used by op `seq`; `completed` is the stream's completed position.
  slice take(device_state& dev, std::size_t bytes, std::uint64_t seq, std::uint64_t completed,
             std::error_code& ec);
  void release(device_state& dev) noexcept;

 private:
  struct chunk {
    std::byte* host = nullptr;
    std::byte* device = nullptr;
    std::size_t size = 0;
    std::size_t used = 0;
    std::uint64_t last_seq = 0;
  };
  std::deque<chunk> chunks_;
};

class stream_state final : public completion_source {
 public:
  static constexpr std::uint64_t sync_bit = std::uint64_t{1} << 63;

  stream_state(std::shared_ptr<device_state> dev, std::unique_ptr<backend::stream> bs);
  ~stream_state() override;

  std::shared_ptr<device_state> device;
  std::unique_ptr<backend::stream> backend;
  const completion_policy policy;
  const std::chrono::microseconds spin_limit;

  /// Enqueues one op: `submit(seq, ec, message)` calls the backend. `keep` stays alive until
  /// the op has completed. Returns the op's handle, or a failed one.
  template <class Submit>
  op_handle enqueue(Submit&& submit, std::shared_ptr<const void> keep = {});

  /// Enqueues several backend calls as one op position (e.g. a placeholder copy + launch);
  /// used by launches that stage data first.
  std::mutex& enqueue_mutex() noexcept { return mutex_; }
  std::uint64_t next_seq_locked() const noexcept { return last_seq_ + 1; }
  void note_marker_for_tail_locked();
  void commit_locked(std::uint64_t seq, std::shared_ptr<const void> keep);
  std::uint64_t completed_position() const noexcept { return completed_.load(std::memory_order_acquire); }
  staging_arena& arena() noexcept { return arena_; }

  /// Records a marker right after op `seq` if it is still the last op and has none.
  void mark(std::uint64_t seq);
  /// A handle on "everything enqueued so far" that also reports and clears a fault.
  op_handle synchronize_handle();
  /// True if every op enqueued so far has completed, as last observed (no driver call).
  bool idle_observed() noexcept;
  /// True if every op enqueued so far has completed (queries the driver).
  bool query_idle();

  // completion_source
  bool ready(std::uint64_t seq, std::error_code& ec) noexcept override;
  bool arm(wait_node& node, std::uint64_t seq, const asio::any_io_executor* executor) override;
  bool disarm(wait_node& node) noexcept override;
  std::error_code block(std::uint64_t seq) override;
  std::string message(std::uint64_t seq) const override;
  void dropped(std::uint64_t seq, bool observed) noexcept override;

  /// Polls the oldest marker; appends the nodes that completed to `fired` (state set, unlinked;
  /// their groups not yet uncounted). Returns true on progress.
  bool poll(std::vector<wait_node*>& fired);
  /// When the oldest marker is expected to complete (max() when unknown or none).
  clock::time_point expected_ready();
  /// Blocks in the backend on the oldest marker until `deadline`.
  void block_on_front(clock::time_point deadline);
  /// Records a failure that was never observed, to surface at the next wait.
  void set_sticky(std::error_code ec, const std::string& message) noexcept;
  /// Fails every armed wait with `ec` (shutdown).
  void abort_waits(std::error_code ec, poll_group* only = nullptr) noexcept;
  /// Waits (blocking, up to `deadline`) for every enqueued op; false on timeout.
  bool drain(clock::time_point deadline) noexcept;

 private:
  struct marker_rec {
    backend::marker m;
    clock::time_point enqueued;
  };
  void record_marker_locked(std::uint64_t seq);
  std::error_code result_locked(std::uint64_t seq, bool sync) noexcept;
  void link_locked(wait_node& node);
  void unlink_locked(wait_node& node) noexcept;
  void release_keepalive_locked(std::vector<std::shared_ptr<const void>>& out);
  bool poll_locked(std::vector<wait_node*>& fired, std::vector<std::shared_ptr<const void>>& drop);
  /// Advances `completed` past completed markers and releases finished ops' keep-alives.
  bool advance_locked(std::vector<std::shared_ptr<const void>>& drop);

  mutable std::mutex mutex_;
  std::uint64_t last_seq_ = 0;
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> tail_watch_{0};
  std::deque<marker_rec> markers_;
  wait_node* head_ = nullptr;
  wait_node* tail_ = nullptr;
  std::atomic<std::uint64_t> error_seq_{~std::uint64_t{0}};
  std::error_code error_;
  std::string error_message_;
  std::deque<std::pair<std::uint64_t, std::shared_ptr<const void>>> keepalive_;
  std::size_t trim_at_ = 256;  // keep-alive count that makes an enqueue observe progress
  staging_arena arena_;
  // Learning op durations for the hybrid policy.
  clock::time_point last_done_{};
  clock::time_point last_pending_query_{};
  double ewma_ns_ = 0;
};

template <class Submit>
op_handle stream_state::enqueue(Submit&& submit, std::shared_ptr<const void> keep) {
  std::error_code ec;
  std::string message;
  std::unique_lock lock(mutex_);
  if (device->shut_down.load(std::memory_order_acquire)) {
    lock.unlock();
    return failed_op(make_error_code(errc::runtime_shut_down), "the runtime was shut down", this);
  }
  note_marker_for_tail_locked();
  std::uint64_t seq = last_seq_ + 1;  // a submit that enqueues several backend ops advances it
  submit(seq, ec, message);
  if (ec) {
    lock.unlock();
    return failed_op(ec, std::move(message), this);
  }
  commit_locked(seq, std::move(keep));
  return op_handle(intrusive_ptr<completion_source>::share(this), seq);
}

class binary_state {
 public:
  std::shared_ptr<device_state> device;
  std::string format;
  std::vector<backend::kernel_desc> kernels;
  // The loaded module; created lazily for lazy loads.
  std::mutex mutex;
  std::shared_ptr<backend::module> module;  // launches in flight hold it too
  std::vector<std::byte> image;             // kept until the module is loaded (lazy loads)
  backend::image_kind image_kind = backend::image_kind::cpu_elf;
  std::atomic<bool> unloaded{false};
  /// What the first lookup of kernels[i] resolved: its function and canonical layout.
  struct resolved_kernel {
    std::atomic<bool> ready{false};
    void* function = nullptr;
    std::vector<param_info> params;
    std::size_t args_size = 0;
  };
  std::unique_ptr<resolved_kernel[]> resolved;  // one per kernel
  std::mutex resolve_mutex;                     // held by first lookups only

  ~binary_state();
  /// Loads the module if needed.
  std::shared_ptr<backend::module> ensure_loaded(std::error_code& ec, std::string& message);
  /// The module, to keep alive for a launch; fails once the binary was unloaded.
  std::shared_ptr<backend::module> module_for_launch(std::error_code& ec);
};

class kernel_state {
 public:
  std::shared_ptr<binary_state> binary;  // keeps the module loaded
  const backend::kernel_desc* desc = nullptr;
  void* function = nullptr;
  std::vector<param_info> params;
  std::size_t args_size = 0;
};

class event_state {
 public:
  std::shared_ptr<device_state> device;
  std::unique_ptr<backend::event> backend;
  bool timing = true;
  std::mutex mutex;
  intrusive_ptr<stream_state> stream;  // latest record
  std::uint64_t seq = 0;
  ~event_state();
};

}  // namespace cora::detail
