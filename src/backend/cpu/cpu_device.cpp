#include "backend/cpu/cpu_device.hpp"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "backend/cpu/cpu_module.hpp"
#include "cora/error.hpp"

namespace cora::backend::cpu {

namespace {

// The device whose worker or value thread this is (on_own_thread()).
thread_local const cpu_device* own_device = nullptr;

std::uint64_t now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Idle workers spin this long before sleeping, so back-to-back work skips a futex wake.
constexpr auto worker_spin = std::chrono::microseconds(20);
// Copies are split into pieces of at least this many bytes.
constexpr std::size_t copy_piece = std::size_t{1} << 20;
// A recycled op keeps an argument buffer up to this size (launch arguments are far smaller).
constexpr std::size_t recycled_args_capacity = 4096;
// What a new op reserves for launch arguments: most argument blocks fit.
constexpr std::size_t initial_args_capacity = 128;
// The ops a device prepares when it starts (op_pool).
constexpr std::size_t prepared_ops = 32;

// finish()'s work lists, kept per thread so that a warm pipeline allocates none. finish() can
// run again inside itself on the same thread (start() finishes a wait op or an abandoned one):
// the inner call then uses lists of its own.
struct finish_lists {
  std::vector<op*> todo;
  std::vector<op*> ready;
  bool busy = false;
};
thread_local finish_lists thread_finish_lists;

// Status of an op whose injected copy fault ran; beside the kernel ABI's statuses.
constexpr int status_copy_fault = 100;
// Status of an op that never ran, or was stopped, because the runtime was shut down.
constexpr int status_shut_down = 101;
// Status of an op discarded by an abort of its stream before it ran.
constexpr int status_aborted = 102;

// The abort flag is read by running kernels while the device sets it: atomically, though the
// kernel ABI shows it as a plain volatile word.
void set_abort(op* o) noexcept { __atomic_store_n(&o->abort, 1u, __ATOMIC_RELAXED); }

void mark_shut_down(op* o) noexcept {
  int expected = CORA_CPU_OK;
  if (o->status.compare_exchange_strong(expected, status_shut_down, std::memory_order_acq_rel)) {
    try {
      o->message = "the runtime was shut down before the operation ran";
    } catch (...) {
    }
  }
}
bool aborted(const op* o) noexcept {
  // A graph's child op also stops when its graph launch is stopped.
  return __atomic_load_n(&o->abort, __ATOMIC_RELAXED) != 0 ||
         (o->parent && __atomic_load_n(&o->parent->abort, __ATOMIC_RELAXED) != 0);
}

// Whether a value wait's condition holds now (conditions as backend::stream::wait_value).
bool value_met(const op* o) noexcept {
  const bool wide = o->bytes == 8;
  const std::uint64_t v =
      wide ? __atomic_load_n(reinterpret_cast<const std::uint64_t*>(o->src), __ATOMIC_ACQUIRE)
           : __atomic_load_n(reinterpret_cast<const std::uint32_t*>(o->src), __ATOMIC_ACQUIRE);
  const std::uint64_t mask = wide ? ~std::uint64_t{0} : 0xffffffffu;
  const std::uint64_t want = o->compare & mask;
  switch (o->value) {
    case 0:  // cyclic "at least": the difference, as a signed word, is not negative
      return wide ? static_cast<std::int64_t>(v - want) >= 0
                  : static_cast<std::int32_t>(static_cast<std::uint32_t>(v - want)) >= 0;
    case 1: return v == want;
    case 2: return (v & want) != 0;
    default: return (~(v | want) & mask) != 0;
  }
}

std::error_code status_code(int status) {
  switch (status) {
    case CORA_CPU_TIMEOUT: return make_error_code(errc::kernel_timeout);
    case CORA_CPU_ABORTED: return make_error_code(errc::device_lost);
    case status_copy_fault: return make_error_code(errc::copy_fault);
    case status_shut_down: return make_error_code(errc::runtime_shut_down);
    case status_aborted: return make_error_code(errc::aborted);
    default: return make_error_code(errc::kernel_fault);
  }
}

// The CPUs of each NUMA node that the process may run on (nodes without any left out).
std::vector<cpu_set_t> numa_nodes(const cpu_set_t& allowed) {
  std::vector<cpu_set_t> nodes;
  for (int node = 0; node < 1024; ++node) {
    std::FILE* f = std::fopen(("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist").c_str(), "r");
    if (!f) break;
    char line[4096] = {};
    const bool read = std::fgets(line, sizeof(line), f) != nullptr;
    std::fclose(f);
    if (!read) continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    // "0-15,32-47"
    for (char* p = line; *p && *p != '\n';) {
      char* end = nullptr;
      const long lo = std::strtol(p, &end, 10);
      long hi = lo;
      if (end == p) break;
      p = end;
      if (*p == '-') {
        hi = std::strtol(p + 1, &end, 10);
        p = end;
      }
      for (long c = lo; c <= hi && c < CPU_SETSIZE; ++c)
        if (c >= 0 && CPU_ISSET(static_cast<int>(c), &allowed)) CPU_SET(static_cast<int>(c), &set);
      if (*p == ',') ++p;
    }
    if (CPU_COUNT(&set) > 0) nodes.push_back(set);
  }
  return nodes;
}

// Pins worker `index` of `workers` where the machine allows it without harm. On a machine with
// several NUMA nodes each worker is kept on one node (workers spread over the nodes in order),
// so slice i of every launch runs next to the memory it first touched. Workers are not pinned
// to single cores by default: the process's other threads (callers spinning on completions,
// the I/O thread) would then compete with a worker that cannot move, which on a busy or small
// machine costs milliseconds. CORA_CPU_PIN=0 turns pinning off, CORA_CPU_PIN=core pins each
// worker to one core (when there are at least as many CPUs as workers).
void pin_worker(unsigned index, unsigned workers) noexcept {
  const char* v = std::getenv("CORA_CPU_PIN");
  if (v && std::strcmp(v, "0") == 0) return;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  if (v && std::strcmp(v, "core") == 0) {
    if (static_cast<unsigned>(CPU_COUNT(&allowed)) < workers) return;
    unsigned seen = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &allowed) || seen++ != index) continue;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      ::pthread_setaffinity_np(::pthread_self(), sizeof(one), &one);
      return;
    }
    return;
  }
  try {
    const auto nodes = numa_nodes(allowed);
    if (nodes.size() < 2) return;
    const std::size_t node = static_cast<std::size_t>(index) * nodes.size() / workers;
    ::pthread_setaffinity_np(::pthread_self(), sizeof(cpu_set_t), &nodes[node]);
  } catch (...) {
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// op, op_pool

void op::reset() noexcept {
  k = kind::copy;
  fault = injected::none;
  seq = 0;
  stream = nullptr;
  dst = nullptr;
  src = nullptr;
  bytes = 0;
  chunk = 0;
  value = 0;
  compare = 0;
  entry = nullptr;
  // A launch's argument block is small: kept. A large one (a pageable copy's snapshot) is freed.
  if (args.capacity() > recycled_args_capacity)
    std::vector<std::byte>().swap(args);
  else
    args.clear();
  device_args = nullptr;
  grid = 0;
  batch = 1;
  slices = 0;
  // claimed and claimed_capacity are kept: start() clears the slices it uses.
  timeout_ns = 0;
  launch = cora_cpu_launch{};
  abort = 0;
  fn = nullptr;
  ev = nullptr;
  wait_stream = nullptr;
  wait_seq = 0;
  graph.reset();
  graph_next = 0;
  parent = nullptr;
  next.store(0, std::memory_order_relaxed);
  pieces.store(0, std::memory_order_relaxed);
  status.store(0, std::memory_order_relaxed);
  message.clear();
  free_next = nullptr;
}

op_pool::op_pool(unsigned slices, std::size_t prepared) : slices_(slices) {
  // New ones: take() would hand back the op just given.
  for (std::size_t i = 0; i < prepared; ++i) give(make());
}

op_pool::~op_pool() {
  while (op* o = free_) {
    free_ = o->free_next;
    delete o;
  }
}

op* op_pool::take() {
  {
    std::lock_guard lock(mutex_);
    if (op* o = free_) {
      free_ = o->free_next;
      --count_;
      o->free_next = nullptr;
      return o;
    }
  }
  return make();
}

op* op_pool::make() {
  auto o = std::make_unique<op>();
  o->args.reserve(initial_args_capacity);
  o->claimed.reset(new std::atomic<std::uint8_t>[slices_]());
  o->claimed_capacity = slices_;
  return o.release();
}

void op_pool::give(op* o) noexcept {
  o->reset();
  {
    std::lock_guard lock(mutex_);
    if (count_ < max_free) {
      o->free_next = free_;
      free_ = o;
      ++count_;
      return;
    }
  }
  delete o;
}

// ---------------------------------------------------------------------------------------------
// worker_pool

worker_pool::worker_pool(cpu_device& device, unsigned threads) : device_(device) {
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i)
    threads_.emplace_back([this, i, threads] {
      own_device = &device_;
      pin_worker(i, threads);
      run(i);
    });
}

