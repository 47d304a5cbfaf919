// The C API: device and host memory, copies and fills.
#include <acl/acl_rt_api.h>

#include <algorithm>
#include <numeric>

#include "support/acl_c_api.h"
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_memory_test : public acl_test {};
CORA_ACL_SUITE(acl_memory_test);

TEST_P(acl_memory_test, MallocAndFree) {
  for (int policy : std::initializer_list<int>{ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_ONLY, ACL_MEM_MALLOC_NORMAL_ONLY,
                     ACL_MEM_MALLOC_HUGE_FIRST_P2P, ACL_MEM_MALLOC_HUGE_ONLY_P2P, ACL_MEM_MALLOC_NORMAL_ONLY_P2P,
                     ACL_MEM_MALLOC_HUGE1G_ONLY, ACL_MEM_MALLOC_HUGE1G_ONLY_P2P,
                     ACL_MEM_MALLOC_HUGE_FIRST | ACL_MEM_TYPE_HIGH_BAND_WIDTH}) {
    void* p = nullptr;
    ASSERT_EQ(aclrtMalloc(&p, 1000, static_cast<aclrtMemMallocPolicy>(policy)), ACL_SUCCESS) << policy;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);  // CANN's alignment
    EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
  }
}

TEST_P(acl_memory_test, MallocMisuse) {
  void* p = nullptr;
  EXPECT_EQ(aclrtMalloc(nullptr, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMalloc(&p, 64, ACL_MEM_ACCESS_USER_SPACE_READONLY), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtMalloc(&p, std::size_t{1} << 62, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);
  // A policy outside CANN's enum is refused (issue 18, item 8: 12345 was accepted).
  for (int bad : {12345, 8, 0xff, 0x400000, 0x500000, -1,
                  ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH}) {
    p = nullptr;
    EXPECT_EQ(acl_c_malloc(&p, 64, bad), ACL_ERROR_INVALID_PARAM) << bad;
    EXPECT_EQ(p, nullptr);
  }
  // A page policy combined with a bandwidth type is one.
  ASSERT_EQ(acl_c_malloc(&p, 64, ACL_MEM_MALLOC_HUGE1G_ONLY_P2P | ACL_MEM_TYPE_HIGH_BAND_WIDTH), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
}

TEST_P(acl_memory_test, FreeMisuse) {
  EXPECT_EQ(aclrtFree(nullptr), ACL_ERROR_INVALID_PARAM);
  void* p = dmalloc(128);
  ASSERT_EQ(aclrtFree(p), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_ERROR_RT_PARAM_INVALID);  // double free
  int host = 0;
  EXPECT_EQ(aclrtFree(&host), ACL_ERROR_RT_PARAM_INVALID);
  void* h = nullptr;
  ASSERT_EQ(aclrtMallocHost(&h, 64), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(h), ACL_ERROR_RT_PARAM_INVALID);  // host memory goes to aclrtFreeHost
  EXPECT_EQ(aclrtFreeHost(h), ACL_SUCCESS);
}

TEST_P(acl_memory_test, HostMemory) {
  void* h = nullptr;
  EXPECT_EQ(aclrtMallocHost(nullptr, 64), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMallocHost(&h, 0), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclrtMallocHost(&h, 4096), ACL_SUCCESS);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(h) % 64, 0u);
  std::memset(h, 0x5a, 4096);  // host-accessible
  EXPECT_EQ(aclrtFreeHost(h), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeHost(h), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtFreeHost(nullptr), ACL_ERROR_INVALID_PARAM);
  int not_pinned = 0;
  EXPECT_EQ(aclrtFreeHost(&not_pinned), ACL_ERROR_RT_PARAM_INVALID);
}

TEST_P(acl_memory_test, AllocationForms) {
  void* p = nullptr;
  ASSERT_EQ(aclrtMallocAlign32(&p, 33, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 32, 0u);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
  ASSERT_EQ(aclrtMallocCached(&p, 64, ACL_MEM_MALLOC_NORMAL_ONLY), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeWithDevSync(p), ACL_SUCCESS);
  EXPECT_EQ(aclrtMallocCached(&p, 64, static_cast<aclrtMemMallocPolicy>(12345)), ACL_ERROR_INVALID_PARAM);
  aclrtMallocAttribute attr{};
  attr.attr = ACL_RT_MEM_ATTR_DEVICE_ID;
  attr.value.deviceId = static_cast<uint32_t>(dev_);
  aclrtMallocConfig cfg{&attr, 1};
  ASSERT_EQ(aclrtMallocWithCfg(&p, 128, ACL_MEM_MALLOC_HUGE_FIRST, &cfg), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
  ASSERT_EQ(aclrtMallocWithCfg(&p, 128, ACL_MEM_MALLOC_HUGE_FIRST, nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
  attr.value.deviceId = 999;
  EXPECT_EQ(aclrtMallocWithCfg(&p, 128, ACL_MEM_MALLOC_HUGE_FIRST, &cfg), ACL_ERROR_RT_INVALID_DEVICEID);
  ASSERT_EQ(aclrtMallocHostWithCfg(&p, 256, nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeHostWithDevSync(p), ACL_SUCCESS);
  EXPECT_EQ(aclrtMallocHostWithCfg(nullptr, 256, nullptr), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_memory_test, MemInfoAndPointerAttributes) {
  size_t free_before = 0, total = 0, free_after = 0;
  ASSERT_EQ(aclrtGetMemInfo(ACL_HBM_MEM, &free_before, &total), ACL_SUCCESS);
  EXPECT_GT(total, 0u);
  EXPECT_LE(free_before, total);
  void* d = dmalloc(1 << 20);
  ASSERT_EQ(aclrtGetMemInfo(ACL_HBM_MEM, &free_after, &total), ACL_SUCCESS);
  EXPECT_LE(free_after + (1 << 20), free_before);
  EXPECT_EQ(aclrtGetMemInfo(static_cast<aclrtMemAttr>(31), &free_after, &total), ACL_ERROR_INVALID_PARAM);
  aclrtPtrAttributes a{};
  ASSERT_EQ(aclrtPointerGetAttributes(d, &a), ACL_SUCCESS);
  EXPECT_EQ(a.location.type, ACL_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(a.location.id, static_cast<uint32_t>(dev_));
  void* h = nullptr;
  ASSERT_EQ(aclrtMallocHost(&h, 64), ACL_SUCCESS);
  ASSERT_EQ(aclrtPointerGetAttributes(h, &a), ACL_SUCCESS);
  EXPECT_EQ(a.location.type, ACL_MEM_LOCATION_TYPE_HOST);
  std::vector<char> pageable(64);
  ASSERT_EQ(aclrtPointerGetAttributes(pageable.data(), &a), ACL_SUCCESS);
  EXPECT_EQ(a.location.type, ACL_MEM_LOCATION_TYPE_UNREGISTERED);
  EXPECT_EQ(aclrtPointerGetAttributes(nullptr, &a), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFreeHost(h), ACL_SUCCESS);
}

TEST_P(acl_memory_test, HostRegistration) {
  std::vector<uint32_t> host(256, 0);
  void* dev = nullptr;
  const aclError r = aclrtHostRegister(host.data(), host.size() * 4, ACL_HOST_REGISTER_MAPPED, &dev);
  if (cuda()) {
    EXPECT_EQ(r, ACL_ERROR_RT_FEATURE_NOT_SUPPORT);  // needs the core's host registration
    return;
  }
  ASSERT_EQ(r, ACL_SUCCESS) << aclGetRecentErrMsg();
  EXPECT_EQ(aclrtHostRegister(host.data() + 8, 16, ACL_HOST_REGISTER_MAPPED, &dev),
            ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(aclrtHostRegister(host.data(), 16, ACL_HOST_REGISTER_READONLY, &dev), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtHostRegister(host.data(), 16, static_cast<aclrtHostRegisterType>(3), &dev), ACL_ERROR_INVALID_PARAM);
  void* dp = nullptr;
  ASSERT_EQ(aclrtHostGetDevicePointer(host.data() + 4, &dp, 0), ACL_SUCCESS);
  EXPECT_EQ(dp, host.data() + 4);
  aclrtPtrAttributes a{};
  ASSERT_EQ(aclrtPointerGetAttributes(host.data(), &a), ACL_SUCCESS);
  EXPECT_EQ(a.location.type, ACL_MEM_LOCATION_TYPE_HOST);
  // A kernel writes through the registered range.
  void* flag = dev;
  uint64_t us = 1;
  void* args[] = {&us, &flag};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_EQ(host[0], 1u);
  ASSERT_EQ(aclrtHostUnregister(host.data()), ACL_SUCCESS);
  EXPECT_EQ(aclrtHostUnregister(host.data()), ACL_ERROR_HOST_MEMORY_NOT_REGISTERED);  // twice
  EXPECT_EQ(aclrtHostGetDevicePointer(host.data(), &dp, 0), ACL_ERROR_HOST_MEMORY_NOT_REGISTERED);
  ASSERT_EQ(aclrtHostRegisterV2(host.data(), 64, ACL_HOST_REG_MAPPED), ACL_SUCCESS);
  EXPECT_EQ(aclrtHostUnregister(host.data()), ACL_SUCCESS);
  // Memory of cora's own is not registered again.
  void* pinned = nullptr;
  ASSERT_EQ(aclrtMallocHost(&pinned, 64), ACL_SUCCESS);
  EXPECT_EQ(aclrtHostRegister(pinned, 64, ACL_HOST_REGISTER_MAPPED, &dev), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
}

TEST_P(acl_memory_test, ManagedMemory) {
  void* p = nullptr;
  const aclError r = aclrtMemAllocManaged(&p, 64, 0);
  if (cuda()) {
    EXPECT_EQ(r, ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    return;
  }
  ASSERT_EQ(r, ACL_SUCCESS);
  static_cast<char*>(p)[0] = 7;  // reachable from the host
  aclrtPtrAttributes a{};
  ASSERT_EQ(aclrtPointerGetAttributes(p, &a), ACL_SUCCESS);
  EXPECT_EQ(a.location.type, ACL_MEM_LOCATION_TYPE_MANAGED);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemAllocManaged(&p, 64, 9), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_memory_test, TwoDimensionalCopiesAndD32Fills) {
  // A 4 x 3 block out of a 6-wide host matrix into a 8-pitch device layout and back.
  std::vector<uint8_t> src(6 * 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i);
  void* d = dmalloc(8 * 3);
  ASSERT_EQ(aclrtMemset(d, 24, 0xee, 24), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpy2d(d, 8, src.data(), 6, 4, 3, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  auto back = download<uint8_t>(d, 24);
  for (size_t r = 0; r < 3; ++r)
    for (size_t c = 0; c < 8; ++c) EXPECT_EQ(back[r * 8 + c], c < 4 ? src[r * 6 + c] : 0xee) << r << "," << c;
  std::vector<uint8_t> out(5 * 3, 0);
  ASSERT_EQ(aclrtMemcpy2dAsync(out.data(), 5, d, 8, 4, 3, ACL_MEMCPY_DEVICE_TO_HOST, nullptr), ACL_SUCCESS);
  EXPECT_EQ(out[5 + 3], src[6 + 3]);  // pageable destination: done on return
  EXPECT_EQ(aclrtMemcpy2d(d, 2, src.data(), 6, 4, 3, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(acl_c_memcpy2d(d, 8, src.data(), 6, 4, 3, 42), ACL_ERROR_INVALID_PARAM);
  void* w = dmalloc(4 * 100000);
  ASSERT_EQ(aclrtMemsetD32(w, 4 * 100000, 0xdeadbeef, 100000), ACL_SUCCESS);
  auto words = download<uint32_t>(w, 100000);
  EXPECT_EQ(words.front(), 0xdeadbeefu);
  EXPECT_EQ(words.back(), 0xdeadbeefu);
  ASSERT_EQ(aclrtMemsetD32Async(w, 8, 5, 2, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(w, 3)[1], 5u);
  EXPECT_EQ(download<uint32_t>(w, 3)[2], 0xdeadbeefu);
  EXPECT_EQ(aclrtMemsetD32(w, 7, 1, 2), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_memory_test, BatchCopies) {
  std::vector<uint32_t> a(16, 1), b(32, 2);
  void* da = dmalloc(64);
  void* db = dmalloc(128);
  void* dsts[] = {da, db};
  void* srcs[] = {a.data(), b.data()};
  size_t maxs[] = {64, 128}, sizes[] = {64, 128};
  aclrtMemcpyBatchAttr attr{};
  attr.dstLoc.type = ACL_MEM_LOCATION_TYPE_DEVICE;
  attr.srcLoc.type = ACL_MEM_LOCATION_TYPE_HOST;
  size_t idx[] = {0};
  size_t fail_index = 0;
  ASSERT_EQ(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, &attr, idx, 1, &fail_index), ACL_SUCCESS);
  EXPECT_EQ(fail_index, SIZE_MAX);
  EXPECT_EQ(download<uint32_t>(db, 32)[31], 2u);
  size_t too_big[] = {64, 129};
  EXPECT_EQ(aclrtMemcpyBatch(dsts, maxs, srcs, too_big, 2, &attr, idx, 1, &fail_index), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, nullptr, idx, 1, &fail_index), ACL_ERROR_INVALID_PARAM);
  aclrtMemcpyBatchAttr bad = attr;
  acl_c_set_location_type(&bad.dstLoc, 99);
  EXPECT_EQ(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, &bad, idx, 1, &fail_index), ACL_ERROR_INVALID_PARAM);
  std::vector<uint32_t> ra(16), rb(32);
  void* back_dsts[] = {ra.data(), rb.data()};
  void* back_srcs[] = {da, db};
  ASSERT_EQ(aclrtMemcpyBatchAsync(back_dsts, maxs, back_srcs, sizes, 2, &attr, idx, 1, &fail_index, nullptr),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_EQ(ra[0], 1u);
  EXPECT_EQ(rb[31], 2u);
  std::fill(rb.begin(), rb.end(), 0u);
  ASSERT_EQ(aclrtMemcpyBatchV2(back_dsts, maxs, back_srcs, sizes, 2, &attr, idx, 1), ACL_SUCCESS);
  EXPECT_EQ(rb[31], 2u);
}

// CANN's C++ overloads (acl_rt_api.h) reach the same functions.
TEST_P(acl_memory_test, CppOverloads) {
  float* p = nullptr;
  ASSERT_EQ(aclrtMalloc(&p, 64 * sizeof(float)), ACL_SUCCESS);  // template: HUGE_FIRST, no config
  std::vector<float> host(64, 1.5f), back(64, 0.0f);
  ASSERT_EQ(aclrtMemcpy(p, 64 * sizeof(float), host.data(), 64 * sizeof(float), ACL_MEMCPY_HOST_TO_DEVICE),
            ACL_SUCCESS);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s, 0, ACL_STREAM_FAST_LAUNCH), ACL_SUCCESS);
  aclrtEvent ev = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&ev, ACL_EVENT_SYNC), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpyAsync(back.data(), 64 * sizeof(float), p, 64 * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST, s),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtRecordEvent(ev, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeEvent(ev, 10000), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s, -1), ACL_SUCCESS);
  EXPECT_EQ(back[63], 1.5f);
  EXPECT_EQ(aclrtDestroyEvent(ev), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
}

TEST_P(acl_memory_test, CopiesInEveryDirection) {
  const std::size_t n = 100000;
  std::vector<uint32_t> src(n);
  std::iota(src.begin(), src.end(), 11u);
  void* pinned = nullptr;
  ASSERT_EQ(aclrtMallocHost(&pinned, n * 4), ACL_SUCCESS);
  void* d1 = dmalloc(n * 4);
  void* d2 = dmalloc(n * 4);
  // The kind is only checked for range: the addresses decide, so even a "wrong" kind works.
  ASSERT_EQ(aclrtMemcpy(pinned, n * 4, src.data(), n * 4, ACL_MEMCPY_HOST_TO_HOST), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpy(d1, n * 4, pinned, n * 4, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpy(d2, n * 4, d1, n * 4, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
  std::vector<uint32_t> back(n, 0);
  ASSERT_EQ(aclrtMemcpy(back.data(), n * 4, d2, n * 4, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
  EXPECT_EQ(back, src);
  std::fill(back.begin(), back.end(), 0u);
  ASSERT_EQ(aclrtMemcpy(back.data(), n * 4, d1, n * 4, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  EXPECT_EQ(back, src);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
}

TEST_P(acl_memory_test, CopyMisuse) {
  void* d = dmalloc(256);
  char h[512] = {};
  EXPECT_EQ(aclrtMemcpy(nullptr, 256, h, 256, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMemcpy(d, 256, nullptr, 256, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(acl_c_memcpy(d, 256, h, 256, 8), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(acl_c_memcpy(d, 256, h, 256, -1), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(acl_c_memcpy(d, 256, h, 256, ACL_MEMCPY_INTER_DEVICE_TO_DEVICE), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemcpy(d, 128, h, 256, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);  // > destMax
  EXPECT_EQ(aclrtMemcpy(d, 256, h, 0, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);  // nothing to do
  // Past the end of the allocation, and from freed memory: the core's checks.
  EXPECT_EQ(aclrtMemcpy(d, 512, h, 512, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_RT_PARAM_INVALID);
  void* gone = dmalloc(256);
  ASSERT_EQ(aclrtFree(gone), ACL_SUCCESS);
  if (!cuda()) {  // the CPU device knows its freed addresses; a GPU may reuse them at once
    EXPECT_EQ(aclrtMemcpy(h, 256, gone, 256, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_RT_PARAM_INVALID);
  }
  EXPECT_EQ(acl_c_memcpy_async(d, 256, h, 256, 9, nullptr), ACL_ERROR_INVALID_PARAM);
  int not_a_stream = 0;
  EXPECT_EQ(aclrtMemcpyAsync(d, 256, h, 256, ACL_MEMCPY_HOST_TO_DEVICE, &not_a_stream), ACL_ERROR_RT_INVALID_HANDLE);
  on_thread([&] {
    EXPECT_EQ(aclrtMemcpy(d, 256, h, 256, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_RT_CONTEXT_NULL);
  });
}

TEST_P(acl_memory_test, AsyncCopiesFollowStreamOrder) {
  const std::size_t n = 1 << 16;
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  uint32_t* in = nullptr;
  uint32_t* out = nullptr;
  ASSERT_EQ(aclrtMallocHost(reinterpret_cast<void**>(&in), n * 4), ACL_SUCCESS);
  ASSERT_EQ(aclrtMallocHost(reinterpret_cast<void**>(&out), n * 4), ACL_SUCCESS);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<uint32_t>(i * 3);
  void* d = dmalloc(n * 4);
  ASSERT_EQ(aclrtMemcpyAsync(d, n * 4, in, n * 4, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemsetAsync(d, n * 4, 0xff, 16, s), ACL_SUCCESS);  // first 4 elements
  ASSERT_EQ(aclrtMemcpyAsync(out, n * 4, d, n * 4, ACL_MEMCPY_DEVICE_TO_HOST, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i < 4 ? 0xffffffffu : i * 3) << i;
  EXPECT_EQ(aclrtFreeHost(in), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeHost(out), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_memory_test, AsyncCopyIntoPageableMemoryIsDoneOnReturn) {
  const std::size_t n = 1 << 15;
  std::vector<uint32_t> src(n);
  std::iota(src.begin(), src.end(), 5u);
  void* d = upload(src);
  std::vector<uint32_t> dst(n, 0);  // ordinary (pageable) memory: CANN completes the copy first
  ASSERT_EQ(aclrtMemcpyAsync(dst.data(), n * 4, d, n * 4, ACL_MEMCPY_DEVICE_TO_HOST, nullptr), ACL_SUCCESS);
  EXPECT_EQ(dst, src);
}

TEST_P(acl_memory_test, Memset) {
  void* d = dmalloc(1024);
  ASSERT_EQ(aclrtMemset(d, 1024, 0x3c, 1024), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemset(d, 1024, 0x01, 10), ACL_SUCCESS);
  const auto v = download<uint8_t>(d, 1024);
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], i < 10 ? 0x01 : 0x3c) << i;
  EXPECT_EQ(aclrtMemset(nullptr, 16, 0, 16), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMemset(d, 16, 0, 32), ACL_ERROR_INVALID_PARAM);  // count > maxCount
  EXPECT_EQ(aclrtMemset(d, 16, 0, 0), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemset(d, 4096, 0, 4096), ACL_ERROR_RT_PARAM_INVALID);  // past the allocation
  EXPECT_EQ(aclrtMemsetAsync(d, 16, 0, 32, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMemsetAsync(nullptr, 16, 0, 16, nullptr), ACL_ERROR_INVALID_PARAM);
}

class acl_memory_two_devices : public acl_two_device_test {};
CORA_ACL_SUITE(acl_memory_two_devices);

TEST_P(acl_memory_two_devices, FreeFindsTheOwningDevice) {
  void* p = dmalloc(64);
  ASSERT_EQ(aclrtSetDevice(devices_[1]), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);  // allocated on the first device
  EXPECT_EQ(aclrtFree(p), ACL_ERROR_RT_PARAM_INVALID);
}

}  // namespace
}  // namespace cora::test
