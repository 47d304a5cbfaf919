// Device and host memory, copies and fills.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "acl/acl_state.hpp"
#include "core/state.hpp"

using namespace cora::acl;

namespace {

// What the core knows of an address (device memory of some device, pinned or other host
// memory); the same classification its streams use for copies.
cora::detail::memory_region classify(cora::device& dev, const void* p, std::size_t bytes) {
  std::error_code ec;
  return dev.state()->classify(p, bytes, ec);
}

void forget_managed(const void* p);

// `kind` as the caller's integer (see enum_value).
aclError check_copy(const char* api, void* dst, std::size_t destMax, const void* src, std::size_t count,
                    std::int64_t kind) {
  CORA_ACL_REQUIRE(dst, "dst is NULL");
  CORA_ACL_REQUIRE(src, "src is NULL");
  // The direction comes from the addresses, as CANN documents; the kind must still be one.
  CORA_ACL_REQUIRE(kind >= ACL_MEMCPY_HOST_TO_HOST && kind <= ACL_MEMCPY_INTER_DEVICE_TO_DEVICE,
                   "kind is not an aclrtMemcpyKind");
  CORA_ACL_REQUIRE(count <= destMax, "count (" + std::to_string(count) + ") exceeds destMax (" +
                                         std::to_string(destMax) + ")");
  return ACL_SUCCESS;
}

}  // namespace

namespace cora::acl {

aclError check_policy(const char* api, std::int64_t policy) {
  // One page policy (the low byte: HUGE_FIRST..HUGE1G_ONLY_P2P), at most one bandwidth type,
  // and the read-only flag: CANN's aclrtMemMallocPolicy, combined as its documentation allows.
  constexpr std::int64_t flags =
      ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH | ACL_MEM_ACCESS_USER_SPACE_READONLY;
  CORA_ACL_REQUIRE(policy >= 0 && (policy & ~(flags | 0xff)) == 0 &&
                       (policy & 0xff) <= ACL_MEM_MALLOC_HUGE1G_ONLY_P2P,
                   "policy " + std::to_string(policy) + " is not an aclrtMemMallocPolicy");
  CORA_ACL_REQUIRE((policy & ACL_MEM_TYPE_LOW_BAND_WIDTH) == 0 || (policy & ACL_MEM_TYPE_HIGH_BAND_WIDTH) == 0,
                   "policy names both LOW_BAND_WIDTH and HIGH_BAND_WIDTH");
  return ACL_SUCCESS;
}

}  // namespace cora::acl

extern "C" {

aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(devPtr, "devPtr is NULL");
    CORA_ACL_REQUIRE(size > 0, "size must be > 0");
    if (aclError e = check_policy(api, enum_value(policy))) return e;
    // Page-size and bandwidth policies are placement hints with one answer on cora; read-only
    // device memory is a feature it has not.
    if (enum_value(policy) & ACL_MEM_ACCESS_USER_SPACE_READONLY)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "read-only device memory is not supported");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    std::error_code ec;
    void* p = ctx.device->malloc(size, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    *devPtr = p;
    return ACL_SUCCESS;
  });
}

aclError aclrtFree(void* devPtr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(devPtr, "devPtr is NULL");
    std::shared_ptr<cora::runtime> rt;
    if (aclError e = initialized_runtime(api, rt)) return e;
    // Free it on the device that owns it, whichever device the thread has set.
    cora::device* owner = &rt->device(0);
    const auto r = classify(*owner, devPtr, 1);
    if (r.k == cora::detail::memory_region::kind::device && r.device) owner = &r.device->handle;
    std::error_code ec;
    owner->free(devPtr, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    forget_managed(devPtr);
    return ACL_SUCCESS;
  });
}

aclError aclrtMallocHost(void** hostPtr, size_t size) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(hostPtr, "hostPtr is NULL");
    CORA_ACL_REQUIRE(size > 0, "size must be > 0");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    std::error_code ec;
    void* p = ctx.device->malloc_host(size, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    *hostPtr = p;
    return ACL_SUCCESS;
  });
}