worker_pool::~worker_pool() {
  std::vector<op*> left;
  stop(left);  // the device already finished what was left when it shut down
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

bool worker_pool::submit(op* o, unsigned pieces) {
  o->pieces.store(pieces, std::memory_order_relaxed);
  bool wake;
  {
    std::lock_guard lock(mutex_);
    if (stop_) return false;
    for (unsigned i = 0; i < pieces; ++i) queue_.push_back(o);
    queued_.fetch_add(pieces, std::memory_order_release);
    wake = sleeping_ > 0;
  }
  if (wake) {
    if (pieces > 1)
      cv_.notify_all();
    else
      cv_.notify_one();
  }
  return true;
}

void worker_pool::stop(std::vector<op*>& left) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  // Not joined here: a worker may be running a host function that waits for the thread that
  // shuts the runtime down. Workers take nothing more from the queue; the destructor joins.
  std::lock_guard lock(mutex_);
  try {
    left.clear();
    left.reserve(queue_.size());
    queue_.for_each([&](op* o) { left.push_back(o); });
  } catch (...) {
  }
  queue_.clear();
  queued_.store(0, std::memory_order_relaxed);
}

void worker_pool::run(unsigned index) {
  for (;;) {
    // Spin briefly before sleeping: a device that has just finished work is likely to get more.
    const auto spin_until = std::chrono::steady_clock::now() + worker_spin;
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < spin_until)
      for (int i = 0; i < 64; ++i) cpu_relax();
    op* o;
    {
      std::unique_lock lock(mutex_);
      while (queue_.empty() && !stop_) {
        ++sleeping_;
        cv_.wait(lock);
        --sleeping_;
      }
      if (stop_) return;  // what is left belongs to stop()
      o = queue_.front();
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    device_.run_piece(o, index);
  }
}

