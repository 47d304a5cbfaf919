// The CPU device: a pool of worker threads that behaves like an accelerator. Streams are
// in-order queues; a launch runs its blocks in parallel on the pool; device memory lives in a
// reserved address range.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_memory.hpp"
#include "backend/cpu/cpu_module.hpp"
#include "cora/detail/cpu_kernel_abi.h"

namespace cora::backend::cpu {

class cpu_device;
class cpu_stream;
struct graph_nodes;

/// Faults the CPU device injects into its own work: a test hook for reliability tests
/// (tests/fault_injection_test.cpp, tests/soak; docs/reliability.md). Each count applies to the
/// next operations of its kind enqueued on any stream of the device, one fault per operation.
struct fault_injection {
  std::atomic<unsigned> alloc_failures{0};  ///< alloc() fails with out_of_memory
  std::atomic<unsigned> copy_faults{0};     ///< a copy or fill writes nothing: copy_fault
  std::atomic<unsigned> kernel_traps{0};    ///< a launch traps without running: kernel_fault
  /// A launch never finishes by itself: it fails with kernel_timeout at its timeout attribute,
  /// or with device_lost when the device is declared lost or shut down.
  std::atomic<unsigned> stuck_kernels{0};

  /// Takes one fault from `count`; false when none is left.
  static bool take(std::atomic<unsigned>& count) noexcept {
    unsigned n = count.load(std::memory_order_relaxed);
    while (n != 0 && !count.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
    }
    return n != 0;
  }
};

struct cpu_event final : event {
  explicit cpu_event(bool t) : timing(t) {}
  const bool timing;
  std::mutex mutex;
  cpu_stream* stream = nullptr;  // where the latest record was enqueued
  std::uint64_t seq = 0;
  std::atomic<std::uint64_t> stamp_ns{0};  // when the latest record ran
};

/// One unit of stream work. Launches and large copies run as several pieces on the pool.
struct op {
  enum class kind : std::uint8_t { copy, fill, launch, host_func, record, wait, graph, value_wait, value_write };
  /// A fault injected into this op when it was enqueued (see fault_injection).
  enum class injected : std::uint8_t { none, copy_fault, trap, stuck };
  kind k = kind::copy;
  injected fault = injected::none;
  std::uint64_t seq = 0;
  cpu_stream* stream = nullptr;

  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::size_t bytes = 0;
  std::size_t chunk = 0;
  std::uint8_t value = 0;     // a fill's byte; a value wait's condition
  std::uint64_t compare = 0;  // a value wait's operand, a value write's value

  cora_cpu_entry_fn entry = nullptr;
  std::vector<std::byte> args;      // launch argument block, or a snapshot of a pageable source
  const void* device_args = nullptr;
  std::uint32_t grid = 0;
  std::uint32_t batch = 1;
  // A launch's blocks in `slices` contiguous ranges, one a worker; claimed[i] once taken.
  std::uint32_t slices = 0;
  std::unique_ptr<std::atomic<std::uint8_t>[]> claimed;
  std::uint32_t claimed_capacity = 0;  // kept across reuse (op_pool)
  std::uint64_t timeout_ns = 0;
  cora_cpu_launch launch{};
  volatile std::uint32_t abort = 0;

  std::function<void()> fn;
  cpu_event* ev = nullptr;
  cpu_stream* wait_stream = nullptr;
  std::uint64_t wait_seq = 0;

  // A graph launch runs its nodes one after another as child ops (cpu_graph.cpp).
  std::shared_ptr<const graph_nodes> graph;
  std::size_t graph_next = 0;
  op* parent = nullptr;  // the graph launch a child op belongs to

  std::atomic<std::uint32_t> next{0};
  std::atomic<std::uint32_t> pieces{0};
  std::atomic<int> status{0};
  std::string message;

  op* free_next = nullptr;  // the op_pool's free list

  /// Returns every field to its initial value, releasing what the op held (a host function,
  /// a graph), but keeping the argument and claim buffers' capacity for the next use.
  void reset() noexcept;
};

/// Recycles a device's ops, so that warm pipelines allocate none (DESIGN section 4, rule 10).
/// Ops are taken when work is enqueued and given back when it finishes; the free list keeps at
/// most `max_free` of them.
class op_pool {
 public:
  /// `slices`: the most slices a launch of the device has (its worker count).
  /// Starts with `prepared` ops on the free list: a stream's first pipelines, and a pipeline
  /// whose ops finish late, take no new ones.
  op_pool(unsigned slices, std::size_t prepared);
  op_pool(const op_pool&) = delete;
  op_pool& operator=(const op_pool&) = delete;
  ~op_pool();
  /// A reset op: a recycled one, or a new one (may throw std::bad_alloc). Every op has room for
  /// a launch's claims and a typical argument block, whatever it was used for before.
  op* take();
  /// Resets `o` and keeps it for reuse (or deletes it when enough are kept).
  void give(op* o) noexcept;

