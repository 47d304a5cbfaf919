// The C API given what used to crash or wrap: wild host addresses in asynchronous copies,
// fills and raw argument blocks (refused at the call, never queued), and sizes that overflow.
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_hardening_test : public acl_test {};
CORA_ACL_SUITE(acl_hardening_test);

void* const wild = reinterpret_cast<void*>(0x1000);

TEST_P(acl_hardening_test, AsyncCopiesAndFillsWithAWildHostAddressAreRefused) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  void* d = dmalloc(4096);
  EXPECT_EQ(aclrtMemcpyAsync(d, 4096, wild, 64, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtMemcpyAsync(wild, 64, d, 64, ACL_MEMCPY_DEVICE_TO_HOST, s), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtMemsetAsync(wild, 64, 0, 64, s), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtMemcpy(d, 4096, wild, 64, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_RT_PARAM_INVALID);
  // The stream, and the process, carry on.
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  std::vector<std::uint8_t> in(64, 9);
  EXPECT_EQ(aclrtMemcpyAsync(d, 4096, in.data(), 64, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(download<std::uint8_t>(d, 64), in);
  EXPECT_EQ(aclrtFree(d), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_hardening_test, HostArgsWithAGarbagePointerAreRefused) {
  auto* add = kernel("add_f32");
  std::size_t count = 0;
  ASSERT_EQ(aclrtFunctionGetParamCount(add, &count), ACL_SUCCESS);
  ASSERT_EQ(count, 4u);
  void* y = dmalloc(64);
  void* z = dmalloc(64);
  struct {
    const void* x;
    const void* y;
    void* z;
    std::uint64_t n;
  } block{reinterpret_cast<void*>(0xdead00000000), y, z, 16};
  const aclError r =
      aclrtLaunchKernelWithHostArgs(add, 1, nullptr, nullptr, &block, sizeof(block), nullptr, 0);
  if (cuda() && r == ACL_SUCCESS) GTEST_SKIP() << "this backend's images do not mark pointers";
  EXPECT_EQ(r, ACL_ERROR_RT_PARAM_INVALID);
  block.x = y;
  ASSERT_EQ(aclrtLaunchKernelWithHostArgs(add, 1, nullptr, nullptr, &block, sizeof(block), nullptr, 0),
            ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(y), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(z), ACL_SUCCESS);
}

TEST_P(acl_hardening_test, SizesThatOverflowAreRefused) {
  void* p = nullptr;
  EXPECT_EQ(aclrtMallocHost(&p, SIZE_MAX), ACL_ERROR_RT_MEMORY_ALLOCATION);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(aclrtMallocHost(&p, SIZE_MAX - 62), ACL_ERROR_RT_MEMORY_ALLOCATION);
  std::size_t n = 0;
  EXPECT_EQ(aclrtKernelArgsGetMemSize(kernel("add_f32"), SIZE_MAX - 8, &n), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(n, 0u);
}

// Every enum parameter of the C API is checked against CANN's enum: a value outside it is
// ACL_ERROR_INVALID_PARAM, whatever the call, and changes nothing.
TEST_P(acl_hardening_test, EveryEnumParameterRefusesAValueOutsideItsEnum) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  void* d = dmalloc(64);
  std::vector<std::uint8_t> h(64, 1);
  int64_t v64 = 0;
  int32_t v32 = 0;
  uint32_t u32 = 0;
  std::size_t free_bytes = 0, total_bytes = 0;
  constexpr int bad = 0x7ffe;
  struct call {
    const char* what;
    aclError got;
  };
  aclrtStreamAttrValue attr_value{};
  aclCANNPackageVersion version{};
  void* dev_ptr = nullptr;
  void* managed = nullptr;
  aclrtStreamConfigHandle* config = aclrtCreateStreamConfigHandle();
  ASSERT_NE(config, nullptr);
  std::uint32_t option = 0;
  aclrtLaunchKernelAttr launch_attr{};
  launch_attr.id = static_cast<aclrtLaunchKernelAttrId>(bad);
  aclrtLaunchKernelCfg launch_cfg{&launch_attr, 1};
  aclrtArgsHandle args = nullptr;
  auto* empty = kernel("empty");
  ASSERT_EQ(aclrtKernelArgsInit(empty, &args), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  // CANN deprecates aclsysGetCANNVersion but still exports it, so it is checked too. The values
  // outside the enums, which a C caller may pass, go straight into the calls: no enum object of
  // the test holds one (UBSan checks such loads).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const aclError cann_version = aclsysGetCANNVersion(static_cast<aclCANNPackageName>(bad), &version);
#pragma GCC diagnostic pop
  const call calls[] = {
      {"aclrtMalloc policy", aclrtMalloc(&dev_ptr, 64, static_cast<aclrtMemMallocPolicy>(bad))},
      {"aclrtMemcpy kind", aclrtMemcpy(d, 64, h.data(), 64, static_cast<aclrtMemcpyKind>(bad))},
      {"aclrtMemcpyAsync kind", aclrtMemcpyAsync(d, 64, h.data(), 64, static_cast<aclrtMemcpyKind>(bad), s)},
      {"aclrtGetMemInfo attr", aclrtGetMemInfo(static_cast<aclrtMemAttr>(bad), &free_bytes, &total_bytes)},
      {"aclrtHostRegister type",
       aclrtHostRegister(h.data(), h.size(), static_cast<aclrtHostRegisterType>(bad), &dev_ptr)},
      {"aclrtMemAllocManaged flag", aclrtMemAllocManaged(&managed, 64, static_cast<uint32_t>(bad))},
      {"aclrtGetFunctionAttribute attr",
       aclrtGetFunctionAttribute(empty, static_cast<aclrtFuncAttribute>(bad), &v64)},
      {"aclrtLaunchCallback block type",
       aclrtLaunchCallback([](void*) {}, nullptr, static_cast<aclrtCallbackBlockType>(bad), s)},
      {"aclrtCtxSetSysParamOpt opt", aclrtCtxSetSysParamOpt(static_cast<aclSysParamOpt>(bad), 0)},
      {"aclmdlRICaptureBegin mode", aclmdlRICaptureBegin(s, static_cast<aclmdlRICaptureMode>(bad))},
      {"aclrtLaunchKernelWithConfig attribute id",
       aclrtLaunchKernelWithConfig(empty, 1, s, &launch_cfg, args, nullptr)},
      {"aclsysGetCANNVersion name", cann_version},
      {"aclrtGetDeviceInfo attr", aclrtGetDeviceInfo(static_cast<uint32_t>(dev_), static_cast<aclrtDevAttr>(bad), &v64)},
      {"aclGetDeviceCapability info",
       aclGetDeviceCapability(static_cast<uint32_t>(dev_), static_cast<aclDeviceInfo>(bad), &v64)},
      {"aclrtGetDeviceCapability feature",
       aclrtGetDeviceCapability(dev_, static_cast<aclrtDevFeatureType>(bad), &v32)},
      {"aclrtGetDeviceResLimit type", aclrtGetDeviceResLimit(dev_, static_cast<aclrtDevResLimitType>(bad), &u32)},
      {"aclrtSetDeviceResLimit type", aclrtSetDeviceResLimit(dev_, static_cast<aclrtDevResLimitType>(bad), 1)},
      {"aclGetCannAttribute attr", aclGetCannAttribute(static_cast<aclCannAttr>(bad), &v32)},
      {"aclrtSetStreamAttribute attr", aclrtSetStreamAttribute(s, static_cast<aclrtStreamAttr>(bad), &attr_value)},
      {"aclrtGetStreamAttribute attr", aclrtGetStreamAttribute(s, static_cast<aclrtStreamAttr>(bad), &attr_value)},
      {"aclrtSetStreamConfigOpt attr",
       aclrtSetStreamConfigOpt(config, static_cast<aclrtStreamConfigAttr>(bad), &option, sizeof(option))},
  };
  for (const call& c : calls) EXPECT_EQ(c.got, ACL_ERROR_INVALID_PARAM) << c.what;
  EXPECT_EQ(aclDataTypeSize(static_cast<aclDataType>(bad)), 0u);
  // Nothing was made or enqueued: the stream is idle and still works.
  EXPECT_EQ(managed, nullptr);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemcpyAsync(d, 64, h.data(), 64, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStreamConfigHandle(config), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(d), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

}  // namespace
}  // namespace cora::test
