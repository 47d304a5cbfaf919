// The C API: capture into model runtime instances (aclmdlRICaptureBegin/End,
// aclmdlRIExecuteAsync, aclmdlRIUpdate, aclmdlRIDestroy).
#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_graph_test : public acl_test {
 protected:
  aclError launch_add(const add_buffers& b, aclrtStream stream) {
    void* x = b.x;
    void* y = b.y;
    void* z = b.z;
    uint64_t n = b.n;
    void* args[] = {&x, &y, &z, &n};
    return aclrtLaunchKernelWithArgsArray(kernel("add_f32"), 4, stream, nullptr, args);
  }
};
CORA_ACL_SUITE(acl_graph_test);

TEST_P(acl_graph_test, CapturedWorkRunsOnlyWhenExecuted) {
  auto b = make_add(4096);
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtMemsetAsync(b.z, b.n * 4, 0x7f, b.n * 4, s), ACL_SUCCESS);
  ASSERT_EQ(launch_add(b, s), ACL_SUCCESS);
  aclmdlRI model = nullptr;
  ASSERT_EQ(aclmdlRICaptureEnd(s, &model), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_EQ(download<float>(b.z, 4)[3], 0.0f) << "capturing ran the work";

  ASSERT_EQ(aclmdlRIExecuteAsync(model, s), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  // Again, on another stream (the default one), after an update.
  ASSERT_EQ(aclrtMemset(b.z, b.n * 4, 0, b.n * 4), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRIUpdate(model), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclmdlRIExecuteAsync(model, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);  // the launch in flight runs to its end
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));

  EXPECT_EQ(aclmdlRIDestroy(model), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclmdlRIExecuteAsync(model, s), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclmdlRIUpdate(model), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclmdlRIDestroy(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

TEST_P(acl_graph_test, CaptureMisuseGivesCannCodes) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  aclmdlRI model = nullptr;
  EXPECT_EQ(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
  ASSERT_EQ(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_RT_STREAM_CAPTURED);
  EXPECT_EQ(aclmdlRICaptureEnd(s, nullptr), ACL_ERROR_INVALID_PARAM);
  // A synchronization cannot be captured: it abandons the capture.
  EXPECT_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(aclmdlRICaptureEnd(s, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("synchronize"), std::string::npos) << aclGetRecentErrMsg();
  EXPECT_EQ(model, nullptr);
  // The stream works normally afterwards.
  auto b = make_add(256);
  ASSERT_EQ(launch_add(b, s), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  EXPECT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
}

}  // namespace
}  // namespace cora::test
