#include "backend/cuda/cuda_stream.hpp"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_device.hpp"
#include "backend/cuda/cuda_module.hpp"
#include "cora/detail/arg_layout.hpp"

namespace cora::backend::cuda {

namespace {

// wait_marker spins this long before sleeping, then sleeps in steps growing to sleep_max:
// a blocked waiter learns of completion within ~sleep_max at a small CPU cost.
constexpr auto spin_first = std::chrono::microseconds(20);
constexpr auto sleep_min = std::chrono::microseconds(20);
constexpr auto sleep_max = std::chrono::microseconds(200);
// Sleepers woken by callbacks still look at the stream this often (faults wake nobody).
constexpr auto woken_sleep_max = std::chrono::milliseconds(1);

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

std::string dims(const dim3& d) {
  return std::to_string(d.x) + "x" + std::to_string(d.y) + "x" + std::to_string(d.z);
}

// A host function enqueued with cuLaunchHostFunc; runs on the driver's callback thread.
struct host_call {
  std::function<void()> fn;
  std::shared_ptr<stream_faults> faults;
  std::uint64_t seq;
};

thread_local bool host_call_running = false;

void CUDA_CB run_host_call(void* data) {
  struct running {
    running() noexcept { host_call_running = true; }
    ~running() { host_call_running = false; }
  } scope;  // outlives `call`: its function's captures are dropped inside the scope
  std::unique_ptr<host_call> call(static_cast<host_call*>(data));
  try {
    call->fn();
  } catch (const std::exception& e) {
    call->faults->record(call->seq, make_error_code(errc::kernel_fault),
                         std::string("host function threw: ") + e.what());
  } catch (...) {
    call->faults->record(call->seq, make_error_code(errc::kernel_fault), "host function threw");
  }
}

}  // namespace

bool in_host_call() noexcept { return host_call_running; }

void stream_faults::record(std::uint64_t seq, std::error_code ec, std::string message) noexcept {
  std::lock_guard lock(mutex);
  if (first.load(std::memory_order_relaxed) <= seq) return;  // an earlier failure stands
  recorded.seq = seq;
  recorded.ec = ec;
  recorded.message = std::move(message);
  first.store(seq, std::memory_order_release);
}

cuda_stream::cuda_stream(cuda_device& device, CUstream handle, std::unique_ptr<marker_source> markers,
                         bool owned)
    : device_(device),
      ctx_(device.ctx()),
      stream_(handle),
      owned_(owned),
      markers_(std::move(markers)),
      faults_(std::make_shared<stream_faults>()) {}

cuda_stream::~cuda_stream() {
  current_context cur(*ctx_);
  // Memory the device writes markers into is freed only once it cannot be written any more.
  // A detached stream may be gone already: its markers tell instead.
  const bool done = ctx_->lost() ||
                    (markers_->detached() ? markers_->reached_all() : ctx_->api.cuStreamQuery(stream_) == CUDA_SUCCESS);
  markers_->retire(done);
  markers_.reset();
  // Returns at once; the driver frees the stream when its work is done. An adopted stream
  // belongs to its library.
  if (owned_) ctx_->api.cuStreamDestroy(stream_);
}

bool cuda_stream::recycle() noexcept {
  if (!owned_ || ctx_->lost() || !markers_->reached_all() ||
      faults_->first.load(std::memory_order_acquire) != ~std::uint64_t{0})
    return false;
  {
    std::lock_guard lock(poll_error_mutex_);
    if (poll_error_ != CUDA_SUCCESS) return false;
  }
  markers_->reset();
  last_failed_.store(0, std::memory_order_relaxed);
  return true;
}

std::string cuda_stream::lost_detail() const {
  return ctx_->lost_message() + " (" + device_.label() +
         " is unusable after this fault: every later operation on it fails)";
}

bool cuda_stream::usable(std::uint64_t seq) {
  if (!ctx_->lost()) return true;
  faults_->record(seq, make_error_code(errc::device_lost),
                  device_.label() + " is unusable after an earlier fault: " + ctx_->lost_message());
  return false;
}

void cuda_stream::failed(std::uint64_t seq, CUresult r, const std::string& what) {
  const std::error_code ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
  faults_->record(seq, ec, what + ": " + describe(r));
}

void cuda_stream::copy(std::uint64_t seq, void* dst, const void* src, std::size_t bytes, bool) {
  if (!usable(seq)) return;
  // With unified addressing one call serves every direction. A pageable source is staged by
  // the driver (or copied synchronously) before the call returns, so it may be reused at once.
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                                   reinterpret_cast<CUdeviceptr>(src), bytes, stream_)
                         : cur.result;
  if (r != CUDA_SUCCESS) failed(seq, r, "cuMemcpyAsync of " + std::to_string(bytes) + " bytes");
}

