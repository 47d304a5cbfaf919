#include "backend/cuda/cuda_markers.hpp"

#include <algorithm>
#include <mutex>
#include <thread>

namespace cora::backend::cuda {

namespace {

// How often a pending counter or callback marker also asks the stream for a fault.
constexpr auto health_interval = std::chrono::milliseconds(1);

// Asks the stream about faults now and then: CUDA_ERROR_NOT_READY while it is busy,
// CUDA_SUCCESS once it is idle (every write and callback has happened), else its error.
class health_check {
 public:
  CUresult due(const context& ctx, CUstream stream, bool detached) noexcept {
    if (detached) return CUDA_ERROR_NOT_READY;  // the stream may be gone: its memory tells
    const auto now = clock::now().time_since_epoch().count();
    auto last = last_.load(std::memory_order_relaxed);
    if (now - last < std::chrono::duration_cast<clock::duration>(health_interval).count())
      return CUDA_ERROR_NOT_READY;
    if (!last_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return CUDA_ERROR_NOT_READY;
    current_context cur(ctx);
    return ctx.api.cuStreamQuery(stream);
  }

 private:
  std::atomic<clock::rep> last_{clock::now().time_since_epoch().count()};
};

// --- event markers ---------------------------------------------------------------------------

class event_markers final : public marker_source {
 public:
  event_markers(std::shared_ptr<context> ctx, CUstream stream) : ctx_(std::move(ctx)), stream_(stream) {}
  ~event_markers() override {
    current_context cur(*ctx_);
    for (CUevent e : all_) ctx_->api.cuEventDestroy(e);
  }

  CUresult record(std::uint64_t, marker& out) override {
    CUevent e = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      }
    }
    if (!e) {
      const CUresult r = ctx_->api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
      if (r != CUDA_SUCCESS) return r;
      std::lock_guard lock(mutex_);
      try {
        all_.push_back(e);
      } catch (...) {
        ctx_->api.cuEventDestroy(e);
        throw;
      }
    }
    out.handle = e;
    return ctx_->api.cuEventRecord(e, stream_);
  }

  bool is_event(const marker& m) const noexcept override { return m.handle != nullptr; }

  CUresult poll(const marker& m) override {
    if (!m.handle) return CUDA_ERROR_INVALID_HANDLE;
    current_context cur(*ctx_);
    return cur ? ctx_->api.cuEventQuery(static_cast<CUevent>(m.handle)) : cur.result;
  }

  void release(const marker& m) noexcept override {
    if (!m.handle) return;
    std::lock_guard lock(mutex_);
    // all_ has room for every event: free_ never holds more than all_.
    try {
      free_.push_back(static_cast<CUevent>(m.handle));
    } catch (...) {
    }
  }

  void retire(bool) noexcept override {}

  bool reached_all() const noexcept override {
    // Events are freed with the source whatever their state; the driver keeps a pending
    // record alive past cuEventDestroy.
    return true;
  }

  void reset() noexcept override {}

 private:
  std::shared_ptr<context> ctx_;
  CUstream stream_;
  // record() runs under the core's submission lock, release() under its completion lock.
  std::mutex mutex_;
  std::vector<CUevent> free_;
  std::vector<CUevent> all_;  // destroyed with the source: a sleeper may still query a released one
};

// --- counter markers -------------------------------------------------------------------------

}  // namespace

/// Counter slots (one cache line each) carved from mapped pinned slabs of 64 KiB, so that a new
/// stream needs no cuMemHostAlloc of its own (which waits for the device) once a slab has room.
/// The context owns the pool and frees the slabs when it goes: a slot may be written by the
/// device until its stream has drained, and every stream holds the context.
class marker_slot_pool {
 public:
  static constexpr std::size_t slot_bytes = 64;
  static constexpr std::size_t slab_bytes = 64 * 1024;

  struct slot {
    std::uint32_t* host = nullptr;
    CUdeviceptr device = 0;
  };

  explicit marker_slot_pool(const context& ctx) noexcept : ctx_(ctx) {}
  marker_slot_pool(const marker_slot_pool&) = delete;
  marker_slot_pool& operator=(const marker_slot_pool&) = delete;
  ~marker_slot_pool() {
    current_context cur(ctx_);
    for (void* p : slabs_) ctx_.api.cuMemFreeHost(p);
  }