aclError aclrtFreeHost(void* hostPtr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(hostPtr, "hostPtr is NULL");
    std::shared_ptr<cora::runtime> rt;
    if (aclError e = initialized_runtime(api, rt)) return e;
    std::error_code ec;
    rt->device(0).free_host(hostPtr, ec);  // pinned memory is tracked runtime-wide
    if (ec) return fail(ec, api, cora::last_error_message());
    return ACL_SUCCESS;
  });
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_copy(api, dst, destMax, src, count, enum_value(kind))) return e;
    if (count == 0) return ACL_SUCCESS;
    // A synchronous copy on the device's own internal stream: it waits for nothing else.
    std::shared_ptr<stream_obj> s;
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      context ctx;
      if (aclError e = current_locked(st, api, ctx)) return e;
      if (aclError e = sync_stream_locked(st, api, ctx, s)) return e;
    }
    auto p = s->s.copy(dst, src, count);
    return wait(api, p);
  });
}

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_copy(api, dst, destMax, src, count, enum_value(kind))) return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    if (count == 0) return ACL_SUCCESS;
    auto p = s->s.copy(dst, src, count);
    // Into pageable host memory CANN's call returns once the copy is done (the data is readable
    // then); into pinned or device memory it returns at once.
    if (classify(s->s.device(), dst, count).k == cora::detail::memory_region::kind::pageable_host)
      return wait(api, p);
    return check_enqueued(api, p);
  });
}

aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(devPtr, "devPtr is NULL");
    CORA_ACL_REQUIRE(count <= maxCount, "count (" + std::to_string(count) + ") exceeds maxCount (" +
                                            std::to_string(maxCount) + ")");
    if (count == 0) return ACL_SUCCESS;
    std::shared_ptr<stream_obj> s;
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      context ctx;
      if (aclError e = current_locked(st, api, ctx)) return e;
      if (aclError e = sync_stream_locked(st, api, ctx, s)) return e;
    }
    auto p = s->s.fill(devPtr, static_cast<std::uint8_t>(value), count);
    return wait(api, p);
  });
}

aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(devPtr, "devPtr is NULL");
    CORA_ACL_REQUIRE(count <= maxCount, "count (" + std::to_string(count) + ") exceeds maxCount (" +
                                            std::to_string(maxCount) + ")");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    if (count == 0) return ACL_SUCCESS;
    auto p = s->s.fill(devPtr, static_cast<std::uint8_t>(value), count);
    return check_enqueued(api, p);
  });
}

}  // extern "C"

// --- allocation forms, information, registration ------------------------------------------------

namespace {

// Host ranges registered by aclrtHostRegister (start -> size), and managed allocations.
struct host_registry {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> ranges;
  std::set<const void*> managed;
};
host_registry& registry() {
  static auto* r = new host_registry;  // never destroyed: used until the process ends
  return *r;
}

// The registered range holding [p, p+bytes), if any.
bool registered(const void* p, std::size_t bytes, std::uintptr_t* start = nullptr) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = r.ranges.upper_bound(a);
  if (it == r.ranges.begin()) return false;
  --it;
  if (a - it->first + bytes > it->second) return false;
  if (start) *start = it->first;
  return true;
}