// ---------------------------------------------------------------------------------------------
// cpu_stream

cpu_stream::cpu_stream(cpu_device& device) : device_(device) { device_.add_stream(this); }

cpu_stream::~cpu_stream() {
  // The core destroys a stream only once its work has completed; wait anyway, to be safe.
  // Every op completes, even after a shutdown (ops that never ran complete with
  // runtime_shut_down), and a worker may still be running one: never free it under it.
  std::unique_lock lock(mutex_);
  ++blocked_;
  cv_.wait(lock, [&] { return running_ == nullptr; });
  --blocked_;
  lock.unlock();
  device_.remove_stream(this);
}

void cpu_stream::push(op* o) {
  o->stream = this;
  {
    std::lock_guard lock(mutex_);
    if (running_) {
      queue_.push_back(o);
      return;
    }
    running_ = o;
  }
  device_.start(o);
}

void cpu_stream::finished(op* o, std::vector<op*>& ready) {
  std::lock_guard lock(mutex_);
  // On a lost device nothing completes successfully, event waits and records included.
  if (device_.lost()) {
    int expected = CORA_CPU_OK;
    if (o->status.compare_exchange_strong(expected, CORA_CPU_ABORTED, std::memory_order_acq_rel))
      o->message = "device lost";
  }
  const int status = o->status.load(std::memory_order_acquire);
  if (status != CORA_CPU_OK && fault_seq_.load(std::memory_order_relaxed) == ~std::uint64_t{0}) {
    fault_ = {o->seq, status_code(status), o->message};
    fault_seq_.store(o->seq, std::memory_order_relaxed);
  }
  if (status != CORA_CPU_OK && halt_seq_ == ~std::uint64_t{0} &&
      stop_on_failure_.load(std::memory_order_relaxed)) {
    halt_seq_ = o->seq;
    halt_status_ = status;
  }
  completed_.store(o->seq, std::memory_order_release);
  __atomic_store_n(&rung_, static_cast<std::uint32_t>(o->seq), __ATOMIC_RELEASE);
  if (blocked_) cv_.notify_all();
  for (auto it = dependents_.begin(); it != dependents_.end();) {
    if (it->first <= o->seq) {
      ready.push_back(it->second);
      it = dependents_.erase(it);
    } else {
      ++it;
    }
  }
  if (queue_.empty()) {
    running_ = nullptr;
  } else {
    running_ = queue_.front();
    queue_.pop_front();
    ready.push_back(running_);
  }
}

bool cpu_stream::add_dependent(std::uint64_t seq, op* waiter) {
  std::lock_guard lock(mutex_);
  if (completed_.load(std::memory_order_relaxed) >= seq) return false;
  dependents_.emplace_back(seq, waiter);
  return true;
}

void cpu_stream::abort_running() noexcept {
  std::lock_guard lock(mutex_);
  if (running_) set_abort(running_);
  queue_.for_each([](op* o) { set_abort(o); });
}

void cpu_stream::copy(std::uint64_t seq, void* dst, const void* src, std::size_t bytes,
                      bool src_pageable) {
  auto* o = device_.ops().take();
  o->k = op::kind::copy;
  o->seq = seq;
  o->dst = static_cast<std::byte*>(dst);
  if (src_pageable) {
    o->args.assign(static_cast<const std::byte*>(src), static_cast<const std::byte*>(src) + bytes);
    o->src = o->args.data();
  } else {
    o->src = static_cast<const std::byte*>(src);
  }
  o->bytes = bytes;
  if (fault_injection::take(device_.faults().copy_faults)) o->fault = op::injected::copy_fault;
  push(o);
}

void cpu_stream::fill(std::uint64_t seq, void* dst, std::uint8_t value, std::size_t bytes) {
  auto* o = device_.ops().take();
  o->k = op::kind::fill;
  o->seq = seq;
  o->dst = static_cast<std::byte*>(dst);
  o->value = value;
  o->bytes = bytes;
  if (fault_injection::take(device_.faults().copy_faults)) o->fault = op::injected::copy_fault;
  push(o);
}

bool cpu_device::check_launch(const launch_config& cfg, std::error_code& ec,
                              std::string& message) const {
  if (cfg.block.volume() == 0 || cfg.block.volume() > CORA_CPU_MAX_BLOCK_THREADS) {
    ec = make_error_code(errc::invalid_launch_config);
    message = "a CPU-device block has 1 to " + std::to_string(CORA_CPU_MAX_BLOCK_THREADS) +
              " threads, not " + std::to_string(cfg.block.volume());
    return false;
  }
  if (cfg.shared_bytes != 0) {
    ec = make_error_code(errc::not_supported);
    message = "the CPU device has no dynamic shared memory";
    return false;
  }
  if (cfg.cluster || cfg.priority) {
    ec = make_error_code(errc::not_supported);
    message = "the CPU device supports neither thread-block clusters nor launch priorities";
    return false;
  }
  const std::uint64_t blocks = cfg.grid.volume();
  if ((cfg.cooperative || cfg.schedule == schedule_mode::batch) && blocks > pool_.size()) {
    ec = make_error_code(errc::invalid_launch_config);
    message = "a cooperative or batch launch needs every block resident: grid " +
              std::to_string(blocks) + " exceeds the device's " +
              std::to_string(pool_.size()) + " compute units";
    return false;
  }
  return true;
}

