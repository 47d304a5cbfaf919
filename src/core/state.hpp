// The core's private state behind the public handles.
#pragma once

#include <array>
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
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "core/adaptive_mutex.hpp"
#include "core/engine.hpp"
#include "cora/binary.hpp"
#include "cora/device.hpp"
#include "cora/detail/wait.hpp"
#include "cora/runtime.hpp"

namespace cora::detail {

class device_state;
class stream_state;
class kernel_state;
struct capture_session;

/// Sets `ec` and the thread's last error message.
void set_error(std::error_code& ec, std::error_code code, std::string message);
inline void set_error(std::error_code& ec, errc code, std::string message) {
  set_error(ec, make_error_code(code), std::move(message));
}
/// Throws cora::error with the thread's last error message if `ec` is set.
void throw_if(const std::error_code& ec);
/// A pending that has already failed; reported on `stream` if dropped unobserved.
op_handle failed_op(std::error_code ec, std::string message, stream_state* stream);

/// One allocation cora knows about: device memory, pinned host memory, or foreign memory the
/// backend recognised. Reference counted: the user's handle holds one reference and every op in
/// flight that uses the memory holds one; the memory is freed when the last one goes, so
/// dropping a handle never frees memory that in-flight work still uses (DESIGN rule 7).
/// A cache line of its own: every op on the memory counts its reference here, from any thread,
/// and two records on one line would make users of unrelated buffers contend.
struct alignas(64) alloc_record {
  enum class origin : std::uint8_t {
    device,         // backend->alloc
    pinned_direct,  // backend->alloc_host, freed with backend->free_host
    pinned_pool,    // carved from the device's pinned slab pool
  };
  std::uintptr_t base = 0;
  std::size_t size = 0;
  device_state* owner = nullptr;
  origin from = origin::device;
  std::atomic<std::uint32_t> refs{1};
  std::atomic<bool> dropped{false};  // the handle is gone: classify refuses new uses
};

/// An owning reference to an alloc_record (what an op's keep-alive holds). Never allocates.
class alloc_ref {
 public:
  alloc_ref() noexcept = default;
  explicit alloc_ref(alloc_record* r) noexcept : r_(r) {}  // adopts a reference
  alloc_ref(alloc_ref&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  alloc_ref& operator=(alloc_ref&& o) noexcept {
    if (this != &o) {
      reset();
      r_ = std::exchange(o.r_, nullptr);
    }
    return *this;
  }
  ~alloc_ref() { reset(); }
  void reset() noexcept;
  alloc_record* get() const noexcept { return r_; }
  explicit operator bool() const noexcept { return r_ != nullptr; }

 private:
  alloc_record* r_ = nullptr;
};

/// Drops one reference; the last one frees the memory (stream-ordered where the backend has
/// stream-ordered frees, never blocking).
void release_allocation(alloc_record* r) noexcept;
inline void alloc_ref::reset() noexcept {
  if (r_) release_allocation(std::exchange(r_, nullptr));
}

/// What an address is, as far as the runtime knows.
struct memory_region {
  enum class kind { device, pinned_host, pageable_host } k = kind::pageable_host;
  device_state* device = nullptr;  // for device memory
  std::uintptr_t base = 0;
  std::size_t size = 0;
  alloc_record* record = nullptr;  // the allocation, when cora tracks it (not owned)
};

/// An address-ordered table of allocation records (lookups by any address inside).
class alloc_table {
 public:
  ~alloc_table();
  void insert(alloc_record* r);
  /// Removes and returns the live (not dropped) record at exactly `p`, marking it dropped.
  alloc_record* drop(const void* p);
  /// Erases `r` (its last reference went).
  void erase(alloc_record* r) noexcept;
  /// The live record containing `p`; with `ref`, takes a reference to it.
  bool find(const void* p, memory_region& out, memory_region::kind k, alloc_ref* ref) const;