void cuda_stream::fill(std::uint64_t seq, void* dst, std::uint8_t value, std::size_t bytes) {
  if (!usable(seq)) return;
  current_context cur(*ctx_);
  CUresult r = cur ? ctx_->api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(dst), value, bytes, stream_)
                   : cur.result;
  if (r == CUDA_ERROR_INVALID_VALUE) {
    // Host memory the device cannot address: fill it on the host, in stream order.
    auto* call = new host_call{[dst, value, bytes] { std::memset(dst, value, bytes); }, faults_, seq};
    r = ctx_->api.cuLaunchHostFunc(stream_, &run_host_call, call);
    if (r != CUDA_SUCCESS) delete call;
  }
  if (r != CUDA_SUCCESS) failed(seq, r, "cuMemsetD8Async of " + std::to_string(bytes) + " bytes");
}

void cuda_stream::launch(std::uint64_t, const launch_desc& l, std::error_code& ec,
                         std::string& message) {
  auto* fn = static_cast<cuda_function*>(l.function);
  const kernel_desc& k = *l.kernel;
  const launch_config& cfg = l.config;
  // Built only on the failure paths: a launch that succeeds makes no string.
  auto what = [&] { return "kernel '" + k.name + "'"; };
  auto reject = [&](errc e, std::string why) {
    ec = make_error_code(e);
    message = what() + ": " + std::move(why);
  };
  if (l.device_args)
    return reject(errc::not_supported,
                  "the CUDA backend takes launch arguments from host memory only; device-resident "
                  "argument blocks are not supported: pass the block from host memory instead");
  if (ctx_->lost())
    return reject(errc::device_lost,
                  device_.label() + " is unusable after an earlier fault: " + ctx_->lost_message());
  if (cfg.timeout.count() != 0)
    return reject(errc::not_supported,
                  "CUDA cannot stop a kernel after a timeout: launch_config::timeout must be 0");

  // Parameters: CUDA reads each from a pointer into the canonical block, so no repacking is
  // needed whatever CUDA's own layout is.
  const std::size_t n = k.params.size();
  if (n != fn->sizes.size())
    return reject(errc::argument_mismatch, "the device image has " + std::to_string(fn->sizes.size()) +
                                               " parameters, its metadata " + std::to_string(n));
  void* small[32];
  std::vector<void*> big;
  void** params = small;
  if (n > std::size(small)) {
    big.resize(n);
    params = big.data();
  }
  std::size_t end = 0;
  auto* block = static_cast<std::byte*>(const_cast<void*>(l.args));
  for (std::size_t i = 0; i < n; ++i) {
    if (k.params[i].size != fn->sizes[i])
      return reject(errc::argument_mismatch,
                    "parameter " + std::to_string(i) + " has " + std::to_string(fn->sizes[i]) +
                        " bytes in the device image but " + std::to_string(k.params[i].size) +
                        " in its metadata");
    const std::size_t offset = detail::next_param_offset(end, k.params[i].align);
    end = offset + k.params[i].size;
    params[i] = block + offset;
  }
  if (n && (!block || end > l.args_size))
    return reject(errc::argument_mismatch, "the argument block holds " + std::to_string(l.args_size) +
                                               " bytes; the parameters need " + std::to_string(end));

  CUlaunchAttribute attrs[3];
  unsigned count = 0;
  const launch_limits& limits = device_.limits();
  // A batch launch needs every block resident at once, which is what a cooperative launch is.
  if (cfg.cooperative || cfg.schedule == schedule_mode::batch) {
    if (!limits.cooperative)
      return reject(errc::not_supported, device_.label() + " cannot run cooperative launches");
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[count].value.cooperative = 1;
    ++count;
  }
  if (cfg.cluster) {
    const dim3& c = *cfg.cluster;
    if (!limits.clusters)
      return reject(errc::not_supported,
                    device_.label() + " has no thread-block clusters (compute capability 9.0 and up)");
    if (c.volume() == 0 || cfg.grid.x % c.x || cfg.grid.y % c.y || cfg.grid.z % c.z)
      return reject(errc::invalid_launch_config,
                    "cluster " + dims(c) + " does not divide grid " + dims(cfg.grid));
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[count].value.clusterDim.x = c.x;
    attrs[count].value.clusterDim.y = c.y;
    attrs[count].value.clusterDim.z = c.z;
    ++count;
  }
  if (cfg.priority) {
    const int p = *cfg.priority;
    if (p < ctx_->greatest_priority || p > ctx_->least_priority)
      return reject(errc::invalid_launch_config,
                    "priority " + std::to_string(p) + " is outside the device's range " +
                        std::to_string(ctx_->greatest_priority) + " (most urgent) to " +
                        std::to_string(ctx_->least_priority));
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attrs[count].value.priority = p;
    ++count;
  }

  current_context cur(*ctx_);
  if (!cur) {
    ec = ctx_->note(cur.result) ? make_error_code(errc::device_lost) : to_error_code(cur.result);
    message = what() + ": cannot make the context current: " + describe(cur.result);
    return;
  }
  // Beyond what the kernel allows so far (48 KiB by default), it must opt in first.
  std::uint32_t allowed = fn->dynamic_shared_limit.load(std::memory_order_relaxed);
  if (cfg.shared_bytes > allowed) {
    const std::uint64_t total = std::uint64_t{cfg.shared_bytes} + static_cast<std::uint64_t>(fn->static_shared);
    if (total > limits.max_shared_optin)
      return reject(errc::invalid_launch_config,
                    "a block needs " + std::to_string(total) + " bytes of shared memory (" +
                        std::to_string(fn->static_shared) + " static, " + std::to_string(cfg.shared_bytes) +
                        " dynamic); " + device_.label() + " allows " + std::to_string(limits.max_shared_optin));
    const CUresult r = ctx_->api.cuFuncSetAttribute(
        fn->handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(cfg.shared_bytes));
    if (r != CUDA_SUCCESS)
      return reject(errc::invalid_launch_config, "cannot allow " + std::to_string(cfg.shared_bytes) +
                                                     " bytes of dynamic shared memory: " + describe(r));
    while (allowed < cfg.shared_bytes &&
           !fn->dynamic_shared_limit.compare_exchange_weak(allowed, cfg.shared_bytes, std::memory_order_relaxed)) {
    }
  }

  CUlaunchConfig c{};
  c.gridDimX = cfg.grid.x;
  c.gridDimY = cfg.grid.y;
  c.gridDimZ = cfg.grid.z;
  c.blockDimX = cfg.block.x;
  c.blockDimY = cfg.block.y;
  c.blockDimZ = cfg.block.z;
  c.sharedMemBytes = cfg.shared_bytes;
  c.hStream = stream_;
  c.attrs = count ? attrs : nullptr;
  c.numAttrs = count;
  const CUresult r = ctx_->api.cuLaunchKernelEx(&c, fn->handle, n ? params : nullptr, nullptr);
  if (r == CUDA_SUCCESS) {
    ec.clear();
    return;
  }
  if (ctx_->note(r))
    ec = make_error_code(errc::device_lost);
  else if (r == CUDA_ERROR_INVALID_VALUE)
    ec = make_error_code(errc::invalid_launch_config);  // what the driver says of bad shapes
  else
    ec = to_error_code(r);
  message = "cannot launch " + what() + " (grid " + dims(cfg.grid) + ", block " + dims(cfg.block) +
            ", " + std::to_string(cfg.shared_bytes) + " bytes of dynamic shared memory): " + describe(r);
}