void cpu_stream::launch(std::uint64_t seq, const launch_desc& l, std::error_code& ec,
                        std::string& message) {
  const auto& cfg = l.config;
  if (!device_.check_launch(cfg, ec, message)) return;
  const std::uint64_t blocks = cfg.grid.volume();
  auto* o = device_.ops().take();
  o->k = op::kind::launch;
  o->seq = seq;
  o->entry = reinterpret_cast<cora_cpu_entry_fn>(l.function);
  if (l.device_args)
    o->device_args = l.device_args;
  else
    o->args.assign(static_cast<const std::byte*>(l.args),
                   static_cast<const std::byte*>(l.args) + l.args_size);
  o->grid = static_cast<std::uint32_t>(blocks);
  o->launch.grid[0] = cfg.grid.x;
  o->launch.grid[1] = cfg.grid.y;
  o->launch.grid[2] = cfg.grid.z;
  o->launch.block_count = o->grid;
  o->launch.block[0] = cfg.block.x;
  o->launch.block[1] = cfg.block.y;
  o->launch.block[2] = cfg.block.z;
  o->launch.block_threads = static_cast<std::uint32_t>(cfg.block.volume());
  o->timeout_ns = static_cast<std::uint64_t>(cfg.timeout.count()) * 1000u;
  if (fault_injection::take(device_.faults().kernel_traps))
    o->fault = op::injected::trap;
  else if (fault_injection::take(device_.faults().stuck_kernels))
    o->fault = op::injected::stuck;
  ec.clear();
  push(o);
}

void cpu_stream::host_func(std::uint64_t seq, std::function<void()> fn, std::error_code& ec) {
  auto* o = device_.ops().take();
  o->k = op::kind::host_func;
  o->seq = seq;
  o->fn = std::move(fn);
  ec.clear();
  push(o);
}

void cpu_stream::record(std::uint64_t seq, event& ev) {
  auto& e = static_cast<cpu_event&>(ev);
  {
    std::lock_guard lock(e.mutex);
    e.stream = this;
    e.seq = seq;
  }
  auto* o = device_.ops().take();
  o->k = op::kind::record;
  o->seq = seq;
  o->ev = &e;
  push(o);
}

void cpu_stream::wait(std::uint64_t seq, event& ev) {
  auto& e = static_cast<cpu_event&>(ev);
  auto* o = device_.ops().take();
  o->k = op::kind::wait;
  o->seq = seq;
  {
    std::lock_guard lock(e.mutex);
    o->wait_stream = e.stream;
    o->wait_seq = e.seq;
  }
  push(o);
}

void cpu_stream::wait_value(std::uint64_t seq, const void* addr, value_memory, std::uint64_t value,
                            unsigned condition, bool wide, std::error_code& ec, std::string&) {
  auto* o = device_.ops().take();
  o->k = op::kind::value_wait;
  o->seq = seq;
  o->src = static_cast<const std::byte*>(addr);
  o->bytes = wide ? 8 : 4;
  o->value = static_cast<std::uint8_t>(condition);
  o->compare = value;
  ec.clear();
  push(o);
}

void cpu_stream::write_value(std::uint64_t seq, void* addr, value_memory, std::uint64_t value,
                             bool wide, std::error_code& ec, std::string&) {
  auto* o = device_.ops().take();
  o->k = op::kind::value_write;
  o->seq = seq;
  o->dst = static_cast<std::byte*>(addr);
  o->bytes = wide ? 8 : 4;
  o->compare = value;
  ec.clear();
  push(o);
}

marker cpu_stream::record_marker(std::uint64_t seq) {
  device_.count_marker();
  return {seq, nullptr, true};
}

marker_state cpu_stream::query(const marker& m) {
  if (completed_.load(std::memory_order_acquire) < m.seq) return marker_state::pending;
  return fault_seq_.load(std::memory_order_acquire) <= m.seq ? marker_state::failed
                                                              : marker_state::done;
}

bool cpu_stream::wait_marker(const marker& m, clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  ++blocked_;
  const bool done = cv_.wait_until(lock, deadline, [&] {
    return completed_.load(std::memory_order_relaxed) >= m.seq;
  });
  --blocked_;
  return done;
}

bool cpu_stream::halted(int& status, std::uint64_t& seq) noexcept {
  if (!stop_on_failure_.load(std::memory_order_acquire)) return false;
  std::lock_guard lock(mutex_);
  if (halt_seq_ == ~std::uint64_t{0}) return false;
  seq = halt_seq_;
  status = halt_status_;
  return true;
}

// Marks `o` discarded by an abort (unless it already failed).
static void mark_aborted(op* o) noexcept {
  int expected = CORA_CPU_OK;
  if (o->status.compare_exchange_strong(expected, status_aborted, std::memory_order_acq_rel)) {
    try {
      o->message = "discarded by an abort of its stream before it ran";
    } catch (...) {
    }
  }
}