 private:
  op* make();
  static constexpr std::size_t max_free = 1024;
  const unsigned slices_;
  std::mutex mutex_;
  op* free_ = nullptr;
  std::size_t count_ = 0;
};

/// A FIFO of ops in a ring buffer: unlike std::deque, it allocates only when it grows past its
/// largest size so far, never in a steady state.
class op_queue {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  op* front() const noexcept { return ring_[head_]; }
  void pop_front() noexcept {
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
  }
  void push_back(op* o) {
    if (size_ == ring_.size()) grow();
    ring_[(head_ + size_) & (ring_.size() - 1)] = o;
    ++size_;
  }
  void clear() noexcept {
    head_ = 0;
    size_ = 0;
  }
  template <class F>
  void for_each(F f) const {
    for (std::size_t i = 0; i < size_; ++i) f(ring_[(head_ + i) & (ring_.size() - 1)]);
  }

 private:
  void grow() {
    std::vector<op*> bigger(ring_.empty() ? 64 : ring_.size() * 2);  // a power of two
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = ring_[(head_ + i) & (ring_.size() - 1)];
    ring_.swap(bigger);
    head_ = 0;
  }
  std::vector<op*> ring_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

/// Worker threads sharing one queue of op pieces.
class worker_pool {
 public:
  worker_pool(cpu_device& device, unsigned threads);
  ~worker_pool();
  /// Queues `pieces` pieces of `o`; false (nothing queued) once the pool has stopped.
  bool submit(op* o, unsigned pieces);
  /// Stops the workers taking work (without waiting for the pieces they run); the pieces still
  /// queued are moved to `left`, one entry per piece.
  void stop(std::vector<op*>& left) noexcept;
  unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()); }

 private:
  void run(unsigned index);
  cpu_device& device_;
  std::mutex mutex_;
  std::condition_variable cv_;
  op_queue queue_;
  std::atomic<std::size_t> queued_{0};
  unsigned sleeping_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class cpu_stream final : public stream {
 public:
  explicit cpu_stream(cpu_device& device);
  ~cpu_stream() override;

  void copy(std::uint64_t seq, void* dst, const void* src, std::size_t bytes,
            bool src_pageable) override;
  void fill(std::uint64_t seq, void* dst, std::uint8_t value, std::size_t bytes) override;
  void launch(std::uint64_t seq, const launch_desc& launch, std::error_code& ec,
              std::string& message) override;
  void host_func(std::uint64_t seq, std::function<void()> fn, std::error_code& ec) override;
  void record(std::uint64_t seq, event& ev) override;
  void wait(std::uint64_t seq, event& ev) override;
  void launch_graph(std::uint64_t seq, graph_exec& graph, std::error_code& ec,
                    std::string& message) override;
  void wait_value(std::uint64_t seq, const void* addr, value_memory where, std::uint64_t value,
                  unsigned condition, bool wide, std::error_code& ec, std::string& message) override;
  void write_value(std::uint64_t seq, void* addr, value_memory where, std::uint64_t value,
                   bool wide, std::error_code& ec, std::string& message) override;

  marker record_marker(std::uint64_t seq) override;
  marker_state query(const marker& m) override;
  /// Exact: a failed op moves it too, as every op completes.
  doorbell bell() const noexcept override { return {&rung_, {}}; }
  bool wait_marker(const marker& m, clock::time_point deadline) override;
  void release_marker(const marker&) noexcept override {}
  fault take_fault() override;
  bool stop_on_failure(bool stop) noexcept override {
    stop_on_failure_.store(stop, std::memory_order_release);
    return true;
  }
  void resume() noexcept override;
  bool abort() noexcept override;
  /// True when ops that have not started must not run: the stream stops on failure and an op
  /// failed since the last resume(). Then `status` is that failure's and `seq` its op.
  bool halted(int& status, std::uint64_t& seq) noexcept;

  std::uint64_t completed() const noexcept { return completed_.load(std::memory_order_acquire); }

  // Called by the device.
  void push(op* o);
  /// Marks `o` done; returns the ops that can start now.
  void finished(op* o, std::vector<op*>& ready);
  /// Registers a wait op of another stream that needs our op `seq`; false if already done.
  bool add_dependent(std::uint64_t seq, op* waiter);
  void abort_running() noexcept;

 private:
  cpu_device& device_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int blocked_ = 0;
  op_queue queue_;
  op* running_ = nullptr;
  std::atomic<std::uint64_t> completed_{0};
  std::uint32_t rung_ = 0;  // the doorbell: completed_'s low 32 bits (atomic stores and loads)
  std::atomic<std::uint64_t> fault_seq_{~std::uint64_t{0}};
  fault fault_;
  std::atomic<bool> stop_on_failure_{false};
  // The failed op that halts the stream (stop on failure) and its status, until resume();
  // kept apart from fault_, which the core takes as soon as it sees the failure.
  std::uint64_t halt_seq_ = ~std::uint64_t{0};  // guarded by mutex_
  int halt_status_ = 0;
  std::vector<std::pair<std::uint64_t, op*>> dependents_;
};

class cpu_device final : public device {
 public:
  cpu_device(unsigned ordinal, unsigned compute_units, std::size_t memory);
  ~cpu_device() override;