 private:
  // Sharded by 64 KiB granule of the address: every op classifies its pointers here, and with
  // one lock the kernel server's 16 workers spent their time queueing on it (H200). A record
  // is in the shard of every granule it covers (at most every shard once), so a lookup reads
  // one shard: there, the record with the greatest base at or below the address is the only
  // one that can contain it, since allocations never overlap.
  static constexpr unsigned shard_count = 32;
  static constexpr unsigned granule_shift = 16;
  // Within a shard, a lookup takes one of reader_slots locks, picked by its thread, and a
  // change takes them all: threads that look up the same allocations (every op of a pipeline
  // names its buffers) each write a lock word of their own, not one that all of them share.
  // Cache-line aligned, so that no two slots share a line.
  static constexpr unsigned reader_slots = 16;
  struct alignas(64) reader_slot {
    mutable std::shared_mutex mutex;
  };
  struct shard {
    std::array<reader_slot, reader_slots> slots;
    std::map<std::uintptr_t, alloc_record*> records;
  };
  /// The slot the calling thread reads under.
  static unsigned my_slot() noexcept;
  /// Holds every slot of a shard: the records may change.
  class write_lock {
   public:
    explicit write_lock(const shard& s) noexcept;
    ~write_lock();
    write_lock(const write_lock&) = delete;
    write_lock& operator=(const write_lock&) = delete;

   private:
    const shard& s_;
  };
  static unsigned shard_of(std::uintptr_t a) noexcept {
    return static_cast<unsigned>((a >> granule_shift) % shard_count);
  }
  /// The shards `r` is in: `first`, and the `n - 1` after it (cyclically).
  static void span_of(const alloc_record& r, unsigned& first, unsigned& n) noexcept;
  std::array<shard, shard_count> shards_;
};

/// State shared by a runtime's devices.
class runtime_core {
 public:
  runtime_options options;
  std::vector<device_state*> devices;  // registered by device_state, guarded by devices_mutex
  std::mutex devices_mutex;

  /// Pinned host allocations of every device. add_pinned registers memory the caller got from
  /// backend->alloc_host (freed with backend->free_host when its last reference goes).
  void add_pinned(void* p, std::size_t size, device_state* owner);
  bool find_pinned(const void* p, memory_region& out, alloc_ref* ref = nullptr) const;
  alloc_table pinned;
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
  /// The public object for this device. It lives here, not in the runtime, so that
  /// stream::device() stays valid after the runtime is destroyed.
  cora::device handle{this};
  std::atomic<bool> shut_down{false};

  // Allocation table: device memory of this device.
  /// Registers device memory from backend->alloc; `counted`: its bytes were already counted
  /// by count_bytes.
  void add_allocation(void* p, std::size_t size, bool counted = false);
  /// Counts `bytes` as in use unless that would pass `limit` (0: none); false then.
  bool count_bytes(std::size_t bytes, std::size_t limit) noexcept;
  void uncount_bytes(std::size_t bytes) noexcept;
  /// Drops the handle's reference of the device allocation at `p`; false if there is none.
  bool remove_allocation(void* p);
  /// Marks the allocation at `p` dropped and hands over the handle's reference (null if none).
  alloc_record* drop_allocation(void* p) { return allocations_.drop(p); }
  bool find_allocation(const void* p, memory_region& out, alloc_ref* ref = nullptr) const;
  /// Device memory allocated and not yet freed (including memory whose handle was dropped but
  /// that in-flight work still uses), in bytes.
  std::size_t memory_in_use() const noexcept;
  /// Pinned host memory handed out (pool and direct), in bytes.
  std::size_t pinned_in_use() const noexcept { return pinned_in_use_.load(std::memory_order_relaxed); }
  /// Called by release_allocation when the last reference of a record of this device goes.
  void free_record(alloc_record* r) noexcept;
  /// Pinned memory from the device's slab pool (`bytes` > 0); null with ec set on failure.
  void* pinned_alloc(std::size_t bytes, std::error_code& ec);
  /// Adds one default-size slab to the pinned pool, whose growth was counted by the caller
  /// (reserved, growing); on a cora thread, since the driver's pinned allocation may wait.
  void grow_pinned_slab();
  std::size_t pinned_reserved() const noexcept;
  void add_pinned_in_use(std::ptrdiff_t d) noexcept {
    pinned_in_use_.fetch_add(static_cast<std::size_t>(d), std::memory_order_relaxed);
  }