aclError check_malloc_cfg(const char* api, const aclrtMallocConfig* cfg, std::int64_t& device) {
  device = -1;
  if (!cfg) return ACL_SUCCESS;
  CORA_ACL_REQUIRE(cfg->numAttrs == 0 || cfg->attrs, "cfg->attrs is NULL but numAttrs is not 0");
  for (std::size_t i = 0; i < cfg->numAttrs; ++i) {
    const auto& a = cfg->attrs[i];
    switch (enum_value(a.attr)) {
      case ACL_RT_MEM_ATTR_RSV:
      case ACL_RT_MEM_ATTR_MODULE_ID: break;  // a module id tags the memory for CANN's statistics
      case ACL_RT_MEM_ATTR_DEVICE_ID: device = a.value.deviceId; break;
      case ACL_RT_MEM_ATTR_VA_FLAG:
        if (a.value.vaFlag != 0)
          return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "virtual-address flags are not supported");
        break;
      default: return fail(ACL_ERROR_INVALID_PARAM, api, "cfg has an attribute that is not an aclrtMallocAttrType");
    }
  }
  return ACL_SUCCESS;
}

aclError device_malloc(const char* api, void** devPtr, std::size_t size, std::int64_t policy, std::int64_t device) {
  CORA_ACL_REQUIRE(devPtr, "devPtr is NULL");
  CORA_ACL_REQUIRE(size > 0, "size must be > 0");
  if (aclError e = check_policy(api, policy)) return e;
  if (policy & ACL_MEM_ACCESS_USER_SPACE_READONLY)
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "read-only device memory is not supported");
  cora::device* dev = nullptr;
  {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (device >= 0) {
      if (aclError e = check_device_locked(st, api, device)) return e;
      dev = &st.runtime->device(static_cast<std::size_t>(device));
    } else {
      context ctx;
      if (aclError e = current_locked(st, api, ctx)) return e;
      dev = ctx.device;
    }
  }
  std::error_code ec;
  void* p = dev->malloc(size, ec);
  if (ec) return fail(ec, api, cora::last_error_message());
  *devPtr = p;
  return ACL_SUCCESS;
}

// Copies `rows` rows of `width` bytes between pitched layouts, on `s`; the last op in `last`.
aclError copy_2d(const char* api, stream_obj& s, void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                 std::size_t width, std::size_t height, cora::pending<void>& last) {
  for (std::size_t r = 0; r < height; ++r) {
    auto p = s.s.copy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    if (r + 1 < height) {
      if (aclError e = check_enqueued(api, p)) return e;
    } else {
      last = std::move(p);
    }
  }
  return ACL_SUCCESS;
}

aclError check_2d(const char* api, void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                  std::size_t width, std::size_t height, std::int64_t kind) {
  CORA_ACL_REQUIRE(dst, "dst is NULL");
  CORA_ACL_REQUIRE(src, "src is NULL");
  CORA_ACL_REQUIRE(width > 0 && height > 0, "width and height must be > 0");
  CORA_ACL_REQUIRE(width <= dpitch && width <= spitch, "width exceeds a pitch");
  CORA_ACL_REQUIRE(kind >= ACL_MEMCPY_HOST_TO_HOST && kind <= ACL_MEMCPY_INTER_DEVICE_TO_DEVICE,
                   "kind is not an aclrtMemcpyKind");
  // Both extents must be representable: (height - 1) * pitch + width.
  CORA_ACL_REQUIRE((height - 1) <= (SIZE_MAX - width) / std::max(dpitch, spitch), "the 2-D extent overflows");
  return ACL_SUCCESS;
}

// Fills N 32-bit words at ptr with `value` on `s` (a pattern copied from host memory).
aclError fill_d32(const char* api, stream_obj& s, void* ptr, std::uint32_t value, std::size_t n,
                  cora::pending<void>& last) {
  constexpr std::size_t chunk_words = 1 << 16;
  const std::vector<std::uint32_t> pattern(std::min(n, chunk_words), value);
  for (std::size_t done = 0; done < n;) {
    const std::size_t k = std::min(chunk_words, n - done);
    auto p = s.s.copy(static_cast<std::uint32_t*>(ptr) + done, pattern.data(), k * 4);  // the source is read now
    done += k;
    if (done < n) {
      if (aclError e = check_enqueued(api, p)) return e;
    } else {
      last = std::move(p);
    }
  }
  return ACL_SUCCESS;
}