  static marker_slot_pool& of(context& ctx) {
    std::lock_guard lock(ctx.marker_slots_mutex);
    if (!ctx.marker_slots)
      ctx.marker_slots = {new marker_slot_pool(ctx), [](marker_slot_pool* p) noexcept { delete p; }};
    return *ctx.marker_slots;
  }

  CUresult take(slot& out) {
    std::lock_guard lock(mutex_);
    if (free_.empty()) {
      slabs_.reserve(slabs_.size() + 1);
      free_.reserve(free_.size() + slab_bytes / slot_bytes);
      void* p = nullptr;
      CUresult r = ctx_.api.cuMemHostAlloc(&p, slab_bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
      if (r != CUDA_SUCCESS) return r;
      CUdeviceptr d = 0;
      r = ctx_.api.cuMemHostGetDevicePointer(&d, p, 0);
      if (r != CUDA_SUCCESS) {
        ctx_.api.cuMemFreeHost(p);
        return r;
      }
      slabs_.push_back(p);
      for (std::size_t off = 0; off < slab_bytes; off += slot_bytes)
        free_.push_back({reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(p) + off), d + off});
    }
    out = free_.back();
    free_.pop_back();
    __atomic_store_n(out.host, 0u, __ATOMIC_RELEASE);  // a new stream's positions start at 1
    return CUDA_SUCCESS;
  }

  void give_back(const slot& s) noexcept {
    std::lock_guard lock(mutex_);
    try {
      free_.push_back(s);
    } catch (...) {
    }
  }

 private:
  const context& ctx_;
  std::mutex mutex_;
  std::vector<slot> free_;
  std::vector<void*> slabs_;
};

namespace {

class counter_markers final : public marker_source {
 public:
  counter_markers(std::shared_ptr<context> ctx, CUstream stream) : ctx_(std::move(ctx)), stream_(stream) {}

  CUresult init() {
    marker_slot_pool::slot s;
    const CUresult r = marker_slot_pool::of(*ctx_).take(s);
    if (r != CUDA_SUCCESS) return r;
    slot_ = s.host;
    device_slot_ = s.device;
    return CUDA_SUCCESS;
  }

  ~counter_markers() override {
    // A slot the device may still write is never reused.
    if (slot_ && free_slot_) marker_slot_pool::of(*ctx_).give_back({slot_, device_slot_});
  }

  CUresult record(std::uint64_t seq, marker& out) override {
    out.handle = nullptr;
    last_.store(seq, std::memory_order_relaxed);
    // The default flags order the write after every earlier op of the stream, with a
    // system-wide memory fence, so data those ops wrote is visible once the value is.
    const CUresult r = ctx_->api.cuStreamWriteValue32(stream_, device_slot_, static_cast<cuuint32_t>(seq),
                                                      CU_STREAM_WRITE_VALUE_DEFAULT);
    out.rings = r == CUDA_SUCCESS;  // a write that was never enqueued rings nothing
    return r;
  }

  CUresult poll(const marker& m) override {
    if (reached(m.seq)) return CUDA_SUCCESS;
    return health_.due(*ctx_, stream_, detached());  // success means idle: the write has happened
  }

  // The slot is the doorbell. A fault keeps the device from writing it: the core polls at
  // least twice per health interval, so poll() asks the stream about once per interval (its
  // timer and the core's are not in step).
  doorbell bell() const noexcept override {
    return {slot_, std::chrono::duration_cast<std::chrono::microseconds>(health_interval) / 2};
  }

  void release(const marker&) noexcept override {}

  void retire(bool device_done) noexcept override { free_slot_ = device_done; }

  bool reached_all() const noexcept override {
    const std::uint64_t last = last_.load(std::memory_order_relaxed);
    return last == 0 || reached(last);
  }

  void reset() noexcept override {
    __atomic_store_n(slot_, 0u, __ATOMIC_RELEASE);  // the device wrote its last value
    last_.store(0, std::memory_order_relaxed);
  }

