// The C API given what used to crash or wrap: wild host addresses in asynchronous copies,
// fills and raw argument blocks (refused at the call, never queued), and sizes that overflow.
#include <cstdint>
#include <cstring>

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

}  // namespace
}  // namespace cora::test