void cuda_stream::host_func(std::uint64_t seq, std::function<void()> fn, std::error_code& ec) {
  if (ctx_->lost()) {
    ec = make_error_code(errc::device_lost);
    return;
  }
  // Runs on the driver's callback thread, which must not call CUDA: a host function that
  // enqueues work on a CUDA stream fails.
  auto* call = new host_call{std::move(fn), faults_, seq};
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuLaunchHostFunc(stream_, &run_host_call, call) : cur.result;
  if (r != CUDA_SUCCESS) {
    delete call;
    ec = ctx_->note(r) ? make_error_code(errc::device_lost) : to_error_code(r);
    return;
  }
  ec.clear();
}

void cuda_stream::record(std::uint64_t seq, event& ev) {
  if (!usable(seq)) return;
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuEventRecord(static_cast<cuda_event&>(ev).handle, stream_) : cur.result;
  if (r != CUDA_SUCCESS) failed(seq, r, "cuEventRecord");
}

void cuda_stream::wait(std::uint64_t seq, event& ev) {
  if (!usable(seq)) return;
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuStreamWaitEvent(stream_, static_cast<cuda_event&>(ev).handle, 0)
                         : cur.result;
  if (r != CUDA_SUCCESS) failed(seq, r, "cuStreamWaitEvent");
}