bool cpu_stream::abort() noexcept {
  op* waiting = nullptr;
  {
    std::lock_guard lock(mutex_);
    // Queued ops keep their place and complete in order, each skipped when its turn comes.
    queue_.for_each([](op* o) { mark_aborted(o); });
    if (running_ && running_->k == op::kind::value_wait) {
      waiting = running_;
      mark_aborted(waiting);  // also ends it if the watcher has not taken it yet
    }
  }
  if (waiting) device_.cancel_value_wait(waiting);
  return true;
}

void cpu_stream::resume() noexcept {
  std::lock_guard lock(mutex_);
  halt_seq_ = ~std::uint64_t{0};
}

fault cpu_stream::take_fault() {
  std::lock_guard lock(mutex_);
  fault f = std::move(fault_);
  fault_ = {};
  fault_seq_.store(~std::uint64_t{0}, std::memory_order_release);
  return f;
}

// ---------------------------------------------------------------------------------------------
// cpu_device

cpu_device::cpu_device(unsigned ordinal, unsigned compute_units, std::size_t memory)
    : memory_(memory), ops_(compute_units, prepared_ops), pool_(*this, compute_units) {
  info_.name = "CPU device " + std::to_string(ordinal) + " (" + std::to_string(compute_units) +
               " compute units)";
  info_.backend = "cpu";
  info_.ordinal = ordinal;
  info_.compute_units = compute_units;
  info_.total_memory = memory;
  info_.max_grid = dim3(0x7fffffffu, 65535u, 65535u);
  info_.max_block = dim3(CORA_CPU_MAX_BLOCK_THREADS, CORA_CPU_MAX_BLOCK_THREADS, 64);
  info_.max_threads_per_block = CORA_CPU_MAX_BLOCK_THREADS;
  info_.max_shared_bytes = 0;
  info_.driver = "cora cpu backend";
}

cpu_device::~cpu_device() { shutdown(); }

void* cpu_device::alloc(std::size_t bytes, std::error_code& ec) {
  if (lost()) {
    ec = make_error_code(errc::device_lost);
    return nullptr;
  }
  if (fault_injection::take(faults_.alloc_failures)) {
    ec = make_error_code(errc::out_of_memory);
    return nullptr;
  }
  return memory_.allocate(bytes, ec);
}

void cpu_device::free(void* p, std::size_t) noexcept { memory_.deallocate(p); }

void cpu_device::trim(std::size_t) noexcept { memory_.release_free_pages(); }

void* cpu_device::alloc_host(std::size_t bytes, std::error_code& ec) {
  if (bytes == 0) {
    ec = make_error_code(errc::invalid_argument);
    return nullptr;
  }
  // Rounded up to the alignment, as aligned_alloc requires; a size that would wrap fails.
  void* p = bytes > SIZE_MAX - 63 ? nullptr : std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    ec = make_error_code(errc::out_of_memory);
    return nullptr;
  }
  ec.clear();
  return p;
}

void cpu_device::free_host(void* p) noexcept { std::free(p); }

void cpu_device::copy_sync(void* dst, const void* src, std::size_t bytes, std::error_code& ec) {
  std::memmove(dst, src, bytes);
  ec.clear();
}

std::unique_ptr<stream> cpu_device::create_stream(int, marker_wakeup, std::error_code& ec) {
  if (lost()) {
    ec = make_error_code(errc::device_lost);
    return nullptr;
  }
  ec.clear();
  return std::make_unique<cpu_stream>(*this);
}

std::unique_ptr<event> cpu_device::create_event(bool timing, std::error_code& ec) {
  ec.clear();
  return std::make_unique<cpu_event>(timing);
}

double cpu_device::elapsed_ms(event& start, event& end, std::error_code& ec) {
  auto& a = static_cast<cpu_event&>(start);
  auto& b = static_cast<cpu_event&>(end);
  if (!a.timing || !b.timing) {
    ec = make_error_code(errc::invalid_argument);
    return 0;
  }
  if (!event_done(a, ec) || !event_done(b, ec) || !a.stream || !b.stream) {
    if (!ec) ec = make_error_code(errc::not_ready);
    return 0;
  }
  ec.clear();
  const auto t0 = a.stamp_ns.load(std::memory_order_acquire);
  const auto t1 = b.stamp_ns.load(std::memory_order_acquire);
  return (static_cast<double>(t1) - static_cast<double>(t0)) / 1e6;
}

bool cpu_device::event_done(event& ev, std::error_code& ec) {
  auto& e = static_cast<cpu_event&>(ev);
  ec.clear();
  std::lock_guard lock(e.mutex);
  return !e.stream || e.stream->completed() >= e.seq;
}

std::unique_ptr<module> cpu_device::load(std::span<const std::byte> image, image_kind kind,
                                         const image_key& key, std::error_code& ec,
                                         std::string& message) {
  if (lost()) {
    ec = make_error_code(errc::device_lost);
    message = "device lost";
    return nullptr;
  }
  if (kind != image_kind::cpu_elf) {
    ec = make_error_code(errc::invalid_binary);
    message = "the CPU device runs only CPU kernel images";
    return nullptr;
  }
  if (auto m = load_kept(key, kind, ec, message)) return m;
  return cpu_module::load(image, ec, message, globals_, key ? kept_ : nullptr, key);
}

