#include "backend/cuda/cuda_device.hpp"

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "backend/cuda/cuda_module.hpp"
#include "backend/cuda/cuda_stream.hpp"

namespace cora::backend::cuda {

namespace {

std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// The kernel module's version ("580.95.05"), which the driver API does not report.
std::string kernel_module_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!f || !std::getline(f, line)) return {};
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Release Build ..."
  std::size_t i = 0;
  while (i < line.size()) {
    const std::size_t start = line.find_first_of("0123456789", i);
    if (start == std::string::npos) break;
    std::size_t end = line.find_first_not_of("0123456789.", start);
    if (end == std::string::npos) end = line.size();
    const std::string token = line.substr(start, end - start);
    if (token.find('.') != std::string::npos && (start == 0 || line[start - 1] == ' ')) return token;
    i = end;
  }
  return {};
}

std::string uuid_string(const CUuuid& u) {
  char out[64];
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

int attribute(const driver_api& api, CUdevice dev, CUdevice_attribute a) {
  int v = 0;
  if (api.cuDeviceGetAttribute(&v, a, dev) != CUDA_SUCCESS) return 0;
  return v;
}

std::uint32_t to_u32(int v) { return v > 0 ? static_cast<std::uint32_t>(v) : 0u; }

}  // namespace

cuda_event::~cuda_event() {
  current_context cur(*ctx);
  ctx->api.cuEventDestroy(handle);
}

cuda_device::cuda_device(std::shared_ptr<context> ctx, device_info info, launch_limits limits,
                         marker_mode mode)
    : ctx_(std::move(ctx)), info_(std::move(info)), limits_(limits), mode_(mode) {
  label_ = "CUDA device " + std::to_string(info_.ordinal) + " (" + info_.name + ")";
  // Created when the runtime starts, before any kernel of cora's runs.
  const auto& api = ctx_->api;
  current_context cur(*ctx_);
  if (!cur) return;
  memops_.wide = attribute(api, ctx_->device, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) != 0;
  memops_.nor = attribute(api, ctx_->device, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR) != 0;
  memops_.host_pointer =
      attribute(api, ctx_->device, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM) != 0;
  if (attribute(api, ctx_->device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) return;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = static_cast<int>(info_.ordinal);
  if (api.cuMemPoolCreate(&pool_, &props) != CUDA_SUCCESS) {
    pool_ = nullptr;
    return;
  }
  // Memory freed on one stream is reused by another only once its free has completed: the
  // driver must never make an allocation wait for other streams' work.
  int no = 0;
  api.cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &no);
  if (api.cuStreamCreateWithPriority(&memory_stream_, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS) {
    api.cuMemPoolDestroy(pool_);
    pool_ = nullptr;
    memory_stream_ = nullptr;
  }
}

cuda_device::~cuda_device() {
  shutdown();
  if (!pool_) return;
  current_context cur(*ctx_);
  // Nothing cora handed out is left (the core frees every allocation first); the driver
  // releases a pool with outstanding memory once that memory is freed anyway.
  ctx_->api.cuStreamDestroy(memory_stream_);
  ctx_->api.cuMemPoolDestroy(pool_);
}

void cuda_device::shutdown() noexcept {
  if (!memory_stream_) return;
  current_context cur(*ctx_);
  release_cache();
  // Frees still queued complete first; the pool itself stays (memory handed out may still be
  // freed later, stream-ordered on the default stream then).
  ctx_->api.cuStreamSynchronize(memory_stream_);
}

std::error_code cuda_device::health() const noexcept {
  return ctx_->lost() ? make_error_code(errc::device_lost) : std::error_code();
}

std::error_code cuda_device::fail(CUresult r) noexcept {
  if (ctx_->note(r)) return make_error_code(errc::device_lost);
  return to_error_code(r);
}

namespace {

// Blocks up to this size are kept for reuse; larger ones go back to the pool at once (their
// allocation's round trip is small beside what they hold).
constexpr std::size_t max_cached_block = std::size_t{64} << 20;

// The size a request is served with: at least 512 bytes, else rounded up to a quarter of its
// power of two, so that requests of nearby sizes share blocks and at most a fifth is wasted.
std::size_t size_class(std::size_t bytes) noexcept {
  if (bytes <= 512) return 512;
  const std::size_t step = std::bit_floor(bytes - 1) / 4;
  return (bytes + step - 1) / step * step;
}

}  // namespace

CUdeviceptr cuda_device::take_cached(std::size_t cls) noexcept {
  std::lock_guard lock(cache_mutex_);
  auto it = cache_.find(cls);
  if (it == cache_.end() || it->second.empty()) return 0;
  const CUdeviceptr p = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= cls;
  return p;
}

void cuda_device::release_cache() noexcept {
  std::unordered_map<std::size_t, std::vector<CUdeviceptr>> out;
  {
    std::lock_guard lock(cache_mutex_);
    out.swap(cache_);
    cached_bytes_ = 0;
  }
  for (auto& [cls, blocks] : out)
    for (CUdeviceptr p : blocks) ctx_->api.cuMemFreeAsync(p, memory_stream_);
}

void cuda_device::pool_alloc(CUdeviceptr& p, std::size_t bytes, CUresult& r) noexcept {
  // The internal stream runs only allocations and frees, whose memory no op uses any more,
  // so its synchronize returns as soon as the allocation is made: it never waits for a
  // kernel. After it, every stream may use the memory. No lock: the driver's calls are
  // thread-safe, and one held across the synchronize made every thread's allocations queue
  // behind one another.
  r = ctx_->api.cuMemAllocFromPoolAsync(&p, bytes, pool_, memory_stream_);
  if (r != CUDA_SUCCESS) return;
  r = ctx_->api.cuStreamSynchronize(memory_stream_);
  if (r != CUDA_SUCCESS) {
    ctx_->api.cuMemFreeAsync(p, memory_stream_);
    p = 0;
  }
}

void* cuda_device::alloc(std::size_t bytes, std::error_code& ec) {
  CUdeviceptr p = 0;
  CUresult r = CUDA_SUCCESS;
  const bool cached = pool_ && bytes <= max_cached_block;
  const std::size_t cls = cached ? size_class(bytes) : bytes;
  if (cached) p = take_cached(cls);
  if (!p) {
    current_context cur(*ctx_);
    r = cur.result;
    if (cur && pool_) {
      pool_alloc(p, cls, r);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        // Blocks kept for other sizes may be what is missing.
        release_cache();
        pool_alloc(p, cls, r);
      }
    } else if (cur) {
      r = ctx_->api.cuMemAlloc(&p, bytes);
    }
  }
  if (r != CUDA_SUCCESS) {
    ec = fail(r);
    return nullptr;
  }
  ec.clear();
  return reinterpret_cast<void*>(p);
}