// A memory operation the driver refused outright (an address it cannot reach, NOR on a device
// without it) fails the op at once; any other failure is the stream's fault.
static bool refused_memop(CUresult r) noexcept {
  return r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED;
}

static constexpr const char* use_pinned =
    "; on CUDA, put the word of a value wait in pinned host memory (device::alloc_host, aclrtMallocHost)";

// How the device reaches a value op's word.
enum class word_access {
  memop,      // through the driver's stream memory operations, at `out`
  copy_only,  // by copies only (pool or managed memory): ec and message say why
  refused,    // not at all: ec and message say why
};

// Classifies a value op's word. The driver documents its stream memory operations for memory
// from cuMemAlloc and for mapped or registered host memory; it refuses memory from a
// stream-ordered pool (cora's own pool, cuMemAllocAsync) with a bare CUDA_ERROR_INVALID_VALUE,
// and managed memory outright. Copies reach both.
static word_access value_address(const context& ctx, cuda_device& dev, const void* addr,
                                 value_memory where, CUdeviceptr& out, std::error_code& ec,
                                 std::string& message) {
  out = reinterpret_cast<CUdeviceptr>(addr);
  bool host = where == value_memory::pinned_host;
  if (where == value_memory::allocation && dev.pooled()) {
    ec = make_error_code(errc::invalid_pointer);
    message = std::string("the word lies in device memory from cora's stream-ordered pool, which "
                          "CUDA's stream memory operations (cuStreamWaitValue, cuStreamWriteValue) "
                          "do not accept") + use_pinned;
    return word_access::copy_only;
  }
  if (where == value_memory::foreign) {
    const foreign_memory f = dev.describe_pointer(addr);
    if (f.k == foreign_memory::kind::managed) {
      ec = make_error_code(errc::invalid_pointer);
      message = std::string("the word lies in managed memory, which CUDA's stream memory "
                            "operations do not accept") + use_pinned;
      return word_access::copy_only;
    }
    if (f.stream_ordered) {
      ec = make_error_code(errc::invalid_pointer);
      message = std::string("the word lies in device memory from a stream-ordered pool "
                            "(cuMemAllocAsync), which CUDA's stream memory operations do not "
                            "accept") + use_pinned;
      return word_access::copy_only;
    }
    host = f.k == foreign_memory::kind::host;
  }
  if (host) {
    // The driver's device address of mapped host memory; where the device uses host pointers
    // as they are, the host pointer serves too.
    CUdeviceptr d = 0;
    if (ctx.api.cuMemHostGetDevicePointer(&d, const_cast<void*>(addr), 0) == CUDA_SUCCESS) {
      out = d;
    } else if (!dev.memops().host_pointer) {
      ec = make_error_code(errc::invalid_pointer);
      message = "the word lies in host memory that is not mapped into the device's address space "
                "(cuMemHostGetDevicePointer refused it)";
      return word_access::refused;
    }
  }
  return word_access::memop;
}

