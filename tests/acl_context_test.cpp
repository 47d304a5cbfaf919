// The C API: contexts, the per-thread current context and device.
#include <atomic>
#include <utility>

#include "support/acl_c_api.h"
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_context_test : public acl_test {};
CORA_ACL_SUITE(acl_context_test);

TEST_P(acl_context_test, SetDeviceGivesTheDefaultContext) {
  aclrtContext def = nullptr;
  ASSERT_EQ(aclrtGetCurrentContext(&def), ACL_SUCCESS);
  ASSERT_NE(def, nullptr);
  aclrtContext again = nullptr;
  ASSERT_EQ(aclrtGetCurrentContext(&again), ACL_SUCCESS);
  EXPECT_EQ(again, def);
  // The default context is released by aclrtResetDevice, never destroyed.
  EXPECT_EQ(aclrtDestroyContext(def), ACL_ERROR_INVALID_PARAM);
  uint32_t flags = 7;
  int32_t active = 0;
  ASSERT_EQ(aclrtGetPrimaryCtxState(dev_, &flags, &active), ACL_SUCCESS);
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(active, 1);
}

TEST_P(acl_context_test, CreatedContextIsCurrentAndHasItsOwnDefaultStream) {
  aclrtContext def = nullptr;
  ASSERT_EQ(aclrtGetCurrentContext(&def), ACL_SUCCESS);
  aclrtStream def_stream = nullptr;
  ASSERT_EQ(aclrtCtxGetCurrentDefaultStream(&def_stream), ACL_SUCCESS);
  aclrtContext ctx = nullptr;
  ASSERT_EQ(aclrtCreateContext(&ctx, dev_), ACL_SUCCESS);
  aclrtContext cur = nullptr;
  ASSERT_EQ(aclrtGetCurrentContext(&cur), ACL_SUCCESS);
  EXPECT_EQ(cur, ctx);
  int32_t d = -1;
  ASSERT_EQ(aclrtGetDevice(&d), ACL_SUCCESS);
  EXPECT_EQ(d, dev_);
  aclrtStream ctx_stream = nullptr;
  ASSERT_EQ(aclrtCtxGetCurrentDefaultStream(&ctx_stream), ACL_SUCCESS);
  EXPECT_NE(ctx_stream, def_stream);
  // Work on the context's default stream (NULL, and the handle itself).
  auto b = make_add(1024);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 2, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(ctx_stream), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  // Back to the default context, then destroy the created one.
  ASSERT_EQ(aclrtSetCurrentContext(def), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetCurrentContext(&cur), ACL_SUCCESS);
  EXPECT_EQ(cur, def);
  ASSERT_EQ(aclrtDestroyContext(ctx), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyContext(ctx), ACL_ERROR_RT_CONTEXT_NULL);   // twice
  EXPECT_EQ(aclrtSetCurrentContext(ctx), ACL_ERROR_RT_CONTEXT_NULL);  // destroyed
  EXPECT_EQ(aclrtSynchronizeStream(ctx_stream), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_context_test, Misuse) {
  EXPECT_EQ(aclrtCreateContext(nullptr, dev_), ACL_ERROR_INVALID_PARAM);
  aclrtContext ctx = nullptr;
  EXPECT_EQ(aclrtCreateContext(&ctx, 1000), ACL_ERROR_RT_INVALID_DEVICEID);
  EXPECT_EQ(aclrtCreateContext(&ctx, -1), ACL_ERROR_RT_INVALID_DEVICEID);
  EXPECT_EQ(aclrtDestroyContext(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtSetCurrentContext(nullptr), ACL_ERROR_INVALID_PARAM);
  int not_a_context = 0;
  EXPECT_EQ(aclrtSetCurrentContext(&not_a_context), ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(aclrtGetCurrentContext(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtCtxGetCurrentDefaultStream(nullptr), ACL_ERROR_INVALID_PARAM);
  // The thread's context destroyed: the thread has none.
  ASSERT_EQ(aclrtCreateContext(&ctx, dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyContext(ctx), ACL_SUCCESS);
  aclrtContext cur = nullptr;
  EXPECT_EQ(aclrtGetCurrentContext(&cur), ACL_ERROR_RT_CONTEXT_NULL);
  aclrtStream s = nullptr;
  EXPECT_EQ(aclrtCreateStream(&s), ACL_ERROR_RT_CONTEXT_NULL);
  ASSERT_NE(aclGetRecentErrMsg(), nullptr);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  EXPECT_EQ(aclrtGetCurrentContext(&cur), ACL_SUCCESS);
}

TEST_P(acl_context_test, CurrentContextIsPerThread) {
  aclrtContext a = nullptr, b = nullptr;
  ASSERT_EQ(aclrtCreateContext(&a, dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateContext(&b, dev_), ACL_SUCCESS);  // now current here
  aclrtContext seen_before = nullptr, seen_after = nullptr;
  aclError before = ACL_SUCCESS;
  on_thread([&] {
    // A new thread has no context until it sets one.
    before = aclrtGetCurrentContext(&seen_before);
    EXPECT_EQ(aclrtSetCurrentContext(a), ACL_SUCCESS);
    EXPECT_EQ(aclrtGetCurrentContext(&seen_after), ACL_SUCCESS);
    // A stream made here belongs to context a and works from here.
    aclrtStream s = nullptr;
    EXPECT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
    EXPECT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
    EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  });
  EXPECT_EQ(before, ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(seen_after, a);
  aclrtContext mine = nullptr;
  ASSERT_EQ(aclrtGetCurrentContext(&mine), ACL_SUCCESS);
  EXPECT_EQ(mine, b);  // the other thread's choice did not change this one's
  // Destroying a context releases the streams made in it.
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyContext(b), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_INVALID_HANDLE);
  ASSERT_EQ(aclrtDestroyContext(a), ACL_SUCCESS);
}

TEST_P(acl_context_test, TwoContextsOnOneDeviceRunIndependently) {
  aclrtContext a = nullptr, b = nullptr;
  ASSERT_EQ(aclrtCreateContext(&a, dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateContext(&b, dev_), ACL_SUCCESS);
  auto ba = make_add(512), bb = make_add(2048);
  std::atomic<int> ok{0};
  auto run = [&](aclrtContext c, add_buffers& buf) {
    ASSERT_EQ(aclrtSetCurrentContext(c), ACL_SUCCESS);
    aclrtStream s = nullptr;
    ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
    void* args[] = {&buf.x, &buf.y, &buf.z, &buf.n};
    ASSERT_EQ(aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 4, s, nullptr, args), ACL_SUCCESS);
    ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
    ASSERT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
    ++ok;
  };
  (void)kernel("add_f32");  // loads the binary once, on this thread
  std::thread t1([&] { run(a, ba); }), t2([&] { run(b, bb); });
  t1.join();
  t2.join();
  EXPECT_EQ(ok.load(), 2);
  EXPECT_TRUE(add_done(ba));
  EXPECT_TRUE(add_done(bb));
  EXPECT_EQ(aclrtDestroyContext(a), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyContext(b), ACL_SUCCESS);
}

TEST_P(acl_context_test, ResetDeviceReleasesItsContexts) {
  aclrtContext ctx = nullptr;
  ASSERT_EQ(aclrtCreateContext(&ctx, dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetCurrentContext(ctx), ACL_ERROR_RT_CONTEXT_NULL);
  uint32_t flags = 0;
  int32_t active = 1;
  ASSERT_EQ(aclrtGetPrimaryCtxState(dev_, &flags, &active), ACL_SUCCESS);
  EXPECT_EQ(active, 0);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
}

TEST_P(acl_context_test, SetDeviceIsReferenceCounted) {
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);  // two references now
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  aclrtContext cur = nullptr;
  EXPECT_EQ(aclrtGetCurrentContext(&cur), ACL_SUCCESS);  // one left: still set
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  EXPECT_EQ(aclrtGetCurrentContext(&cur), ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(aclrtResetDevice(dev_), ACL_ERROR_RT_CONTEXT_NULL);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtResetDeviceForce(dev_), ACL_SUCCESS);  // all references at once
  EXPECT_EQ(aclrtGetCurrentContext(&cur), ACL_ERROR_RT_CONTEXT_NULL);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
}

TEST_P(acl_context_test, SystemParameters) {
  int64_t v = 0;
  // System parameters are process-wide: only the first instance of this test sees one unset.
  static bool set_before = false;
  if (!std::exchange(set_before, true)) {
    EXPECT_EQ(aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC, &v), ACL_ERROR_RT_PARAM_INVALID);
  }
  ASSERT_EQ(aclrtSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC, &v), ACL_SUCCESS);
  EXPECT_EQ(v, 1);
  ASSERT_EQ(aclrtCtxSetSysParamOpt(ACL_OPT_ENABLE_DEBUG_KERNEL, 0), ACL_SUCCESS);
  ASSERT_EQ(aclrtCtxGetSysParamOpt(ACL_OPT_ENABLE_DEBUG_KERNEL, &v), ACL_SUCCESS);
  EXPECT_EQ(v, 0);
  EXPECT_EQ(acl_c_set_sys_param_opt(99, 1), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC, nullptr), ACL_ERROR_INVALID_PARAM);
}

}  // namespace
}  // namespace cora::test
