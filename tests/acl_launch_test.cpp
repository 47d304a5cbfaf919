// The C API: the five launch calls and aclrtLaunchKernelCfg.
#include "support/acl_c_api.h"
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_launch_test : public acl_test {
 protected:
  aclrtLaunchKernelAttr attr(aclrtLaunchKernelAttrId id) {
    aclrtLaunchKernelAttr a{};
    a.id = id;
    return a;
  }
  // Launches add_f32 through the args-array call with `cfg`.
  aclError launch_add(const add_buffers& b, aclrtLaunchKernelCfg* cfg, uint32_t blocks = 2) {
    void* x = b.x;
    void* y = b.y;
    void* z = b.z;
    uint64_t n = b.n;
    void* args[] = {&x, &y, &z, &n};
    return aclrtLaunchKernelWithArgsArray(kernel("add_f32"), blocks, nullptr, cfg, args);
  }
  unsigned compute_units() {
    auto& st = cora::acl::state::get();
    std::lock_guard lock(st.mutex);
    return st.runtime->device(static_cast<std::size_t>(dev_)).properties().compute_units;
  }
};
CORA_ACL_SUITE(acl_launch_test);

TEST_P(acl_launch_test, WithArgsArray) {
  auto b = make_add(10000);
  ASSERT_EQ(launch_add(b, nullptr, 8), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 1, nullptr, nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
  void* args[] = {nullptr};
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(kernel("empty"), 1, nullptr, nullptr, nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(kernel("empty"), 1, nullptr, nullptr, args), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

TEST_P(acl_launch_test, WithHostArgs) {
  auto b = make_add(4096);
  void* block[] = {b.x, b.y, b.z, reinterpret_cast<void*>(b.n)};  // CANN's void* args[] as is
  ASSERT_EQ(aclrtLaunchKernelWithHostArgs(kernel("add_f32"), 4, nullptr, nullptr, block, sizeof(block), nullptr, 0),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  aclrtFuncHandle add = kernel("add_f32");
  EXPECT_EQ(aclrtLaunchKernelWithHostArgs(add, 4, nullptr, nullptr, nullptr, 32, nullptr, 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelWithHostArgs(add, 4, nullptr, nullptr, block, 32, nullptr, 1), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelWithHostArgs(add, 4, nullptr, nullptr, block, 24, nullptr, 0),
            ACL_ERROR_RT_PARAM_INVALID);  // a block of the wrong size
}

TEST_P(acl_launch_test, WithHostArgsAndPlaceholders) {
  // add_custom(x, y, z, int32* total, int32* tiles): slots 3 and 4 point at data in the block.
  aclrtFuncHandle f = function(load("add_custom_tiling.corabin"), "add_custom");
  const std::size_t n = 8 * 2048;
  std::vector<uint16_t> x(n), y(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = cora::half(static_cast<float>(i % 50)).bits;
    y[i] = cora::half(2.0f).bits;
  }
  void* dx = upload(x);
  void* dy = upload(y);
  void* dz = dmalloc(n * 2);
  struct {
    void* ptrs[5];
    int32_t total;
    int32_t pad;
    int32_t tiles;
  } block{{dx, dy, dz, nullptr, nullptr}, static_cast<int32_t>(n), 0, 8};
  aclrtPlaceHolderInfo phs[] = {{24, 40}, {32, 48}};
  ASSERT_EQ(aclrtLaunchKernelWithHostArgs(f, 8, nullptr, nullptr, &block, sizeof(block), phs, 2), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  const auto z = download<uint16_t>(dz, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(float(cora::half::from_bits(z[i])), (i % 50) + 2.0f) << i;
  aclrtPlaceHolderInfo bad[] = {{8 * 7, 40}};  // no parameter there
  EXPECT_EQ(aclrtLaunchKernelWithHostArgs(f, 8, nullptr, nullptr, &block, sizeof(block), bad, 1),
            ACL_ERROR_RT_PARAM_INVALID);
  aclrtPlaceHolderInfo outside[] = {{24, 4096}};  // data past the block
  EXPECT_EQ(aclrtLaunchKernelWithHostArgs(f, 8, nullptr, nullptr, &block, sizeof(block), outside, 1),
            ACL_ERROR_RT_PARAM_INVALID);
}

TEST_P(acl_launch_test, WithConfigReserveMustBeNull) {
  auto b = make_add(16);
  aclrtArgsHandle args = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(kernel("add_f32"), &args), ACL_SUCCESS);
  aclrtParamHandle ph = nullptr;
  for (void** p : {&b.x, &b.y, &b.z}) ASSERT_EQ(aclrtKernelArgsAppend(args, p, 8, &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &b.n, 8, &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  int reserve = 0;
  aclrtFuncHandle add = kernel("add_f32");
  EXPECT_EQ(aclrtLaunchKernelWithConfig(add, 1, nullptr, nullptr, args, &reserve), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelWithConfig(add, 1, nullptr, nullptr, nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelWithConfig(add, 0, nullptr, nullptr, args, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelWithConfig(nullptr, 1, nullptr, nullptr, args, nullptr), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclrtLaunchKernelWithConfig(add, 1, nullptr, nullptr, args, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
}

TEST_P(acl_launch_test, DeviceResidentArgs) {
  auto b = make_add(2048);
  void* block[] = {b.x, b.y, b.z, reinterpret_cast<void*>(b.n)};
  void* dblock = dmalloc(sizeof(block));
  ASSERT_EQ(aclrtMemcpy(dblock, sizeof(block), block, sizeof(block), ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  aclrtFuncHandle add = kernel("add_f32");
  const aclError e1 = aclrtLaunchKernel(add, 2, dblock, sizeof(block), nullptr);
  aclrtLaunchKernelAttr a = attr(ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE);
  aclrtLaunchKernelCfg cfg{&a, 1};
  const aclError e2 = aclrtLaunchKernelV2(add, 2, dblock, sizeof(block), &cfg, nullptr);
  if (cuda()) {
    // A GPU launch takes its parameters from the host: refused, never faked.
    EXPECT_EQ(e1, ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_EQ(e2, ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  } else {
    ASSERT_EQ(e1, ACL_SUCCESS) << aclGetRecentErrMsg();
    ASSERT_EQ(e2, ACL_SUCCESS) << aclGetRecentErrMsg();
    ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
    EXPECT_TRUE(add_done(b));
  }
  EXPECT_EQ(aclrtLaunchKernel(add, 2, nullptr, sizeof(block), nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernel(add, 0, dblock, sizeof(block), nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelV2(nullptr, 2, dblock, sizeof(block), nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernel(add, 2, dblock, 16, nullptr), ACL_ERROR_RT_PARAM_INVALID);  // wrong size
  if (!cuda()) {
    void* host_block = block;  // not device memory
    EXPECT_EQ(aclrtLaunchKernel(add, 2, host_block, sizeof(block), nullptr), ACL_ERROR_RT_PARAM_INVALID);
  }
}

TEST_P(acl_launch_test, CommonMisuse) {
  auto b = make_add(16);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  aclrtFuncHandle add = kernel("add_f32");
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(nullptr, 1, nullptr, nullptr, args), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(add, 0, nullptr, nullptr, args), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchKernelWithHostArgs(add, 0, nullptr, nullptr, args, sizeof(args), nullptr, 0),
            ACL_ERROR_INVALID_PARAM);
  int bogus = 0;
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(&bogus, 1, nullptr, nullptr, args), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(add, 1, &bogus, nullptr, args), ACL_ERROR_RT_INVALID_HANDLE);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(add, 1, s, nullptr, args), ACL_ERROR_RT_INVALID_HANDLE);
  // Nothing failed on the device: the stream has no fault to report.
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

TEST_P(acl_launch_test, ConfigAttributes) {
  auto b = make_add(1024);
  aclrtLaunchKernelAttr attrs[2];
  aclrtLaunchKernelCfg cfg{attrs, 1};
  // Honoured: normal and batch scheduling, timeouts, the AIC engine, zero-valued switches. The
  // CPU device honours them all; a GPU backend honours the schedule and timeouts or refuses
  // them, never drops them.
  const auto honoured = [&](aclError e) {
    return e == ACL_SUCCESS || (cuda() && e == ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  };
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE);
  attrs[0].value.schemMode = 1;
  EXPECT_PRED1(honoured, launch_add(b, &cfg, 1));
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT);
  attrs[0].value.timeout = 30;
  EXPECT_PRED1(honoured, launch_add(b, &cfg));
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US);
  attrs[0].value.timeoutUs = {30000000, 0};
  EXPECT_PRED1(honoured, launch_add(b, &cfg));
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE);
  attrs[0].value.schemMode = 0;
  EXPECT_EQ(launch_add(b, &cfg), ACL_SUCCESS);
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE);
  attrs[0].value.engineType = ACL_RT_ENGINE_TYPE_AIC;
  EXPECT_EQ(launch_add(b, &cfg), ACL_SUCCESS);
  for (auto id : {ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH, ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP,
                  ACL_RT_LAUNCH_KERNEL_ATTR_ENABLE_PROFILING, ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET}) {
    attrs[0] = attr(id);
    EXPECT_EQ(launch_add(b, &cfg), ACL_SUCCESS) << id;  // off
  }
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));

  // Not honourable: refused.
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE);
  attrs[0].value.engineType = ACL_RT_ENGINE_TYPE_AIV;
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  acl_c_set_engine_type(&attrs[0], 7);  // no such engine either
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET);
  attrs[0].value.blockDimOffset = 4;
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH);
  attrs[0].value.isBlockTaskPrefetch = 1;
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP);
  attrs[0].value.isDataDump = 1;
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_ENABLE_PROFILING);
  attrs[0].value.enableProfiling = 1;
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  // Dynamic unified buffer: a GPU's dynamic shared memory; the CPU device has none.
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE);
  attrs[0].value.dynUBufSize = 1024;
  EXPECT_EQ(launch_add(b, &cfg), cuda() ? ACL_SUCCESS : ACL_ERROR_RT_FEATURE_NOT_SUPPORT);

  // Malformed.
  attrs[0] = aclrtLaunchKernelAttr{};
  acl_c_set_attr_id(&attrs[0], 42);
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_INVALID_PARAM);
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE);
  attrs[0].value.schemMode = 2;
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_INVALID_PARAM);
  attrs[0] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT);
  attrs[1] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US);
  cfg.numAttrs = 2;
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_INVALID_PARAM);  // cannot be combined
  attrs[1] = attr(ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT);
  EXPECT_EQ(launch_add(b, &cfg), ACL_ERROR_INVALID_PARAM);  // twice
  aclrtLaunchKernelCfg no_attrs{nullptr, 1};
  EXPECT_EQ(launch_add(b, &no_attrs), ACL_ERROR_INVALID_PARAM);
  aclrtLaunchKernelCfg empty{nullptr, 0};
  EXPECT_EQ(launch_add(b, &empty), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

TEST_P(acl_launch_test, BatchModeNeedsEveryBlockResident) {
  if (cuda()) GTEST_SKIP() << "residency limits are the GPU's own";
  auto b = make_add(64);
  aclrtLaunchKernelAttr a = attr(ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE);
  a.value.schemMode = 1;
  aclrtLaunchKernelCfg cfg{&a, 1};
  EXPECT_EQ(launch_add(b, &cfg, compute_units() + 1), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(launch_add(b, &cfg, compute_units()), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

TEST_P(acl_launch_test, TimeoutAttributeStopsALongKernel) {
  if (cuda()) GTEST_SKIP() << "GPU kernel timeouts are the CUDA backend's (see docs/acl-compat.md)";
  void* flag = dmalloc(4);
  ASSERT_EQ(aclrtMemset(flag, 4, 0, 4), ACL_SUCCESS);
  uint64_t us = 10000000;  // 10 s, stopped after 1 ms
  void* args[] = {&us, &flag};
  aclrtLaunchKernelAttr a = attr(ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US);
  a.value.timeoutUs = {1000, 0};
  aclrtLaunchKernelCfg cfg{&a, 1};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("slow"), 1, nullptr, &cfg, args), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_AICORE_TIMEOUT);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 0u);
}

TEST_P(acl_launch_test, KernelFaultSurfacesAtTheNextSynchronize) {
  isolated_fault([&] {
    void* out = dmalloc(64);
    aclrtFuncHandle empty = kernel("empty");
    void* args[] = {&out};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("trap"), 1, nullptr, nullptr, args), ACL_SUCCESS);  // async
    EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_AICORE_EXCEPTION);
    EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);  // reported once
    // The CPU device goes on; a GPU is lost, and new work fails at once.
    EXPECT_EQ(aclrtLaunchKernelWithArgsArray(empty, 1, nullptr, nullptr, nullptr),
              cuda() ? ACL_ERROR_RT_LOST_HEARTBEAT : ACL_SUCCESS);
    EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  });
}

class acl_launch_two_devices : public acl_two_device_test {};
CORA_ACL_SUITE(acl_launch_two_devices);

TEST_P(acl_launch_two_devices, FunctionOfAnotherDeviceIsRefused) {
  aclrtBinHandle bin = nullptr;
  ASSERT_EQ(aclrtBinaryLoadFromFile(kernel_file("test_kernels.corabin").c_str(), nullptr, &bin), ACL_SUCCESS);
  aclrtFuncHandle f = nullptr;
  ASSERT_EQ(aclrtBinaryGetFunction(bin, "empty", &f), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(devices_[1]), ACL_SUCCESS);
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(f, 1, nullptr, nullptr, nullptr), ACL_ERROR_RT_STREAM_CONTEXT);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

}  // namespace
}  // namespace cora::test