void cuda_device::free(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  const auto dp = reinterpret_cast<CUdeviceptr>(p);
  if (pool_ && bytes <= max_cached_block) {
    const std::size_t cls = size_class(bytes);
    std::lock_guard lock(cache_mutex_);
    if (cached_bytes_ + cls <= cache_limit_) {
      // The vector keeps its capacity: a warm cache allocates nothing here.
      cache_[cls].push_back(dp);
      cached_bytes_ += cls;
      return;
    }
  }
  current_context cur(*ctx_);
  // The core frees only memory that no op in flight uses: a stream-ordered free on the
  // internal stream is ready at once, and returns without waiting.
  if (pool_)
    ctx_->api.cuMemFreeAsync(dp, memory_stream_);
  else
    ctx_->api.cuMemFree(dp);
}

memory_counters cuda_device::memory() const noexcept {
  memory_counters m;
  if (!pool_) return m;
  current_context cur(*ctx_);
  cuuint64_t v = 0;
  if (cur && ctx_->api.cuMemPoolGetAttribute(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS)
    m.reserved = static_cast<std::size_t>(v);
  return m;
}

void cuda_device::set_pool_release_threshold(std::size_t bytes) noexcept {
  if (!pool_) return;
  {
    std::lock_guard lock(cache_mutex_);
    cache_limit_ = bytes;
  }
  current_context cur(*ctx_);
  cuuint64_t v = bytes;
  if (cur) ctx_->api.cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
}

void cuda_device::trim(std::size_t keep) noexcept {
  if (!pool_) return;
  current_context cur(*ctx_);
  if (!cur) return;
  release_cache();
  // The frees just queued must have run before the pool can return their memory.
  ctx_->api.cuStreamSynchronize(memory_stream_);
  ctx_->api.cuMemPoolTrimTo(pool_, keep);
}

foreign_memory cuda_device::describe_pointer(const void* p) noexcept {
  foreign_memory out;
  current_context cur(*ctx_);
  if (!cur) return out;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
  unsigned int type = 0;
  unsigned int managed = 0;  // CUDA writes a bool-sized value; zeroed so either width reads right
  int ordinal = -1;
  CUdeviceptr start = 0;
  std::size_t size = 0;
  CUmemoryPool from_pool = nullptr;
  void* data[] = {&type, &managed, &ordinal, &start, &size, &from_pool};
  // CUDA 12+ answers CUDA_ERROR_INVALID_VALUE for memory the driver does not know (pageable
  // host memory); older drivers succeed with a zero memory type.
  const CUresult r = ctx_->api.cuPointerGetAttributes(6, attrs, data, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS || type == 0) return out;
  // cora's own pool hands out memory only through the core, which asks here only about
  // addresses it does not know: such memory was freed (and is kept for reuse, so the driver
  // still reports it live).
  if (pool_ && from_pool == pool_) return out;
  if (managed & 0xff)
    out.k = foreign_memory::kind::managed;
  else if (type == CU_MEMORYTYPE_HOST)
    out.k = foreign_memory::kind::host;
  else if (type == CU_MEMORYTYPE_DEVICE && ordinal == static_cast<int>(info_.ordinal))
    out.k = foreign_memory::kind::device;
  else
    return out;  // another device's memory: not usable here without peer access
  if (start != 0 && size != 0) {
    out.base = static_cast<std::uintptr_t>(start);
    out.size = size;
  }
  out.stream_ordered = from_pool != nullptr;
  return out;
}

void* cuda_device::native_handle() const noexcept { return ctx_->handle; }

void* cuda_device::alloc_host(std::size_t bytes, std::error_code& ec) {
  current_context cur(*ctx_);
  void* p = nullptr;
  // Portable: pinned for every context; device-mapped: kernels may read it directly.
  const CUresult r = cur ? ctx_->api.cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)
                         : cur.result;
  if (r != CUDA_SUCCESS) {
    ec = fail(r);
    return nullptr;
  }
  ec.clear();
  return p;
}