  /// Classifies [p, p + bytes): device memory of some device of the runtime, pinned host memory,
  /// or other host memory. Fails with invalid_pointer / out_of_range for null pointers, freed
  /// device memory and ranges that run past an allocation.
  memory_region classify(const void* p, std::size_t bytes, std::error_code& ec) const;
  /// As above; when the memory is a tracked allocation, `keep` receives a reference to it (for
  /// the keep-alive of the op that will use it).
  memory_region classify(const void* p, std::size_t bytes, std::error_code& ec, alloc_ref* keep) const;

  /// Owns a module the backend just loaded. When its last reference goes with a user's binary
  /// handle (handle_release) on a thread other than the engine's, it is unloaded right there
  /// if that waits for nothing: where unloading waits for the device, only while the device is
  /// idle (run_while_idle). Otherwise (a launch's keep-alive, a busy device) it is handed to a
  /// cora thread, which unloads it or, where unloading waits for the device, queues it
  /// (unload_later).
  std::shared_ptr<backend::module> own_module(std::unique_ptr<backend::module> m);
  /// Unloads `m` on the calling thread if that waits for no cora work (see own_module); false,
  /// `m` untouched, if not.
  bool unload_here(std::unique_ptr<backend::module>& m) noexcept;
  /// Queues `m` for a cora thread to unload where unloading waits for the device (CUDA's
  /// cuModuleUnload, which also holds other threads' driver calls while it waits): only once
  /// this device's streams are idle, with their submission locks held, or when the queue grows
  /// long or old (unload_defer_count, unload_defer_age). Called on a cora thread.
  void unload_later(std::unique_ptr<backend::module> m) noexcept;
  /// Modules waiting for their unload.
  std::size_t unloads_pending() const noexcept;
  /// Runs `fn`, a driver call that waits for the device's running kernels and holds other
  /// threads' driver calls meanwhile (CUDA's module load), where it waits for no cora kernel:
  /// once the work in flight on this device's streams at the call has finished, while every
  /// stream is idle with its submission lock held. On the calling thread when the device is
  /// idle now and `here` is true; else on a cora thread. When new work keeps the streams busy,
  /// `fn` runs after idle_gate_tries tries anyway (waiting for that newer work only). `fn`
  /// must not throw. `except`: a stream whose work in flight is not waited for, that of the
  /// host function that asked for the call (which may wait for it: waiting for its own stream
  /// would never end); null if none.
  void run_when_idle(std::function<void()> fn, bool here, const stream_state* except = nullptr);
  static constexpr int idle_gate_tries = 64;  // about 64 ms of new work, 1 ms apart
  /// True if no stream of this device has cora work in flight (polls those that may).
  bool streams_idle();
  /// Runs `fn` if every stream's submission lock is free and every stream is idle, with the
  /// locks held (no cora work starts meanwhile); false, `fn` not run, if not.
  bool run_while_idle(const std::function<void()>& fn);

  /// Fills the stream pool and the first pinned slab on a cora thread (called once the device
  /// is owned by a shared_ptr), so that the first calls find them ready.
  void warm_up() noexcept;
  /// Returns cached memory: device pool memory beyond `keep`, wholly free pinned slabs.
  void trim_memory(std::size_t keep) noexcept;

  /// A backend stream for a new stream: from the pool of created streams where the backend's
  /// creation may wait for the device (CUDA), else created now.
  std::unique_ptr<backend::stream> take_stream(int priority, std::error_code& ec);
  /// How the streams' markers wake sleeping waiters, from the runtime's completion policy.
  backend::marker_wakeup marker_wakeup() const noexcept;
  /// Destroys a drained backend stream on a cora thread (never on the caller's).
  /// `reusable`: drained, and made by take_stream's pool: it may serve a new cora stream.
  void retire_stream(std::unique_ptr<backend::stream> s, bool reusable = false) noexcept;