 private:
  bool reached(std::uint64_t seq) const noexcept {
    // 32-bit sequence numbers, compared modulo 2^32: fine while fewer than 2^31 ops are pending.
    const std::uint32_t v = __atomic_load_n(slot_, __ATOMIC_ACQUIRE);
    return static_cast<std::int32_t>(v - static_cast<std::uint32_t>(seq)) >= 0;
  }

  std::shared_ptr<context> ctx_;
  CUstream stream_;
  std::uint32_t* slot_ = nullptr;
  CUdeviceptr device_slot_ = 0;
  std::atomic<std::uint64_t> last_{0};  // the last sequence number recorded
  bool free_slot_ = true;
  health_check health_;
};

// --- auto: counters while one thread records, events while several do ----------------------

// Windows of 2^20 ns (about a millisecond) of the steady clock.
std::uint64_t marker_window_now() noexcept {
  return static_cast<std::uint64_t>(clock::now().time_since_epoch().count()) >> 20;
}

// Counts the calling thread once per window on `ctx` and returns the larger of the counts of
// threads that recorded markers on it in the current and in the previous window. A thread
// remembers the window it was last counted in per device ordinal (16 slots, so a thread that
// drives up to 16 devices in turn is still one thread), and the common call is a clock read and
// a few loads.
unsigned recent_marker_threads(context& ctx) noexcept {
  struct seen {
    const context* ctx = nullptr;
    std::uint64_t window = 0;
  };
  thread_local seen recent[16];
  const std::uint64_t w = marker_window_now();  // < 2^44 for centuries of uptime: w << 16 fits
  seen* mine = &recent[static_cast<unsigned>(ctx.ordinal) % 16];
  if (mine->ctx != &ctx) *mine = {&ctx, ~std::uint64_t{0}};
  std::uint64_t cur = ctx.marker_window.load(std::memory_order_relaxed);
  if (mine->window != w) {
    mine->window = w;
    for (;;) {
      const bool same = (cur >> 16) == w;
      const std::uint64_t count = cur & 0xffff;
      const std::uint64_t next = same ? cur + (count < 0xffff ? 1 : 0) : ((w << 16) | 1);
      if (ctx.marker_window.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
        if (!same)  // the window this thread opened follows the one it closed, or a gap
          ctx.marker_threads_before.store((cur >> 16) + 1 == w ? static_cast<std::uint32_t>(count) : 0,
                                          std::memory_order_relaxed);
        cur = next;
        break;
      }
    }
  }
  const unsigned now = (cur >> 16) == w ? static_cast<unsigned>(cur & 0xffff) : 0;
  return std::max(now, static_cast<unsigned>(ctx.marker_threads_before.load(std::memory_order_relaxed)));
}

// Two or more threads: what the pipelines measured (cuda_markers.hpp).
constexpr unsigned event_marker_threads = 2;

class auto_markers final : public marker_source {
 public:
  auto_markers(std::shared_ptr<context> ctx, CUstream stream)
      : ctx_(ctx), counters_(ctx, stream), events_(std::move(ctx), stream) {}

  CUresult init() { return counters_.init(); }

  // An event marker has a handle, a counter marker none.
  CUresult record(std::uint64_t seq, marker& out) override {
    if (recent_marker_threads(*ctx_) >= event_marker_threads) return events_.record(seq, out);
    return counters_.record(seq, out);
  }

  bool is_event(const marker& m) const noexcept override { return m.handle != nullptr; }

  CUresult poll(const marker& m) override { return m.handle ? events_.poll(m) : counters_.poll(m); }

  // Counter markers ring it; event markers do not (the core queries those).
  doorbell bell() const noexcept override { return counters_.bell(); }

  void release(const marker& m) noexcept override {
    if (m.handle) events_.release(m);
  }

  void retire(bool device_done) noexcept override { counters_.retire(device_done); }

  void detach() noexcept override {
    marker_source::detach();
    counters_.detach();
    events_.detach();
  }

  // Events never hold a stream back (event_markers::reached_all).
  bool reached_all() const noexcept override { return counters_.reached_all(); }

  void reset() noexcept override { counters_.reset(); }