void cuda_device::free_host(void* p) noexcept {
  if (!p) return;
  current_context cur(*ctx_);
  ctx_->api.cuMemFreeHost(p);
}

void cuda_device::copy_sync(void* dst, const void* src, std::size_t bytes, std::error_code& ec) {
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuMemcpy(reinterpret_cast<CUdeviceptr>(dst),
                                              reinterpret_cast<CUdeviceptr>(src), bytes)
                         : cur.result;
  ec = r == CUDA_SUCCESS ? std::error_code() : fail(r);
}

std::unique_ptr<stream> cuda_device::create_stream(int priority, marker_wakeup wakeup,
                                                   std::error_code& ec) {
  if (ctx_->lost()) {
    ec = make_error_code(errc::device_lost);
    return nullptr;
  }
  current_context cur(*ctx_);
  CUstream s = nullptr;
  CUresult r = cur ? ctx_->api.cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, priority) : cur.result;
  if (r != CUDA_SUCCESS) {
    ec = fail(r);
    return nullptr;
  }
  return wrap_stream(s, true, wakeup, ec);
}

std::unique_ptr<stream> cuda_device::adopt_stream(void* native, marker_wakeup wakeup, std::error_code& ec) {
  if (ctx_->lost()) {
    ec = make_error_code(errc::device_lost);
    return nullptr;
  }
  current_context cur(*ctx_);
  if (!cur) {
    ec = fail(cur.result);
    return nullptr;
  }
  return wrap_stream(static_cast<CUstream>(native), false, wakeup, ec);
}

std::unique_ptr<stream> cuda_device::wrap_stream(CUstream s, bool owned, marker_wakeup wakeup,
                                                 std::error_code& ec) {
  CUresult r = CUDA_SUCCESS;
  const marker_mode mode = wakeup == marker_wakeup::host_callback ? marker_mode::callback : mode_;
  auto markers = make_marker_source(mode, ctx_, s, r);
  if (!markers) {
    if (owned) ctx_->api.cuStreamDestroy(s);
    ec = fail(r);
    return nullptr;
  }
  ec.clear();
  return std::make_unique<cuda_stream>(*this, s, std::move(markers), owned);
}

std::unique_ptr<event> cuda_device::create_event(bool timing, std::error_code& ec) {
  current_context cur(*ctx_);
  CUevent e = nullptr;
  const CUresult r = cur ? ctx_->api.cuEventCreate(&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING)
                         : cur.result;
  if (r != CUDA_SUCCESS) {
    ec = fail(r);
    return nullptr;
  }
  ec.clear();
  return std::make_unique<cuda_event>(ctx_, e, timing);
}

double cuda_device::elapsed_ms(event& start, event& end, std::error_code& ec) {
  auto& a = static_cast<cuda_event&>(start);
  auto& b = static_cast<cuda_event&>(end);
  if (!a.timing || !b.timing) {
    ec = make_error_code(errc::invalid_argument);
    return 0;
  }
  current_context cur(*ctx_);
  float ms = 0;
  const CUresult r = cur ? ctx_->api.event_elapsed_time(&ms, a.handle, b.handle) : cur.result;
  if (r == CUDA_ERROR_NOT_READY) {
    ec = make_error_code(errc::not_ready);
    return 0;
  }
  if (r != CUDA_SUCCESS) {
    ec = fail(r);
    return 0;
  }
  ec.clear();
  return ms;
}