  // Streams, for device-wide synchronization and shutdown.
  void add_stream(stream_state* s);
  void remove_stream(stream_state* s);
  std::vector<intrusive_ptr<stream_state>> streams();

  /// Fails every wait, runs the shutdown hooks, stops the backend. Never waits for the device:
  /// work that cannot be stopped runs on, kept alive by its streams.
  void shutdown() noexcept;
  /// Runs `fn` at shutdown, before the backend stops: for facilities that keep per-device
  /// resources they do not lend to in-flight work (io's cache of free staging buffers).
  void on_shutdown(std::function<void()> fn);

 private:
  alloc_table allocations_;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> pinned_in_use_{0};
  struct pinned_pool;
  std::unique_ptr<pinned_pool> pinned_pool_;
  /// Creates streams until the pool is full (on a cora thread, when the device opens), while
  /// the device's streams are idle; tries again `retry` later (growing) while they are not.
  void fill_stream_pool(std::chrono::milliseconds retry = std::chrono::milliseconds(1)) noexcept;
  std::mutex spare_mutex_;
  std::vector<std::unique_ptr<backend::stream>> spare_streams_;
  std::mutex streams_mutex_;
  std::set<stream_state*> streams_;
  std::mutex hooks_mutex_;
  std::vector<std::function<void()>> shutdown_hooks_;

