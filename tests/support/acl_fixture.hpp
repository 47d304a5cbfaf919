// Test support for the CANN-compatible C API: each test initializes the API, binds a device of
// the backend under test (CUDA instances skip without a GPU) and finalizes at the end.
#pragma once

#include <gtest/gtest.h>

#include <acl/acl.h>
#include <acl/cora_acl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl_state.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {

/// The C API's device indices of backend `b` (after aclInit).
inline std::vector<int32_t> acl_devices_of(backend b) {
  std::vector<int32_t> out;
  auto& st = cora::acl::state::get();
  std::lock_guard lock(st.mutex);
  if (!st.runtime) return out;
  for (std::size_t i = 0; i < st.runtime->device_count(); ++i)
    if ((st.runtime->device(i).backend() == backend_kind::cuda) == (b == backend::cuda))
      out.push_back(static_cast<int32_t>(i));
  return out;
}

/// What the C API's runtime says of a backend (why it has no device), for test messages.
inline std::string acl_backend_detail(backend b) {
  auto& st = cora::acl::state::get();
  std::lock_guard lock(st.mutex);
  if (!st.runtime) return "the C API has no runtime";
  for (const auto& s : st.runtime->backends())
    if (s.name == (b == backend::cpu ? "cpu" : "cuda")) return s.name + ": " + s.detail;
  return "no such backend in the runtime";
}

/// The bytes of a file of the build's kernel directory.
inline std::vector<char> kernel_bytes(const std::string& name) {
  std::ifstream f(kernel_file(name), std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// Runs `f` on a new thread and waits for it.
template <class F>
void on_thread(F&& f) {
  std::thread t(std::forward<F>(f));
  t.join();
}

class acl_test : public ::testing::TestWithParam<backend> {
 protected:
  /// CPU devices the runtime models (more than one for cross-device tests).
  virtual unsigned cpu_devices() const { return 1; }

  void SetUp() override {
    ::setenv("CORA_CPU_DEVICES", std::to_string(cpu_devices()).c_str(), 1);
    ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
    devices_ = acl_devices_of(GetParam());
    if (devices_.empty()) CORA_NO_DEVICE(GetParam(), acl_backend_detail(GetParam()));
    dev_ = devices_.front();
    ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  }
  void TearDown() override { (void)aclFinalize(); }

  bool cuda() const { return GetParam() == backend::cuda; }

  /// Runs `scenario`, which faults a kernel, where the fault cannot harm later tests: inline on
  /// the CPU device, in a child process on a GPU (a fault loses a CUDA context for the whole
  /// process; docs/cuda.md). After a fault the CPU device goes on, a GPU stays lost.
  template <class F>
  void isolated_fault(F&& scenario) {
    if (!cuda()) {
      scenario();
      return;
    }
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
          scenario();
          std::fflush(stdout);
          std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
        },
        ::testing::ExitedWithCode(0), "");
  }

  /// test_kernels.corabin (or another binary of the build) on the current device.
  aclrtBinHandle load(const std::string& name = "test_kernels.corabin") {
    aclrtBinHandle bin = nullptr;
    EXPECT_EQ(aclrtBinaryLoadFromFile(kernel_file(name).c_str(), nullptr, &bin), ACL_SUCCESS) << aclGetRecentErrMsg();
    return bin;
  }
  aclrtFuncHandle function(aclrtBinHandle bin, const char* name) {
    aclrtFuncHandle f = nullptr;
    EXPECT_EQ(aclrtBinaryGetFunction(bin, name, &f), ACL_SUCCESS) << aclGetRecentErrMsg();
    return f;
  }
  /// Shortcut: a function of test_kernels.corabin (loaded once per test).
  aclrtFuncHandle kernel(const char* name) {
    if (!kernels_) kernels_ = load();
    return function(kernels_, name);
  }

  void* dmalloc(std::size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS) << aclGetRecentErrMsg();
    return p;
  }
  template <class T>
  void* upload(const std::vector<T>& v) {
    void* d = dmalloc(v.size() * sizeof(T));
    EXPECT_EQ(aclrtMemcpy(d, v.size() * sizeof(T), v.data(), v.size() * sizeof(T), ACL_MEMCPY_HOST_TO_DEVICE),
              ACL_SUCCESS)
        << aclGetRecentErrMsg();
    return d;
  }
  template <class T>
  std::vector<T> download(const void* d, std::size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(aclrtMemcpy(v.data(), n * sizeof(T), d, n * sizeof(T), ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS)
        << aclGetRecentErrMsg();
    return v;
  }

  /// Inputs of add_f32: x[i] = i, y[i] = 2i; z is zeroed.
  struct add_buffers {
    void* x;
    void* y;
    void* z;
    std::uint64_t n;
  };
  add_buffers make_add(std::uint64_t n) {
    std::vector<float> x(n), y(n), z(n, 0.0f);
    for (std::uint64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i);
      y[i] = 2.0f * static_cast<float>(i);
    }
    return {upload(x), upload(y), upload(z), n};
  }
  /// True when z = x + y everywhere.
  bool add_done(const add_buffers& b) {
    const auto z = download<float>(b.z, b.n);
    for (std::uint64_t i = 0; i < b.n; ++i)
      if (z[i] != 3.0f * static_cast<float>(i)) return false;
    return true;
  }

  std::vector<int32_t> devices_;
  int32_t dev_ = -1;
  aclrtBinHandle kernels_ = nullptr;
};

/// A fixture whose runtime has two CPU devices (cross-device misuse).
class acl_two_device_test : public acl_test {
 protected:
  unsigned cpu_devices() const override { return 2; }
  void SetUp() override {
    acl_test::SetUp();
    if (IsSkipped()) return;
    if (devices_.size() < 2) GTEST_SKIP() << "needs two devices of the backend";
  }
};

#define CORA_ACL_SUITE(suite)                                                              \
  INSTANTIATE_TEST_SUITE_P(backends, suite,                                                \
                           ::testing::Values(::cora::test::backend::cpu,                   \
                                             ::cora::test::backend::cuda),                 \
                           ::cora::test::backend_name)

/// The thread id aclrtSubscribeReport expects for the calling thread.
inline uint64_t report_thread_id() { return static_cast<uint64_t>(pthread_self()); }

}  // namespace cora::test
