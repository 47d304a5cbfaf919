// The blocking fallback where io_uring is unavailable: this program forbids io_uring_setup
// with a seccomp filter (as container runtimes do) before anything starts, then checks that
// file reads still work, through the fallback, and that the fallback is reported.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cora/cora.hpp"
#include "support/device_fixture.hpp"
#include "support/temp_files.hpp"

namespace cora::test {
namespace {

/// The errno io_uring_setup fails with: CORA_TEST_SECCOMP_ERRNO=ENOSYS (an old kernel) or
/// EPERM (the default, what seccomp profiles return).
int refused_errno() {
  const char* e = std::getenv("CORA_TEST_SECCOMP_ERRNO");
  return e && std::string(e) == "ENOSYS" ? ENOSYS : EPERM;
}

bool forbid_io_uring(int err) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

bool filter_installed = false;

TEST(io_fallback, ReportsTheBlockingFallbackAndWhy) {
  ASSERT_TRUE(filter_installed) << "seccomp filter not installed";
  EXPECT_EQ(io_backend_name(), "blocking");
  const std::string detail = io_backend_detail();
  EXPECT_NE(detail.find("io_uring_queue_init failed"), std::string::npos) << detail;
  EXPECT_NE(detail.find(std::strerror(refused_errno())), std::string::npos) << detail;
}

TEST(io_fallback, FilesStillReachTheDevice) {
  ASSERT_TRUE(filter_installed) << "seccomp filter not installed";
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  runtime rt(o);
  auto& dev = rt.device(0);
  temp_dir dir;
  const std::size_t size = (3 << 20) + 5;
  const auto file = dir / "data";
  write_pattern_file(file, size);
  auto s = dev.make_stream();
  auto d = dev.alloc<std::uint8_t>(size);
  read_options ro;
  ro.chunk_bytes = 1 << 20;
  EXPECT_EQ(s.read_file(d.data(), file, 0, size, ro).wait(), size);
  auto h = dev.alloc_host<std::uint8_t>(size);
  s.copy(h, d).wait();
  EXPECT_EQ(pattern_mismatch(h.data(), size, 0), -1);
  auto bin = dev.load_binary(kernel_file("test_kernels.corabin")).wait();
  EXPECT_TRUE(bin.kernel("add_f32"));
}

}  // namespace
}  // namespace cora::test

int main(int argc, char** argv) {
  cora::test::filter_installed = cora::test::forbid_io_uring(cora::test::refused_errno());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