// Refuses, up front, what the device's stream memory operations lack (device attributes).
static bool value_op_supported(const cuda_device& dev, bool wide, unsigned condition,
                               std::error_code& ec, std::string& message) {
  if (wide && !dev.memops().wide) {
    ec = make_error_code(errc::not_supported);
    message = dev.label() + " has no 64-bit stream memory operations "
              "(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0)";
    return false;
  }
  if (condition == CU_STREAM_WAIT_VALUE_NOR && !dev.memops().nor) {
    ec = make_error_code(errc::not_supported);
    message = dev.label() + " cannot wait for a NOR condition "
              "(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR is 0)";
    return false;
  }
  return true;
}

void cuda_stream::wait_value(std::uint64_t seq, const void* addr, value_memory where,
                             std::uint64_t value, unsigned condition, bool wide,
                             std::error_code& ec, std::string& message) {
  ec.clear();
  if (!usable(seq)) return;
  current_context cur(*ctx_);
  CUresult r = cur.result;
  if (cur) {
    CUdeviceptr ptr = 0;
    // Only the driver's stream memory operations wait on the device: no fallback.
    if (value_address(*ctx_, device_, addr, where, ptr, ec, message) != word_access::memop) return;
    if (!value_op_supported(device_, wide, condition, ec, message)) return;
    // CU_STREAM_WAIT_VALUE_GEQ/EQ/AND/NOR have the values of cora's conditions.
    r = wide ? ctx_->api.cuStreamWaitValue64(stream_, ptr, value, condition)
             : ctx_->api.cuStreamWaitValue32(stream_, ptr, static_cast<cuuint32_t>(value), condition);
  }
  if (r == CUDA_SUCCESS) return;
  const std::string what = wide ? "cuStreamWaitValue64" : "cuStreamWaitValue32";
  if (refused_memop(r)) {
    ec = to_error_code(r);
    message = what + ": " + describe(r);
    if (r == CUDA_ERROR_INVALID_VALUE) message += use_pinned;
    return;
  }
  failed(seq, r, what);
}

void cuda_stream::write_value(std::uint64_t seq, void* addr, value_memory where, std::uint64_t value,
                              bool wide, std::error_code& ec, std::string& message) {
  ec.clear();
  if (!usable(seq)) return;
  current_context cur(*ctx_);
  CUresult r = cur.result;
  if (cur) {
    CUdeviceptr ptr = 0;
    switch (value_address(*ctx_, device_, addr, where, ptr, ec, message)) {
      case word_access::refused: return;
      case word_access::copy_only: {
        // Memory the stream memory operations refuse (pool, managed) still takes the store as
        // a stream-ordered copy of the naturally aligned word (what aclrtValueWrite was before
        // it had the driver's writes); no value wait of CUDA can watch such a word anyway.
        ec.clear();
        message.clear();
        const auto narrow = static_cast<std::uint32_t>(value);
        copy(seq, addr, wide ? static_cast<const void*>(&value) : static_cast<const void*>(&narrow),
             wide ? 8 : 4, true);
        return;
      }
      case word_access::memop: break;
    }
    if (!value_op_supported(device_, wide, CU_STREAM_WAIT_VALUE_GEQ, ec, message)) return;
    r = wide ? ctx_->api.cuStreamWriteValue64(stream_, ptr, value, CU_STREAM_WRITE_VALUE_DEFAULT)
             : ctx_->api.cuStreamWriteValue32(stream_, ptr, static_cast<cuuint32_t>(value),
                                              CU_STREAM_WRITE_VALUE_DEFAULT);
  }
  if (r == CUDA_SUCCESS) return;
  const std::string what = wide ? "cuStreamWriteValue64" : "cuStreamWriteValue32";
  if (refused_memop(r)) {
    ec = to_error_code(r);
    message = what + ": " + describe(r);
    if (r == CUDA_ERROR_INVALID_VALUE) message += use_pinned;
    return;
  }
  failed(seq, r, what);
}