bool cuda_device::event_done(event& ev, std::error_code& ec) {
  auto& e = static_cast<cuda_event&>(ev);
  current_context cur(*ctx_);
  const CUresult r = cur ? ctx_->api.cuEventQuery(e.handle) : cur.result;
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY) {
    ec.clear();
    return r == CUDA_SUCCESS;
  }
  ec = fail(r);
  return false;
}

bool cuda_device::on_own_thread() const noexcept { return in_host_call(); }

std::unique_ptr<module> cuda_device::load(std::span<const std::byte> image, image_kind kind,
                                          const image_key&, std::error_code& ec,
                                          std::string& message) {
  // Nothing is kept: the driver's module load is the whole cost.
  return cuda_module::load(ctx_, image, kind, label_, info_.compute_major, info_.compute_minor, ec,
                           message);
}

}  // namespace cora::backend::cuda

namespace cora::backend {

void stop_cuda_calls_for_exit() noexcept {
  cuda::process_exit_begun.store(true, std::memory_order_relaxed);
}

std::vector<std::unique_ptr<device>> make_cuda_devices(std::string& reason) {
  using namespace cuda;
  const driver_api* api = driver(reason);
  if (!api) return {};
  CUresult r = api->cuInit(0);
  if (r != CUDA_SUCCESS) {
    reason = "cuInit failed: " + describe(r);
    return {};
  }
  int count = 0;
  r = api->cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count <= 0) {
    reason = r != CUDA_SUCCESS ? "cuDeviceGetCount failed: " + describe(r)
                               : "the NVIDIA driver reports no CUDA device";
    return {};
  }

  // Markers: auto (default: counters while one thread records, events while several do),
  // counter or event, from CORA_CUDA_MARKER; the callback policy asks for callback markers per
  // stream.
  marker_mode mode = marker_mode::automatic;
  std::string notes;
  if (const char* v = std::getenv("CORA_CUDA_MARKER"); v && *v) {
    if (std::strcmp(v, "auto") == 0)
      mode = marker_mode::automatic;
    else if (std::strcmp(v, "event") == 0)
      mode = marker_mode::event;
    else if (std::strcmp(v, "counter") == 0)
      mode = marker_mode::counter;
    else
      notes = "; CORA_CUDA_MARKER=" + std::string(v) + " is not valid (auto, counter or event), ignored";
  }

  std::vector<std::unique_ptr<device>> out;
  std::string failures;
  const std::string module = kernel_module_version();
  for (int i = 0; i < count; ++i) {
    std::string message;
    auto ctx = context::retain(*api, i, message);
    if (!ctx) {
      failures += "; " + message;
      continue;
    }
    const CUdevice dev = ctx->device;
    device_info info;
    char name[256] = {};
    if (api->cuDeviceGetName(name, sizeof(name) - 1, dev) == CUDA_SUCCESS) info.name = name;
    if (info.name.empty()) info.name = "CUDA device " + std::to_string(i);
    info.backend = "cuda";
    info.ordinal = static_cast<unsigned>(i);
    info.compute_units = to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
    std::size_t total = 0;
    if (api->cuDeviceTotalMem(&total, dev) == CUDA_SUCCESS) info.total_memory = total;
    info.max_grid = dim3(to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)),
                         to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)),
                         to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)));
    info.max_block = dim3(to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)),
                          to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)),
                          to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)));
    info.max_threads_per_block = to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
    info.max_shared_bytes = to_u32(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN));
    info.compute_major = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    info.compute_minor = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    info.driver = "CUDA " + version_string(api->version) +
                  (module.empty() ? std::string() : ", kernel module " + module);
    char bus[64] = {};
    if (api->cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, dev) == CUDA_SUCCESS) info.pci_bus_id = bus;
    CUuuid uuid{};
    if (api->cuDeviceGetUuid(&uuid, dev) == CUDA_SUCCESS) info.uuid = uuid_string(uuid);

    launch_limits limits;
    limits.max_shared_optin = info.max_shared_bytes;
    limits.cooperative = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) != 0;
    limits.clusters = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH) != 0;
    out.push_back(std::make_unique<cuda_device>(std::move(ctx), std::move(info), limits, mode));
  }
  if (out.empty()) {
    reason = "no CUDA device is usable" + failures;
    return {};
  }
  reason = "CUDA " + version_string(api->version) +
           (module.empty() ? std::string() : ", kernel module " + module) +
           ", markers: " + to_string(mode) + notes + failures;
  return out;
}

}  // namespace cora::backend
