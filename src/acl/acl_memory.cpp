// Device and host memory, copies and fills.
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
    if (r.k == cora::detail::memory_region::kind::device && r.device) owner = r.device->handle;
    std::error_code ec;
    owner->free(devPtr, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
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