aclError sync_stream_of_current(const char* api, std::shared_ptr<stream_obj>& s) {
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  context ctx;
  if (aclError e = current_locked(st, api, ctx)) return e;
  return sync_stream_locked(st, api, ctx, s);
}

aclError check_batch(const char* api, void** dsts, std::size_t* destMaxs, void** srcs, std::size_t* sizes,
                     std::size_t numBatches, aclrtMemcpyBatchAttr* attrs, std::size_t* attrsIndexes,
                     std::size_t numAttrs) {
  CORA_ACL_REQUIRE(dsts && destMaxs && srcs && sizes, "dsts, destMaxs, srcs and sizes must not be NULL");
  CORA_ACL_REQUIRE(numBatches > 0, "numBatches must be > 0");
  CORA_ACL_REQUIRE(numAttrs > 0 && numAttrs <= numBatches && attrs && attrsIndexes,
                   "attrs and attrsIndexes must name 1 to numBatches attributes");
  CORA_ACL_REQUIRE(attrsIndexes[0] == 0, "attrsIndexes[0] must be 0");
  for (std::size_t i = 0; i < numAttrs; ++i)
    for (const auto* loc : {&attrs[i].dstLoc, &attrs[i].srcLoc}) {
      const auto t = enum_value(loc->type);
      CORA_ACL_REQUIRE(t >= ACL_MEM_LOCATION_TYPE_HOST && t <= ACL_MEM_LOCATION_TYPE_HOST_NUMA,
                       "a location type is not an aclrtMemLocationType");
    }
  for (std::size_t i = 1; i < numAttrs; ++i)
    CORA_ACL_REQUIRE(attrsIndexes[i] > attrsIndexes[i - 1] && attrsIndexes[i] < numBatches,
                     "attrsIndexes must increase and stay below numBatches");
  for (std::size_t i = 0; i < numBatches; ++i) {
    CORA_ACL_REQUIRE(dsts[i] && srcs[i], "copy " + std::to_string(i) + " has a NULL address");
    CORA_ACL_REQUIRE(sizes[i] <= destMaxs[i], "copy " + std::to_string(i) + " exceeds its destMax");
  }
  return ACL_SUCCESS;
}

aclError copy_batch(const char* api, stream_obj& s, void** dsts, void** srcs, std::size_t* sizes,
                    std::size_t numBatches, std::size_t* failIndex, std::vector<cora::pending<void>>& ops) {
  for (std::size_t i = 0; i < numBatches; ++i) {
    if (sizes[i] == 0) continue;
    auto p = s.s.copy(dsts[i], srcs[i], sizes[i]);
    if (aclError e = check_enqueued(api, p)) {
      if (failIndex) *failIndex = i;
      return e;
    }
    ops.push_back(std::move(p));
  }
  return ACL_SUCCESS;
}

void forget_managed(const void* p) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.managed.erase(p);
}

}  // namespace

extern "C" {

aclError aclrtMallocAlign32(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(size <= SIZE_MAX - 31, "size overflows when rounded up to 32 bytes");
    // The size rounded up to 32 bytes, with no extra 32 bytes as aclrtMalloc adds on Ascend; cora's
    // allocations are at least 64-byte aligned.
    return device_malloc(api, devPtr, (size + 31) / 32 * 32, enum_value(policy), -1);
  });
}

aclError aclrtMallocCached(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
  const char* const api = __func__;
  // Device memory on cora is coherent for the host's copies: cached memory is plain memory.
  return guarded(api, [&] { return device_malloc(api, devPtr, size, enum_value(policy), -1); });
}

aclError aclrtMallocWithCfg(void** devPtr, size_t size, aclrtMemMallocPolicy policy, aclrtMallocConfig* cfg) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::int64_t device = -1;
    if (aclError e = check_malloc_cfg(api, cfg, device)) return e;
    return device_malloc(api, devPtr, size, enum_value(policy), device);
  });
}

