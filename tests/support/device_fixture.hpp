// Test support: device suites run once per backend; the CUDA instances skip without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <cora/cora.hpp>

namespace cora::test {

/// Where the build put the kernel binaries; CORA_TEST_KERNELS_DIR overrides it for a build
/// folder that was copied to another machine (scripts/gpu-check).
inline std::filesystem::path kernel_file(const std::string& name) {
  const char* dir = std::getenv("CORA_TEST_KERNELS_DIR");
  return std::filesystem::path(dir && *dir ? dir : CORA_TEST_KERNELS_DIR) / name;
}

/// The backends a device suite runs against.
enum class backend { cpu, cuda };

inline void PrintTo(backend b, std::ostream* os) { *os << (b == backend::cpu ? "cpu" : "cuda"); }

inline std::string backend_name(const ::testing::TestParamInfo<backend>& info) {
  return info.param == backend::cpu ? "cpu" : "cuda";
}

/// Why the shared runtime of a backend could not be made (empty if it was, or not tried).
inline std::map<backend, std::string>& shared_runtime_failures() {
  static std::map<backend, std::string> why;
  return why;
}

/// One shared runtime per backend for the whole test program (creating a CUDA context per test
/// would dominate the run time); null when the backend has no device here.
inline runtime* shared_runtime(backend b) {
  static std::map<backend, std::unique_ptr<runtime>> runtimes;
  static std::map<backend, bool> tried;
  if (!tried[b]) {
    tried[b] = true;
    runtime_options o;
    o.use_environment = false;
    o.backend = b == backend::cpu ? backend_selection::cpu : backend_selection::cuda;
    try {
      runtimes[b] = std::make_unique<runtime>(o);
    } catch (const error& e) {
      shared_runtime_failures()[b] = e.what();
    }
  }
  auto it = runtimes.find(b);
  return it == runtimes.end() ? nullptr : it->second.get();
}

/// True where the machine must have a CUDA device (scripts/gpu-check sets
/// CORA_TEST_REQUIRE_CUDA=1): there a CUDA instance that finds none fails instead of skipping,
/// so that a CUDA backend that failed to start cannot pass as skipped.
inline bool cuda_required() {
  const char* v = std::getenv("CORA_TEST_REQUIRE_CUDA");
  return v && std::string(v) == "1";
}

/// Skips a test of backend `b` that found no device, or fails it where a CUDA device is
/// required. A macro, because GTEST_SKIP() and FAIL() return from the function they are in.
#define CORA_NO_DEVICE(b, why)                                                                  \
  do {                                                                                          \
    if ((b) == ::cora::test::backend::cuda && ::cora::test::cuda_required())                    \
      FAIL() << "no CUDA device, but CORA_TEST_REQUIRE_CUDA=1: " << (why);                      \
    GTEST_SKIP() << "no " << ((b) == ::cora::test::backend::cpu ? "CPU" : "CUDA") << " device here"; \
  } while (0)

/// Fixture of device suites: a device of the backend under test and the test kernels on it.
class device_test : public ::testing::TestWithParam<backend> {
 protected:
  void SetUp() override {
    rt_ = shared_runtime(GetParam());
    if (!rt_) CORA_NO_DEVICE(GetParam(), shared_runtime_failures()[GetParam()]);
  }
  cora::device& dev() { return rt_->device(0); }
  /// test_kernels.corabin, loaded once per backend.
  cora::binary& kernels() {
    // Coroutines of a test call this from the threads running their executors.
    static std::mutex mutex;
    static std::map<backend, cora::binary> loaded;
    std::lock_guard lock(mutex);
    auto& b = loaded[GetParam()];
    if (!b) b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
    return b;
  }
  runtime* rt_ = nullptr;
};

#define CORA_DEVICE_SUITE(suite)                                                            \
  INSTANTIATE_TEST_SUITE_P(backends, suite,                                                 \
                           ::testing::Values(::cora::test::backend::cpu,                    \
                                             ::cora::test::backend::cuda),                  \
                           ::cora::test::backend_name)

/// In a device suite's test body: a GPU fault is sticky for the whole context, so suites sharing
/// one runtime fault only on the CPU device (cuda_backend_test checks GPU faults in child
/// processes). A macro, because GTEST_SKIP() returns from the function it is written in.
#define CORA_SKIP_FAULTS_ON_GPU()                                                           \
  do {                                                                                      \
    if (GetParam() == ::cora::test::backend::cuda)                                          \
      GTEST_SKIP() << "a fault would break the shared CUDA context";                        \
  } while (0)

/// Runs `f` on another thread and fails the test if it takes longer than `limit` (a hang).
template <class F>
void with_watchdog(std::chrono::seconds limit, F&& f) {
  auto fut = std::async(std::launch::async, std::forward<F>(f));
  if (fut.wait_for(limit) != std::future_status::ready) {
    // Named here: the abort below ends the run before gtest prints the failed test's name.
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    ADD_FAILURE() << "watchdog: " << (info ? std::string(info->test_suite_name()) + "." + info->name() + " " : "")
                  << "still running after " << limit.count() << " s (hang)";
    std::abort();  // a hung test cannot be unwound safely
  }
  fut.get();
}

/// Expects `expr` to throw cora::error with code `code`.
#define EXPECT_CORA_ERROR(expr, expected_code)                                              \
  do {                                                                                      \
    try {                                                                                   \
      (void)(expr);                                                                         \
      ADD_FAILURE() << #expr " did not throw";                                              \
    } catch (const ::cora::error& e_) {                                                     \
      EXPECT_EQ(e_.code(), ::std::error_code(expected_code)) << e_.what();                  \
    }                                                                                       \
  } while (0)

}  // namespace cora::test