std::unique_ptr<module> cpu_device::load_kept(const image_key& key, image_kind kind,
                                              std::error_code& ec, std::string& message) {
  ec.clear();
  if (lost() || kind != image_kind::cpu_elf || !key) return nullptr;
  const int fd = kept_->take(key);
  if (fd < 0) return nullptr;
  auto m = cpu_module::open(fd, ec, message, globals_, kept_, key);
  if (ec) ec.clear();  // not loaded again: the caller loads the bytes
  return m;
}

void cpu_device::add_stream(cpu_stream* s) {
  std::lock_guard lock(streams_mutex_);
  streams_.insert(s);
}

void cpu_device::remove_stream(cpu_stream* s) {
  std::lock_guard lock(streams_mutex_);
  streams_.erase(s);
}

void cpu_device::declare_lost() noexcept {
  lost_.store(true, std::memory_order_release);
  std::lock_guard lock(streams_mutex_);
  for (cpu_stream* s : streams_) s->abort_running();
}

bool cpu_device::on_own_thread() const noexcept { return own_device == this; }

void cpu_device::shutdown() noexcept {
  stopped_.store(true, std::memory_order_release);
  {
    std::lock_guard lock(streams_mutex_);
    for (cpu_stream* s : streams_) s->abort_running();
  }
  // Work still queued never runs: every op completes anyway, with runtime_shut_down, so that a
  // wait on it ends (pieces of running ops count down; the ops behind them follow in finish).
  std::vector<op*> left;
  pool_.stop(left);
  for (op* o : left) {
    mark_shut_down(o);
    if (o->pieces.fetch_sub(1, std::memory_order_acq_rel) == 1) finish(o);
  }
  // Value waits end too: their condition may never hold.
  std::vector<op*> waits;
  {
    std::lock_guard lock(value_mutex_);
    value_stop_ = true;
    waits.swap(value_waits_);
  }
  value_cv_.notify_all();
  for (op* o : waits) abandon(o);
  if (value_thread_.joinable() && value_thread_.get_id() != std::this_thread::get_id())
    value_thread_.join();
}

void cpu_device::watch_value(op* o) {
  if (o->status.load(std::memory_order_acquire) == status_aborted) {  // its stream was aborted
    finish(o);
    return;
  }
  {
    std::lock_guard lock(value_mutex_);
    if (!value_stop_) {
      try {
        if (!value_thread_.joinable()) value_thread_ = std::thread([this] {
          own_device = this;
          watch_values();
        });
        value_waits_.push_back(o);
        o = nullptr;
      } catch (const std::exception& e) {
        o->status.store(CORA_CPU_EXCEPTION, std::memory_order_release);
        o->message = std::string("cannot watch the value: ") + e.what();
      }
    } else {
      mark_shut_down(o);
    }
  }
  if (o) {
    finish(o);
    return;
  }
  value_cv_.notify_one();
}

bool cpu_device::cancel_value_wait(op* o) noexcept {
  {
    std::lock_guard lock(value_mutex_);
    auto it = std::find(value_waits_.begin(), value_waits_.end(), o);
    if (it == value_waits_.end()) return false;  // done already, or being finished
    value_waits_.erase(it);
  }
  mark_aborted(o);
  finish(o);
  return true;
}

void cpu_device::watch_values() noexcept {
  // Polled, as a GPU's front end polls the word: the pause doubles from 1 us up to 500 us while
  // nothing changes, and starts again at 1 us when a wait ends or a new one comes.
  constexpr auto first_pause = std::chrono::microseconds(1);
  constexpr auto longest_pause = std::chrono::microseconds(500);
  auto pause = first_pause;
  std::vector<op*> done;
  std::unique_lock lock(value_mutex_);
  while (!value_stop_) {
    const bool gone = lost();
    std::size_t kept = 0;
    for (op* o : value_waits_) {
      if (gone || value_met(o) || o->status.load(std::memory_order_acquire) == status_aborted)
        done.push_back(o);  // on a lost device, finished() fails it
      else
        value_waits_[kept++] = o;
    }
    value_waits_.resize(kept);
    if (!done.empty()) {
      lock.unlock();
      for (op* o : done) finish(o);
      done.clear();
      lock.lock();
      pause = first_pause;
      continue;
    }
    if (value_waits_.empty()) {
      value_cv_.wait(lock, [&] { return value_stop_ || !value_waits_.empty(); });
      pause = first_pause;
      continue;
    }
    const std::size_t before = value_waits_.size();
    value_cv_.wait_for(lock, pause);
    if (value_waits_.size() != before)
      pause = first_pause;
    else
      pause = std::min<std::chrono::microseconds>(pause * 2, longest_pause);
  }
}

void cpu_device::abandon(op* o) noexcept {
  mark_shut_down(o);
  finish(o);
}

bool cpu_device::skip_halted(op* o) noexcept {
  int status = 0;
  std::uint64_t failed = 0;
  // A graph's child ops belong to their graph launch, which was started (or skipped) whole.
  if (o->status.load(std::memory_order_acquire) == status_aborted) return true;
  if (o->parent || !o->stream || !o->stream->halted(status, failed)) return false;
  int expected = CORA_CPU_OK;
  if (o->status.compare_exchange_strong(expected, status, std::memory_order_acq_rel)) {
    try {
      o->message = "not run: op " + std::to_string(failed) +
                   " of the stream failed first and the stream stops on failure";
    } catch (...) {
    }
  }
  return true;
}