aclError aclrtMallocHostWithCfg(void** ptr, uint64_t size, aclrtMallocConfig* cfg) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::int64_t device = -1;
    if (aclError e = check_malloc_cfg(api, cfg, device)) return e;
    CORA_ACL_REQUIRE(size <= SIZE_MAX, "size does not fit this host's address space");
    return aclrtMallocHost(ptr, static_cast<size_t>(size));
  });
}

aclError aclrtFreeWithDevSync(void* devPtr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(devPtr, "devPtr is NULL");
    // Wait for the work of the thread's device, then free, as CANN does.
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    auto p = ctx.device->synchronize();
    if (aclError e = wait(api, p)) return e;
    return aclrtFree(devPtr);
  });
}

aclError aclrtFreeHostWithDevSync(void* hostPtr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(hostPtr, "hostPtr is NULL");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    auto p = ctx.device->synchronize();
    if (aclError e = wait(api, p)) return e;
    return aclrtFreeHost(hostPtr);
  });
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    const auto a = enum_value(attr);
    CORA_ACL_REQUIRE(a >= ACL_DDR_MEM && a <= ACL_MEM_P2P_HUGE1G, "attr is not an aclrtMemAttr");
    CORA_ACL_REQUIRE(free && total, "free or total is NULL");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    // One kind of device memory answers for every attribute: page sizes and DDR/HBM are
    // Ascend distinctions.
    const std::size_t t = ctx.device->properties().total_memory;
    const std::size_t used = ctx.device->memory_in_use();
    *total = t;
    *free = used < t ? t - used : 0;
    return ACL_SUCCESS;
  });
}

aclError aclrtPointerGetAttributes(const void* ptr, aclrtPtrAttributes* attributes) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(ptr, "ptr is NULL");
    CORA_ACL_REQUIRE(attributes, "attributes is NULL");
    std::shared_ptr<cora::runtime> rt;
    if (aclError e = initialized_runtime(api, rt)) return e;
    *attributes = aclrtPtrAttributes{};
    attributes->pageSize = 4096;
    bool managed;
    {
      auto& r = registry();
      std::lock_guard lock(r.mutex);
      managed = r.managed.count(ptr) != 0;
    }
    const auto region = classify(rt->device(0), ptr, 1);
    switch (region.k) {
      case cora::detail::memory_region::kind::device:
        attributes->location.type = managed ? ACL_MEM_LOCATION_TYPE_MANAGED : ACL_MEM_LOCATION_TYPE_DEVICE;
        attributes->location.id = region.device ? static_cast<uint32_t>(region.device->index) : 0;
        break;
      case cora::detail::memory_region::kind::pinned_host:
        attributes->location.type = ACL_MEM_LOCATION_TYPE_HOST;
        break;
      case cora::detail::memory_region::kind::pageable_host:
        attributes->location.type =
            registered(ptr, 1) ? ACL_MEM_LOCATION_TYPE_HOST : ACL_MEM_LOCATION_TYPE_UNREGISTERED;
        break;
    }
    return ACL_SUCCESS;
  });
}

aclError aclrtHostRegister(void* ptr, uint64_t size, aclrtHostRegisterType type, void** devPtr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(ptr, "ptr is NULL");
    CORA_ACL_REQUIRE(size > 0 && size <= SIZE_MAX, "size must be > 0");
    CORA_ACL_REQUIRE(devPtr, "devPtr is NULL");
    const auto t = enum_value(type);
    CORA_ACL_REQUIRE(t == ACL_HOST_REGISTER_MAPPED || t == ACL_HOST_REGISTER_IOMEMORY || t == ACL_HOST_REGISTER_READONLY,
                     "type is not an aclrtHostRegisterType");
    if (t != ACL_HOST_REGISTER_MAPPED)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "I/O-memory and read-only registrations are not supported");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    // A CPU device's kernels address host memory directly, so a mapped range is its own device
    // address. A GPU needs the driver to pin and map it, which cora's core does not offer yet.
    if (ctx.device->backend() != cora::backend_kind::cpu)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "host registration is supported on the CPU device only");
    if (classify(*ctx.device, ptr, static_cast<std::size_t>(size)).k != cora::detail::memory_region::kind::pageable_host)
      return fail(ACL_ERROR_INVALID_PARAM, api, "ptr is device or pinned memory of cora, not pageable host memory");
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    const auto a = reinterpret_cast<std::uintptr_t>(ptr);
    auto it = r.ranges.upper_bound(a + size - 1);
    if (it != r.ranges.begin() && std::prev(it)->first + std::prev(it)->second > a)
      return fail(ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED, api, "the range overlaps a registered one");
    r.ranges.emplace(a, static_cast<std::size_t>(size));
    *devPtr = ptr;
    return ACL_SUCCESS;
  });
}