 private:
  std::shared_ptr<context> ctx_;
  counter_markers counters_;
  event_markers events_;
};

// --- callback markers ------------------------------------------------------------------------

// What the driver's callback thread touches; outlives the source if callbacks may still come.
struct callback_cell {
  std::atomic<std::uint64_t> done{0};
  std::shared_ptr<context> ctx;
};

void CUDA_CB on_callback(void* data) {
  auto* cell = static_cast<callback_cell*>(data);
  cell->done.fetch_add(1, std::memory_order_acq_rel);
  {
    std::lock_guard lock(cell->ctx->signal_mutex);
    ++cell->ctx->signal_generation;
  }
  cell->ctx->signal_cv.notify_all();
}

class callback_markers final : public marker_source {
 public:
  callback_markers(std::shared_ptr<context> ctx, CUstream stream)
      : ctx_(std::move(ctx)), stream_(stream), cell_(new callback_cell) {
    cell_->ctx = ctx_;
  }
  ~callback_markers() override {
    if (free_cell_) delete cell_;
  }

  CUresult record(std::uint64_t, marker& out) override {
    // The handle is the marker's rank among this stream's callbacks, which run in order.
    const CUresult r = ctx_->api.cuLaunchHostFunc(stream_, &on_callback, cell_);
    std::uint64_t issued = issued_.load(std::memory_order_relaxed);
    if (r == CUDA_SUCCESS) issued_.store(++issued, std::memory_order_relaxed);
    out.handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(issued));
    return r;
  }

  CUresult poll(const marker& m) override {
    if (reached(m)) return CUDA_SUCCESS;
    return health_.due(*ctx_, stream_, detached());  // success means idle: the callback has run
  }

  bool wakes_sleepers() const noexcept override { return true; }

  void block(const marker& m, clock::time_point until) override {
    std::unique_lock lock(ctx_->signal_mutex);
    const std::uint64_t generation = ctx_->signal_generation;
    if (reached(m)) return;
    // Any callback of the device ends the sleep, so that a sleeper serves all its streams.
    ctx_->signal_cv.wait_until(lock, until, [&] { return ctx_->signal_generation != generation; });
  }

  void release(const marker&) noexcept override {}

  void retire(bool device_done) noexcept override { free_cell_ = device_done; }

  bool reached_all() const noexcept override {
    return cell_->done.load(std::memory_order_acquire) >= issued_.load(std::memory_order_relaxed);
  }

  void reset() noexcept override {
    cell_->done.store(0, std::memory_order_release);  // every callback has run
    issued_.store(0, std::memory_order_relaxed);
  }

 private:
  bool reached(const marker& m) const noexcept {
    return cell_->done.load(std::memory_order_acquire) >= reinterpret_cast<std::uintptr_t>(m.handle);
  }

  std::shared_ptr<context> ctx_;
  CUstream stream_;
  callback_cell* cell_;
  std::atomic<std::uint64_t> issued_{0};  // written by record() only
  bool free_cell_ = true;
  health_check health_;
};

}  // namespace

const char* to_string(marker_mode mode) noexcept {
  switch (mode) {
    case marker_mode::automatic: return "auto";
    case marker_mode::event: return "event";
    case marker_mode::counter: return "counter";
    case marker_mode::callback: return "callback";
  }
  return "?";
}

void marker_source::block(const marker&, clock::time_point until) {
  std::this_thread::sleep_until(until);
}

std::unique_ptr<marker_source> make_marker_source(marker_mode mode, std::shared_ptr<context> ctx,
                                                  CUstream stream, CUresult& r) {
  r = CUDA_SUCCESS;
  switch (mode) {
    case marker_mode::event: return std::make_unique<event_markers>(std::move(ctx), stream);
    case marker_mode::counter: {
      auto m = std::make_unique<counter_markers>(std::move(ctx), stream);
      r = m->init();
      if (r != CUDA_SUCCESS) return nullptr;
      return m;
    }
    case marker_mode::automatic: {
      auto m = std::make_unique<auto_markers>(std::move(ctx), stream);
      r = m->init();
      if (r != CUDA_SUCCESS) return nullptr;
      return m;
    }
    case marker_mode::callback: return std::make_unique<callback_markers>(std::move(ctx), stream);
  }
  return nullptr;
}

}  // namespace cora::backend::cuda