void cpu_device::start(op* o) {
  if (stopped()) {
    abandon(o);
    return;
  }
  if (skip_halted(o)) {
    finish(o);
    return;
  }
  switch (o->k) {
    case op::kind::wait:
      if (!o->wait_stream || o->wait_stream == o->stream ||
          !o->wait_stream->add_dependent(o->wait_seq, o))
        finish(o);
      return;
    case op::kind::copy:
    case op::kind::fill: {
      const std::size_t pieces =
          std::clamp<std::size_t>(o->bytes / copy_piece, 1, pool_.size());
      o->chunk = (o->bytes + pieces - 1) / pieces;
      if (!pool_.submit(o, static_cast<unsigned>(pieces))) abandon(o);
      return;
    }
    case op::kind::launch: {
      // A static contiguous schedule: slice i holds blocks [grid * i / n, grid * (i + 1) / n),
      // taken by worker i when it is free (pieces carry no slice of their own).
      const std::uint32_t pieces = std::min<std::uint32_t>(o->grid, pool_.size());
      o->slices = pieces;
      if (o->claimed_capacity < pieces) {
        o->claimed.reset(new std::atomic<std::uint8_t>[pieces]());
        o->claimed_capacity = pieces;
      } else {
        for (std::uint32_t i = 0; i < pieces; ++i) o->claimed[i].store(0, std::memory_order_relaxed);
      }
      // Blocks run in batches, so that an abort stops a slice between batches.
      o->batch = std::max<std::uint32_t>(1, o->grid / (pieces * 8));
      if (o->timeout_ns) o->launch.deadline_ns = now_ns() + o->timeout_ns;
      o->launch.abort_flag = &o->abort;
      if (!pool_.submit(o, pieces)) abandon(o);
      return;
    }
    case op::kind::host_func:
    case op::kind::record:
    case op::kind::value_write:
      if (!pool_.submit(o, 1)) abandon(o);
      return;
    case op::kind::value_wait:
      if (value_met(o))
        finish(o);
      else
        watch_value(o);
      return;
    case op::kind::graph:
      if (op* child = next_graph_op(o))
        start(child);
      else
        finish(o);
      return;
  }
}

void cpu_device::run_piece(op* o, unsigned worker) {
  execute(o, worker);
  if (o->pieces.fetch_sub(1, std::memory_order_acq_rel) == 1) finish(o);
}

void cpu_device::execute(op* o, unsigned worker) {
  if (lost()) return;  // finished() fails the op
  switch (o->k) {
    case op::kind::copy:
    case op::kind::fill: {
      if (o->fault == op::injected::copy_fault) {
        int expected = CORA_CPU_OK;
        if (o->status.compare_exchange_strong(expected, status_copy_fault,
                                              std::memory_order_acq_rel))
          o->message = "injected copy fault";
        return;
      }
      const std::size_t i = o->next.fetch_add(1, std::memory_order_relaxed);
      const std::size_t begin = std::min(o->bytes, i * o->chunk);
      const std::size_t end = std::min(o->bytes, begin + o->chunk);
      if (end <= begin) return;
      if (o->k == op::kind::copy)
        std::memmove(o->dst + begin, o->src + begin, end - begin);
      else
        std::memset(o->dst + begin, o->value, end - begin);
      return;
    }
    case op::kind::launch: {
      if (o->fault != op::injected::none) {
        run_injected(o);
        return;
      }
      // This worker's own slice if it is still free, else the next free one.
      const std::uint32_t n = o->slices;
      for (std::uint32_t k = 0; k < n; ++k) {
        const std::uint32_t slice = (worker + k) % n;
        if (o->claimed[slice].exchange(1, std::memory_order_relaxed) == 0) {
          run_slice(o, slice);
          return;
        }
      }
      return;
    }
    case op::kind::host_func:
      try {
        o->fn();
      } catch (const std::exception& e) {
        o->status.store(CORA_CPU_EXCEPTION, std::memory_order_release);
        o->message = std::string("host function threw: ") + e.what();
      } catch (...) {
        o->status.store(CORA_CPU_EXCEPTION, std::memory_order_release);
        o->message = "host function threw";
      }
      return;
    case op::kind::record:
      o->ev->stamp_ns.store(now_ns(), std::memory_order_release);
      return;
    case op::kind::value_write:
      if (o->bytes == 8)
        __atomic_store_n(reinterpret_cast<std::uint64_t*>(o->dst), o->compare, __ATOMIC_RELEASE);
      else
        __atomic_store_n(reinterpret_cast<std::uint32_t*>(o->dst),
                         static_cast<std::uint32_t>(o->compare), __ATOMIC_RELEASE);
      return;
    case op::kind::wait:
    case op::kind::graph:
    case op::kind::value_wait:
      return;
  }
}