aclError aclrtHostRegisterV2(void* ptr, uint64_t size, uint32_t flag) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    constexpr uint32_t known = ACL_HOST_REG_MAPPED | ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY | ACL_HOST_REG_PINNED;
    CORA_ACL_REQUIRE((flag & ~known) == 0, "flag has bits that are not ACL_HOST_REG_*");
    if (flag & (ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY))
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "I/O-memory and read-only registrations are not supported");
    void* dev = nullptr;
    return aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &dev);
  });
}

aclError aclrtHostGetDevicePointer(void* pHost, void** pDevice, uint32_t flag) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(pHost, "pHost is NULL");
    CORA_ACL_REQUIRE(pDevice, "pDevice is NULL");
    CORA_ACL_REQUIRE(flag == 0, "flag must be 0");
    if (!registered(pHost, 1))
      return fail(ACL_ERROR_HOST_MEMORY_NOT_REGISTERED, api, "pHost is in no range of aclrtHostRegister");
    *pDevice = pHost;  // the CPU device addresses registered host memory directly
    return ACL_SUCCESS;
  });
}

aclError aclrtHostUnregister(void* ptr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(ptr, "ptr is NULL");
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    if (r.ranges.erase(reinterpret_cast<std::uintptr_t>(ptr)) == 0)
      return fail(ACL_ERROR_HOST_MEMORY_NOT_REGISTERED, api, "ptr is not the start of a registered range");
    return ACL_SUCCESS;
  });
}

aclError aclrtMemAllocManaged(void** ptr, uint64_t size, uint32_t flag) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(ptr, "ptr is NULL");
    CORA_ACL_REQUIRE(size > 0 && size <= SIZE_MAX, "size must be > 0");
    CORA_ACL_REQUIRE(flag == 0 || flag == 1, "flag must be 0 or 1");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    // The CPU device's memory is host memory, reachable from both sides: managed memory as is.
    if (ctx.device->backend() != cora::backend_kind::cpu)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "managed memory is supported on the CPU device only");
    std::error_code ec;
    void* p = ctx.device->malloc(static_cast<std::size_t>(size), ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    {
      auto& r = registry();
      std::lock_guard lock(r.mutex);
      r.managed.insert(p);
    }
    *ptr = p;
    return ACL_SUCCESS;
  });
}

aclError aclrtMemcpy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                       aclrtMemcpyKind kind) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_2d(api, dst, dpitch, src, spitch, width, height, enum_value(kind))) return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = sync_stream_of_current(api, s)) return e;
    cora::pending<void> last;
    if (aclError e = copy_2d(api, *s, dst, dpitch, src, spitch, width, height, last)) return e;
    return wait(api, last);  // one stream: the last row's completion means all are done
  });
}

aclError aclrtMemcpy2dAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                            aclrtMemcpyKind kind, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_2d(api, dst, dpitch, src, spitch, width, height, enum_value(kind))) return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    cora::pending<void> last;
    if (aclError e = copy_2d(api, *s, dst, dpitch, src, spitch, width, height, last)) return e;
    if (classify(s->s.device(), dst, 1).k == cora::detail::memory_region::kind::pageable_host)
      return wait(api, last);  // into pageable memory: done on return, as aclrtMemcpyAsync
    return check_enqueued(api, last);
  });
}