  // Deferred unloads (unload_later), oldest first; one drain at a time runs on a cora thread.
  struct pending_unload {
    std::unique_ptr<backend::module> module;
    clock::time_point since;
  };
  static constexpr std::size_t unload_defer_count = 1024;
  static constexpr std::chrono::seconds unload_defer_age{30};
  void schedule_unloads(std::chrono::microseconds delay) noexcept;
  void drain_unloads() noexcept;
  /// Takes the oldest queued module (null if none).
  std::unique_ptr<backend::module> take_oldest_unload() noexcept;
  /// Unloads the oldest queued module if the device is idle (run_while_idle); false if not.
  bool unload_one_while_idle();
  mutable std::mutex unload_mutex_;
  std::deque<pending_unload> unloads_;
  bool unload_scheduled_ = false;        // guarded by unload_mutex_
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

/// A FIFO in a ring buffer: unlike std::deque, a steady push/pop cycle allocates nothing.
template <class T>
class fifo_ring {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  T& front() noexcept { return buf_[head_]; }
  T& back() noexcept { return buf_[(head_ + size_ - 1) & (buf_.size() - 1)]; }
  void push_back(T v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
    ++size_;
  }
  void pop_front() noexcept {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  void clear() noexcept { head_ = size_ = 0; }
  template <class F>
  void for_each(F&& f) {
    for (std::size_t i = 0; i < size_; ++i) f(buf_[(head_ + i) & (buf_.size() - 1)]);
  }

 private:
  void grow() {
    std::vector<T> next(buf_.empty() ? 8 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) next[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<T> buf_;  // size: 0 or a power of two
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

class binary_state;

/// What an op keeps alive until it completes (DESIGN rule 7): the module and kernel of a launch,
/// the allocations its pointers lie in, anything else. Holding one costs reference counts only:
/// the usual op (a module, a kernel, up to four allocations) needs no heap allocation.
struct op_keep {
  static constexpr std::size_t inline_refs = 4;

  op_keep() noexcept = default;
  template <class T>
  op_keep(std::shared_ptr<T> a) noexcept : any(std::move(a)) {}  // NOLINT
  op_keep(std::nullptr_t) noexcept {}                                     // NOLINT
  op_keep(op_keep&& o) noexcept { *this = std::move(o); }
  op_keep& operator=(op_keep&& o) noexcept {
    if (this != &o) {
      any = std::move(o.any);
      module = std::move(o.module);
      kernel = std::move(o.kernel);
      for (std::size_t i = 0; i < inline_refs; ++i) refs[i] = std::move(o.refs[i]);
      n_refs = std::exchange(o.n_refs, 0);
      more.swap(o.more);  // keeps both capacities, allocation-free
      o.more.clear();
    }
    return *this;
  }

  /// Adds a reference to an allocation (a no-op for an empty one).
  void add(alloc_ref r) {
    if (!r) return;
    if (n_refs < inline_refs)
      refs[n_refs++] = std::move(r);
    else
      more.push_back(std::move(r));
  }
  /// True if an allocation already held contains `p` (its record is alive: it is held).
  bool covers(const void* p) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto in = [a](const alloc_ref& r) { return a - r.get()->base < r.get()->size; };
    for (std::size_t i = 0; i < n_refs; ++i)
      if (in(refs[i])) return true;
    for (const alloc_ref& r : more)
      if (in(r)) return true;
    return false;
  }
  bool empty() const noexcept { return !any && !module && !kernel && n_refs == 0; }
  void clear() noexcept {
    any.reset();
    kernel.reset();
    module.reset();  // the last reference hands it to its device's unload queue
    for (std::size_t i = 0; i < n_refs; ++i) refs[i].reset();
    n_refs = 0;
    more.clear();
  }

  std::shared_ptr<const void> any;
  std::shared_ptr<backend::module> module;
  std::shared_ptr<const kernel_state> kernel;
  std::array<alloc_ref, inline_refs> refs;
  std::size_t n_refs = 0;
  std::vector<alloc_ref> more;  // a fifth allocation and beyond (rare)
};

/// The keep-alives of a stream's ops in flight, oldest first: a ring that only grows, so once
/// warm, pushing and popping allocate nothing.
class keep_ring {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  std::uint64_t front_seq() const noexcept { return buf_[head_].seq; }
  void push(std::uint64_t seq, op_keep&& k);
  /// Moves the oldest entry's contents into `out` and pops it.
  void pop_into(op_keep& out) noexcept;

 private:
  struct entry {
    std::uint64_t seq = 0;
    op_keep keep;
  };
  std::vector<entry> buf_;  // capacity: a power of two
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

/// Finished ops' keep-alives, released outside the stream's lock. A thread reuses its list, so
/// releasing allocates nothing once warm.
class keep_drop {
 public:
  keep_drop() noexcept;
  ~keep_drop();
  keep_drop(const keep_drop&) = delete;
  keep_drop& operator=(const keep_drop&) = delete;
  op_keep& next();
  /// Releases what was collected (call outside the lock).
  void release() noexcept;
  bool empty() const noexcept { return used_ == 0; }

 private:
  std::vector<op_keep> items_;
  std::size_t used_ = 0;
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
  op_handle enqueue(Submit&& submit, op_keep keep = {});

  /// The submission lock: held across the backend calls that enqueue work or record a marker,
  /// so that they reach the stream in position order. Completion state (markers, waiters,
  /// keep-alives, the error) has its own lock, taken after this one when both are needed, so
  /// that a poller never waits behind a driver call (DESIGN rule 10). Also guards `capture`.
  /// Used directly by launches that stage data first (several backend calls, one position).
  adaptive_mutex& enqueue_mutex() noexcept { return submit_mutex_; }
  std::uint64_t next_seq_locked() const noexcept { return last_seq_.load(std::memory_order_relaxed) + 1; }
  void note_marker_for_tail_locked();
  /// Makes `seq` the last op (submission lock held); for a position with nothing to keep.
  void commit_locked(std::uint64_t seq) noexcept;
  /// The same, keeping `keep` until the op completed. When the keep-alives pile up it observes
  /// progress; what finished ops kept is then moved into `drop` (made only then), for
  /// release_trimmed() after the submission lock is let go.
  void commit_locked(std::uint64_t seq, op_keep keep, std::optional<keep_drop>& drop);
  void release_trimmed(keep_drop& drop) noexcept;
  /// Keeps `keep` alive until everything enqueued so far has completed (stream::free).
  void keep_until_tail(op_keep keep);
  std::uint64_t completed_position() const noexcept { return completed_.load(std::memory_order_acquire); }
  /// The position of the last op enqueued so far.
  std::uint64_t last_position() const noexcept { return last_seq_.load(std::memory_order_acquire); }
  staging_arena& arena() noexcept { return arena_; }

  /// Records a marker right after op `seq` if it is still the last op and has none.
  void mark(std::uint64_t seq);
  /// A handle on "everything enqueued so far" that also reports and clears a fault.
  op_handle synchronize_handle();
  /// True if every op enqueued so far has completed, as last observed (no driver call).
  bool idle_observed() noexcept;
  /// The same, with enqueue_mutex() held by the caller (no op can be enqueued meanwhile).
  bool idle_locked() const noexcept {
    return completed_.load(std::memory_order_acquire) >= last_seq_.load(std::memory_order_relaxed);
  }
  /// For a borrowed native stream whose handle is going: records the marker that tells when
  /// the work already enqueued is done, then tells the backend to leave the native stream be.
  void detach_native() noexcept;
  /// True if every op enqueued so far has completed (queries the driver).
  bool query_idle();

  // completion_source
  bool ready(std::uint64_t seq, std::error_code& ec) noexcept override;
  bool arm(wait_node& node, std::uint64_t seq, const asio::any_io_executor* executor) override;
  bool disarm(wait_node& node) noexcept override;
  std::error_code block(std::uint64_t seq) override;
  std::string message(std::uint64_t seq) const override;
  void dropped(std::uint64_t seq, bool observed) noexcept override;

  /// Advances the completed position past completed markers without firing any waiter.
  bool advance();
  /// Polls the oldest marker; appends the nodes that completed to `fired` (state set, unlinked,
  /// uncounted from their groups). Returns true on progress. Takes no lock when the doorbell
  /// says nothing moved (see quiet()).
  bool poll(std::vector<wait_node*>& fired) { return poll_now(fired, clock::now()); }
  /// The same for a poll group's pass, with its clock `now`: also holds back while the oldest
  /// marker is not due (see due()).
  bool poll_when_due(std::vector<wait_node*>& fired, clock::time_point now) {
    return due(now) && poll_now(fired, now);
  }
  /// True when the stream's doorbell shows that its oldest marker is still pending and no
  /// linked waiter is due: a poll would find nothing. Plain loads, no lock; false when unsure
  /// (no doorbell, the oldest marker does not ring it, or the stream must be asked anyway).
  bool quiet(clock::time_point now) noexcept;
  /// False while a marker the backend must be asked about (no doorbell) is not yet due under
  /// the hybrid policy, and no linked waiter is due either. Plain loads, no lock.
  bool due(clock::time_point now) const noexcept;
  /// True while the oldest marker rings the doorbell (for tests of the doorbell).
  bool watching_doorbell() const noexcept { return bell_watch_.load(std::memory_order_acquire) != 0; }
  /// Polls that took the state lock (for tests of the doorbell).
  std::uint64_t locked_polls() const noexcept { return locked_polls_.load(std::memory_order_relaxed); }
  /// When the oldest marker is expected to complete (max() when unknown or none); no lock.
  clock::time_point expected_ready() const noexcept;
  /// Before this time a poll does not ask the backend about the oldest marker (see due());
  /// min() when it asks at once.
  clock::time_point query_due() const noexcept {
    return clock::time_point(clock::duration(query_due_.load(std::memory_order_relaxed)));
  }
  /// Blocks in the backend on the oldest marker until `deadline`.
  void block_on_front(clock::time_point deadline);
  /// Records a failure that was never observed, to surface at the next wait.
  void set_sticky(std::error_code ec, const std::string& message) noexcept;
  /// Fails every armed wait with `ec` (shutdown).
  void abort_waits(std::error_code ec, poll_group* only = nullptr) noexcept;
  /// Waits (blocking, up to `deadline`) for every enqueued op; false on timeout.
  bool drain(clock::time_point deadline) noexcept;

  /// Graph capture (core/graph_state.hpp): set while the stream takes part in a capture, whose
  /// session `capture` is (guarded by enqueue_mutex()). Ops then become graph nodes.
  std::atomic<bool> capturing{false};
  /// The backend stream came from the device's pool and may go back to it once drained.
  bool pooled = false;
  std::shared_ptr<capture_session> capture;

 private:
  struct marker_rec {
    backend::marker m;
    clock::time_point enqueued;
  };
  /// Records a marker after op `seq` (the last op); submission lock held, state lock not.
  void record_marker_locked(std::uint64_t seq);
  /// True if a marker at or after `s` was recorded (it may have completed since).
  bool marked(std::uint64_t s) const noexcept { return last_marked_.load(std::memory_order_acquire) >= s; }
  std::error_code result_locked(std::uint64_t seq, bool sync) noexcept;
  void link_locked(wait_node& node);
  void unlink_locked(wait_node& node) noexcept;
  /// Publishes what quiet() and expected_ready() read after the oldest marker changed (state
  /// lock held).
  void watch_front_locked() noexcept;
  void watch_head_locked() noexcept {
    head_seq_.store(head_ ? head_->seq : ~std::uint64_t{0}, std::memory_order_release);
  }
  /// Uncounts a node that left the list from its group, under the lock (see
  /// poll_group::end_wait). `hold` keeps the group's reference to this stream, if it was the
  /// last, for the caller to drop after unlocking.
  void uncount_locked(wait_node& node, intrusive_ptr<stream_state>& hold) noexcept;
  /// The same for a node claimed for firing: counted as firing in its group until fire() is
  /// done with it.
  void claim_locked(wait_node& node, intrusive_ptr<stream_state>& hold) noexcept;
  bool poll_locked(std::vector<wait_node*>& fired, keep_drop& drop, intrusive_ptr<stream_state>& hold);
  bool poll_now(std::vector<wait_node*>& fired, clock::time_point now);
  /// Advances `completed` past completed markers and releases finished ops' keep-alives.
  bool advance_locked(keep_drop& drop);
  void learn_locked(const marker_rec& front, clock::time_point now) noexcept;

  // Submitters write the first line, pollers the second: apart, neither evicts the other's.
  alignas(64) adaptive_mutex submit_mutex_;  // see enqueue_mutex()
  std::atomic<std::uint64_t> last_seq_{0};     // written under the submission lock
  std::atomic<std::uint64_t> last_marked_{0};  // the newest marker's position (same)
  alignas(64) mutable adaptive_mutex mutex_;  // completion state: everything below but arena_
  // Pollers between taking finished ops' keep-alives (under the lock) and releasing them
  // (after it): a blocking wait that sees its op complete lets them finish, so that what the
  // op held (its buffers, say) is back in the pools when the wait returns.
  std::atomic<unsigned> releasing_{0};
  void settle_releases() const noexcept;
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> tail_watch_{0};
  // The doorbell (backend::doorbell) and what quiet() compares it with: the oldest marker's
  // position if that marker rings it (else 0), and the first linked waiter's position (else
  // max). recheck_at_ and pending_seen_ are steady-clock counts: when the stream must be asked
  // again whatever the doorbell says, and when a lock-free poll last saw the oldest marker
  // pending (for learning op durations, as a pending query does).
  const backend::doorbell bell_;
  std::atomic<std::uint64_t> bell_watch_{0};
  std::atomic<std::uint64_t> head_seq_{~std::uint64_t{0}};
  std::atomic<clock::rep> recheck_at_{0};
  std::atomic<clock::rep> pending_seen_{0};
  std::atomic<clock::rep> expected_at_{clock::time_point::max().time_since_epoch().count()};
  std::atomic<clock::rep> query_due_{clock::time_point::min().time_since_epoch().count()};
  std::atomic<std::uint64_t> locked_polls_{0};
  fifo_ring<marker_rec> markers_;
  wait_node* head_ = nullptr;
  wait_node* tail_ = nullptr;
  std::atomic<std::uint64_t> error_seq_{~std::uint64_t{0}};
  std::error_code error_;
  std::string error_message_;
  keep_ring keepalive_;
  std::size_t trim_at_ = 256;  // keep-alive count that makes an enqueue observe progress
  staging_arena arena_;  // under the submission lock
  // Learning op durations for the hybrid policy.
  clock::time_point last_done_{};
  clock::time_point last_pending_query_{};
  double ewma_ns_ = 0;
  unsigned late_in_row_ = 0;  // detections in a row that came with no pending query just before
};

/// Marks the calling thread as running a host function of `stream` (stream::host_func), so
/// that a wait on its own stream (which cannot complete before the function returns) fails at
/// once instead of deadlocking.
class host_func_scope {
 public:
  explicit host_func_scope(const stream_state* s) noexcept;
  ~host_func_scope();
  host_func_scope(const host_func_scope&) = delete;
  host_func_scope& operator=(const host_func_scope&) = delete;
  /// The innermost host function running on this thread, or null.
  static const host_func_scope* current() noexcept;

  const stream_state* stream;
  const device_state* device;

 private:
  host_func_scope* outer_;
};

template <class Submit>
op_handle stream_state::enqueue(Submit&& submit, op_keep keep) {
  std::error_code ec;
  std::string message;
  std::optional<keep_drop> drop;  // only when the keep-alives are trimmed
  std::unique_lock lock(submit_mutex_);
  if (device->shut_down.load(std::memory_order_acquire)) {
    lock.unlock();
    return failed_op(make_error_code(errc::runtime_shut_down), "the runtime was shut down", this);
  }
  note_marker_for_tail_locked();
  // A submit that enqueues several backend ops advances it.
  std::uint64_t seq = last_seq_.load(std::memory_order_relaxed) + 1;
  submit(seq, ec, message);
  if (ec) {
    lock.unlock();
    return failed_op(ec, std::move(message), this);
  }
  commit_locked(seq, std::move(keep), drop);
  lock.unlock();
  if (drop && !drop->empty()) release_trimmed(*drop);
  return op_handle(intrusive_ptr<completion_source>::share(this), seq);
}

/// Marks the calling thread, while it lives, as releasing a user's binary handle: a module
/// whose last reference goes meanwhile may be unloaded on this thread (device_state::own_module).
/// The driver is faster to load a module where the previous one was unloaded, so a thread that
/// drops and loads binaries in turn keeps both on itself.
class handle_release {
 public:
  handle_release() noexcept;
  ~handle_release();
  handle_release(const handle_release&) = delete;
  handle_release& operator=(const handle_release&) = delete;
  /// True within a handle_release on the calling thread.
  static bool active() noexcept;
};

class binary_state {
 public:
  std::shared_ptr<device_state> device;
  std::string format;
  std::vector<backend::kernel_desc> kernels;
  // The loaded module; created lazily for lazy loads. Every launch takes the lock: on a line
  // of its own, away from the fields launches only read.
  alignas(64) std::mutex mutex;
  std::shared_ptr<backend::module> module;  // launches in flight hold it too
  std::vector<std::byte> image;             // kept until the module is loaded (lazy loads)
  backend::image_kind image_kind = backend::image_kind::cpu_elf;
  backend::image_key image_key;  // names `image`'s verified bytes (a container's); empty if not
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

/// Cache-line aligned: with make_shared its reference counts then sit on a line of their own,
/// so that the counting every launch does (from any thread) does not evict the fields that
/// every launch reads.
class alignas(64) kernel_state {
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
  // Latest record made during a graph capture: the capture and the nodes it stands for.
  std::shared_ptr<capture_session> capture;
  std::vector<std::size_t> capture_nodes;
  ~event_state();
};

}  // namespace cora::detail