marker cuda_stream::record_marker(std::uint64_t seq) {
  device_.count_marker();
  marker m{seq, nullptr};
  if (ctx_->lost()) return m;  // query() reports it failed
  current_context cur(*ctx_);
  const CUresult r = cur ? markers_->record(seq, m) : cur.result;
  if (r != CUDA_SUCCESS)
    failed(seq, r, "cannot record a completion marker");
  else if (markers_->is_event(m))
    device_.count_event_marker();
  return m;
}

marker_state cuda_stream::query(const marker& m) {
  if (faults_->first.load(std::memory_order_acquire) <= m.seq || ctx_->lost()) {
    last_failed_.store(m.seq, std::memory_order_relaxed);
    return marker_state::failed;
  }
  const CUresult r = markers_->poll(m);
  if (r == CUDA_SUCCESS) {
    // A host function before the marker may have failed while it was being polled.
    if (faults_->first.load(std::memory_order_acquire) <= m.seq) {
      last_failed_.store(m.seq, std::memory_order_relaxed);
      return marker_state::failed;
    }
    return marker_state::done;
  }
  if (r == CUDA_ERROR_NOT_READY) return marker_state::pending;
  if (!ctx_->note(r)) {
    std::lock_guard lock(poll_error_mutex_);
    if (poll_error_ == CUDA_SUCCESS) poll_error_ = r;
  }
  last_failed_.store(m.seq, std::memory_order_relaxed);
  return marker_state::failed;
}

bool cuda_stream::wait_marker(const marker& m, clock::time_point deadline) {
  // Never blocks in the driver (cuEventSynchronize cannot give up at a deadline): spins
  // briefly, then sleeps in short steps, or until a callback marker wakes it.
  const auto start = clock::now();
  auto step = std::chrono::duration_cast<clock::duration>(sleep_min);
  for (;;) {
    if (query(m) != marker_state::pending) return true;
    const auto now = clock::now();
    if (now >= deadline) return false;
    if (now - start < spin_first) {
      for (int i = 0; i < 32; ++i) cpu_relax();
      continue;
    }
    if (markers_->wakes_sleepers()) {
      markers_->block(m, std::min(deadline, now + woken_sleep_max));
    } else {
      markers_->block(m, std::min(deadline, now + step));
      step = std::min<clock::duration>(step * 2, sleep_max);
    }
  }
}

void cuda_stream::release_marker(const marker& m) noexcept { markers_->release(m); }

fault cuda_stream::take_fault() {
  const std::uint64_t at = last_failed_.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(faults_->mutex);
    if (faults_->first.load(std::memory_order_relaxed) <= at) {
      fault f = std::move(faults_->recorded);
      faults_->recorded = {};
      faults_->first.store(~std::uint64_t{0}, std::memory_order_release);
      return f;
    }
  }
  // A lost context cannot go on: every later marker fails with the same fault.
  if (ctx_->lost()) return {0, ctx_->lost_code(), lost_detail()};
  std::lock_guard lock(poll_error_mutex_);
  const CUresult r = poll_error_;
  poll_error_ = CUDA_SUCCESS;
  if (r != CUDA_SUCCESS) return {0, to_error_code(r), "the stream failed: " + describe(r)};
  return {0, make_error_code(errc::driver_error), "the stream failed for an unknown reason"};
}

}  // namespace cora::backend::cuda