void cpu_device::run_slice(op* o, std::uint32_t slice) {
  const void* args = o->device_args ? o->device_args : static_cast<const void*>(o->args.data());
  const std::uint64_t grid = o->grid;
  const auto end = static_cast<std::uint32_t>(grid * (slice + 1) / o->slices);
  char message[256];
  for (auto first = static_cast<std::uint32_t>(grid * slice / o->slices); first < end;) {
    if (aborted(o)) {
      // Stopped by the device (shutdown, loss), unless a block of its own failed first:
      // skipped blocks must not pass for a successful launch.
      int expected = CORA_CPU_OK;
      const bool shut = stopped() && !lost();
      if (o->status.compare_exchange_strong(expected, shut ? status_shut_down : CORA_CPU_ABORTED,
                                            std::memory_order_acq_rel))
        o->message = shut ? "launch stopped: the runtime was shut down"
                          : "launch aborted: device lost or shut down";
      return;
    }
    const std::uint32_t last = std::min(end, first + o->batch);
    message[0] = '\0';
    int status = o->entry(&o->launch, first, last, args, message, sizeof(message));
    // A kernel that saw the abort flag because the runtime is shutting down was stopped by the
    // shutdown, not by a lost device.
    if (status == CORA_CPU_ABORTED && stopped() && !lost()) {
      status = status_shut_down;
      std::snprintf(message, sizeof(message), "launch stopped: the runtime was shut down");
    }
    if (status != CORA_CPU_OK) {
      int expected = CORA_CPU_OK;
      if (o->status.compare_exchange_strong(expected, status, std::memory_order_acq_rel)) {
        o->message = message;
        if (o->message.empty()) o->message = "kernel failed";
      }
      set_abort(o);
      return;
    }
    first = last;
  }
}

void cpu_device::run_injected(op* o) {
  auto fail = [o](int status, const char* message) {
    int expected = CORA_CPU_OK;
    if (o->status.compare_exchange_strong(expected, status, std::memory_order_acq_rel))
      o->message = message;
  };
  if (o->fault == op::injected::trap) {
    fail(CORA_CPU_TRAP, "injected kernel trap");
    return;
  }
  // A stuck kernel: every piece holds its worker until the deadline or an abort.
  while (!aborted(o) && !lost() && !stopped()) {
    if (o->launch.deadline_ns && now_ns() >= o->launch.deadline_ns) {
      fail(CORA_CPU_TIMEOUT, "injected stuck kernel ran past its timeout");
      set_abort(o);
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  fail(CORA_CPU_ABORTED, "injected stuck kernel stopped: device lost or shut down");
}

void cpu_device::finish(op* first) {
  // Finishing an op may start the next op of its stream and release waits of other streams;
  // run those here in a loop rather than recursively.
  finish_lists local;
  finish_lists& lists = thread_finish_lists.busy ? local : thread_finish_lists;
  lists.busy = true;
  if (lists.todo.capacity() == 0) {  // room for the usual fan-out from the first use on
    lists.todo.reserve(16);
    lists.ready.reserve(16);
  }
  struct release {
    finish_lists& l;
    ~release() {
      l.todo.clear();
      l.busy = false;
    }
  } released{lists};
  std::vector<op*>& todo = lists.todo;
  std::vector<op*>& ready = lists.ready;
  todo.push_back(first);
  while (!todo.empty()) {
    op* o = todo.back();
    todo.pop_back();
    if (op* parent = o->parent) {
      // A node of a graph launch: its failure is the graph's; then the next node runs.
      int status = o->status.load(std::memory_order_acquire);
      if (status == CORA_CPU_OK && lost()) {
        status = CORA_CPU_ABORTED;
        o->message = "device lost";
      }
      int expected = CORA_CPU_OK;
      if (status != CORA_CPU_OK &&
          parent->status.compare_exchange_strong(expected, status, std::memory_order_acq_rel))
        parent->message = std::move(o->message);
      ops_.give(o);
      if (op* child = next_graph_op(parent))
        start(child);
      else
        todo.push_back(parent);
      continue;
    }
    ready.clear();
    o->stream->finished(o, ready);
    ops_.give(o);
    for (op* r : ready) {
      if (stopped()) {  // shut down: what was waiting behind this op never runs
        mark_shut_down(r);
        todo.push_back(r);
      } else if (skip_halted(r)) {  // its stream failed and stops on failure
        todo.push_back(r);
      } else if (r->k == op::kind::wait &&
          (!r->wait_stream || r->wait_stream == r->stream ||
           !r->wait_stream->add_dependent(r->wait_seq, r)))
        todo.push_back(r);
      else if (r->k != op::kind::wait)
        start(r);
    }
  }
}

// ---------------------------------------------------------------------------------------------

}  // namespace cora::backend::cpu

namespace cora::backend {

std::vector<std::unique_ptr<device>> make_cpu_devices(const cpu_options& options) {
  unsigned units = options.compute_units;
  if (units == 0) units = std::max(1u, std::thread::hardware_concurrency());
  std::size_t memory = options.memory;
  if (memory == 0) {
    const auto pages = static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES));
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    memory = std::min<std::size_t>(pages * page, std::size_t{64} << 30);
  }
  std::vector<std::unique_ptr<device>> out;
  for (unsigned i = 0; i < std::max(1u, options.devices); ++i)
    out.push_back(std::make_unique<cpu::cpu_device>(i, units, memory));
  return out;
}

}  // namespace cora::backend