  const device_info& info() const override { return info_; }
  void* alloc(std::size_t bytes, std::error_code& ec) override;
  void free(void* p, std::size_t bytes) noexcept override;
  /// Gives back the pages that small frees kept (every free page: `keep` is not counted here).
  void trim(std::size_t keep) noexcept override;
  void* alloc_host(std::size_t bytes, std::error_code& ec) override;
  void free_host(void* p) noexcept override;
  bool owns_address(const void* p) const noexcept override { return memory_.contains(p); }
  void copy_sync(void* dst, const void* src, std::size_t bytes, std::error_code& ec) override;
  std::unique_ptr<stream> create_stream(int priority, marker_wakeup wakeup,
                                        std::error_code& ec) override;
  std::unique_ptr<event> create_event(bool timing, std::error_code& ec) override;
  double elapsed_ms(event& start, event& end, std::error_code& ec) override;
  bool event_done(event& ev, std::error_code& ec) override;
  bool accepts(image_kind kind) const override { return kind == image_kind::cpu_elf; }
  std::unique_ptr<module> load(std::span<const std::byte> image, image_kind kind,
                               const image_key& key, std::error_code& ec,
                               std::string& message) override;
  std::unique_ptr<module> load_kept(const image_key& key, image_kind kind, std::error_code& ec,
                                    std::string& message) override;
  bool keeps_images() const noexcept override { return true; }
  /// The globals of loaded images that were looked up are device memory (see global_ranges).
  foreign_memory describe_pointer(const void* p) noexcept override {
    const auto [base, size] = globals_->find(p);
    if (!size) return {};
    return {foreign_memory::kind::device, base, size};
  }
  std::unique_ptr<graph_exec> instantiate(std::span<const graph_node_desc> nodes,
                                          std::error_code& ec, std::string& message) override;
  std::uint64_t markers_recorded() const override {
    return markers_.load(std::memory_order_relaxed);
  }
  void shutdown() noexcept override;
  bool on_own_thread() const noexcept override;

  // Used by streams and workers.
  void start(op* o);
  void run_piece(op* o, unsigned worker);
  /// What every launch must satisfy on this device; false with ec and message set.
  bool check_launch(const launch_config& cfg, std::error_code& ec, std::string& message) const;
  /// The next child op of graph launch `parent`, or null when it has run (or failed).
  op* next_graph_op(op* parent);
  void count_marker() noexcept { markers_.fetch_add(1, std::memory_order_relaxed); }
  void add_stream(cpu_stream* s);
  void remove_stream(cpu_stream* s);
  unsigned workers() const noexcept { return pool_.size(); }
  bool stopped() const noexcept { return stopped_.load(std::memory_order_acquire); }
  /// Completes an op that will not run (the device was shut down) with runtime_shut_down.
  void abandon(op* o) noexcept;

  /// Where the device's streams take their ops from.
  op_pool& ops() noexcept { return ops_; }

  /// The device's fault injection plan (a test hook).
  fault_injection& faults() noexcept { return faults_; }
  /// Declares the device lost, as a driver does after an unrecoverable error: running and
  /// queued work stops and fails with device_lost, as does everything enqueued later;
  /// allocations, loads and new streams fail with device_lost. There is no way back.
  void declare_lost() noexcept;
  bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }

 private:
  void finish(op* o);
  void execute(op* o, unsigned worker);
  void run_slice(op* o, std::uint32_t slice);
  void run_injected(op* o);
  /// Fails `o` without running it when its stream stops on failure and has failed, or when it
  /// was discarded by an abort; true then.
  bool skip_halted(op* o) noexcept;
 public:
  /// Ends the value wait `o` of an aborted stream if the watcher still holds it; true then.
  bool cancel_value_wait(op* o) noexcept;
 private:
  /// Hands a value wait whose condition does not hold yet to the value watcher.
  void watch_value(op* o);
  /// The value watcher's thread: polls the waiting ops with a growing pause, finishes those
  /// whose condition holds (or whose device was lost), until the device shuts down.
  void watch_values() noexcept;

  device_info info_;
  device_memory memory_;
  std::atomic<std::uint64_t> markers_{0};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> lost_{false};
  fault_injection faults_;
  std::shared_ptr<global_ranges> globals_ = std::make_shared<global_ranges>();
  std::shared_ptr<kept_images> kept_ = std::make_shared<kept_images>();
  std::mutex streams_mutex_;
  std::set<cpu_stream*> streams_;
  // Value waits whose condition did not hold when they started, polled by value_thread_
  // (started at the first such wait), so that no worker is held by a wait.
  std::mutex value_mutex_;
  std::condition_variable value_cv_;
  std::vector<op*> value_waits_;
  bool value_stop_ = false;
  std::thread value_thread_;
  op_pool ops_;  // before pool_: workers give ops back until they are joined
  worker_pool pool_;  // last: its threads use the members above
};

}  // namespace cora::backend::cpu