aclError aclrtMemsetD32(void* ptr, size_t memSize, uint32_t value, size_t N) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(ptr, "ptr is NULL");
    CORA_ACL_REQUIRE(N <= memSize / 4, "N 32-bit values exceed memSize");
    if (N == 0) return ACL_SUCCESS;
    std::shared_ptr<stream_obj> s;
    if (aclError e = sync_stream_of_current(api, s)) return e;
    cora::pending<void> last;
    if (aclError e = fill_d32(api, *s, ptr, value, N, last)) return e;
    return wait(api, last);
  });
}

aclError aclrtMemsetD32Async(void* ptr, size_t memSize, uint32_t value, size_t N, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(ptr, "ptr is NULL");
    CORA_ACL_REQUIRE(N <= memSize / 4, "N 32-bit values exceed memSize");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    if (N == 0) return ACL_SUCCESS;
    cora::pending<void> last;
    if (aclError e = fill_d32(api, *s, ptr, value, N, last)) return e;
    return check_enqueued(api, last);
  });
}

aclError aclrtMemcpyBatch(void** dsts, size_t* destMaxs, void** srcs, size_t* sizes, size_t numBatches,
                          aclrtMemcpyBatchAttr* attrs, size_t* attrsIndexes, size_t numAttrs, size_t* failIndex) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(failIndex, "failIndex is NULL");
    *failIndex = SIZE_MAX;
    if (aclError e = check_batch(api, dsts, destMaxs, srcs, sizes, numBatches, attrs, attrsIndexes, numAttrs))
      return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = sync_stream_of_current(api, s)) return e;
    std::vector<cora::pending<void>> ops;
    const aclError e = copy_batch(api, *s, dsts, srcs, sizes, numBatches, failIndex, ops);
    for (auto& p : ops) {  // every copy enqueued is waited for, even after a failure
      const aclError w = wait(api, p);
      if (w && !e) return w;
    }
    return e;
  });
}

aclError aclrtMemcpyBatchAsync(void** dsts, size_t* destMaxs, void** srcs, size_t* sizes, size_t numBatches,
                               aclrtMemcpyBatchAttr* attrs, size_t* attrsIndexes, size_t numAttrs, size_t* failIndex,
                               aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(failIndex, "failIndex is NULL");
    *failIndex = SIZE_MAX;
    if (aclError e = check_batch(api, dsts, destMaxs, srcs, sizes, numBatches, attrs, attrsIndexes, numAttrs))
      return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    std::vector<cora::pending<void>> ops;
    return copy_batch(api, *s, dsts, srcs, sizes, numBatches, failIndex, ops);
  });
}

aclError aclrtMemcpyBatchV2(void** dsts, size_t* destMaxs, void** srcs, size_t* sizes, size_t numBatches,
                            aclrtMemcpyBatchAttr* attrs, size_t* attrsIndexes, size_t numAttrs) {
  size_t failIndex = 0;  // the V2 forms report no index
  return aclrtMemcpyBatch(dsts, destMaxs, srcs, sizes, numBatches, attrs, attrsIndexes, numAttrs, &failIndex);
}

aclError aclrtMemcpyBatchAsyncV2(void** dsts, size_t* destMaxs, void** srcs, size_t* sizes, size_t numBatches,
                                 aclrtMemcpyBatchAttr* attrs, size_t* attrsIndexes, size_t numAttrs,
                                 aclrtStream stream) {
  size_t failIndex = 0;
  return aclrtMemcpyBatchAsync(dsts, destMaxs, srcs, sizes, numBatches, attrs, attrsIndexes, numAttrs, &failIndex,
                               stream);
}

}  // extern "C"
