// Test support: temporary files with known contents, and running a test again as an
// unprivileged user (root bypasses file permissions, and CI runs as root).
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

extern char** environ;

namespace cora::test {

/// A directory under $TMPDIR (or /tmp) that is removed with everything in it.
class temp_dir {
 public:
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/cora-test-XXXXXX";
    if (!::mkdtemp(templ.data())) throw std::system_error(errno, std::system_category(), "mkdtemp");
    path_ = templ;
    // Traversable by everyone, so that a test re-run as another user reaches its files.
    std::filesystem::permissions(path_, std::filesystem::perms(0755));
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Byte `i` of every pattern file: varies with the position so misplaced chunks show.
inline std::uint8_t pattern_byte(std::uint64_t i) {
  return static_cast<std::uint8_t>((i * 2654435761u) >> 13 ^ (i >> 20));
}

/// Writes `size` pattern bytes to `path` (positions counted from 0).
inline void write_pattern_file(const std::filesystem::path& path, std::uint64_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::system_category(), "open " + path.string());
  std::vector<std::uint8_t> block(std::size_t{1} << 20);
  for (std::uint64_t at = 0; at < size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), size - at));
    for (std::size_t i = 0; i < n; ++i) block[i] = pattern_byte(at + i);
    const ssize_t w = ::pwrite(fd, block.data(), n, static_cast<off_t>(at));
    if (w != static_cast<ssize_t>(n)) {
      ::close(fd);
      throw std::system_error(errno, std::system_category(), "write " + path.string());
    }
    at += n;
  }
  // Written back now: an O_DIRECT read of dirty pages waits for their writeback first, which
  // would make timings (and how soon a read can be cancelled) depend on the disk.
  ::fsync(fd);
  ::close(fd);
}

/// Index of the first byte of `data` that is not pattern byte `first + i`, or -1.
inline std::int64_t pattern_mismatch(const std::uint8_t* data, std::size_t n, std::uint64_t first) {
  for (std::size_t i = 0; i < n; ++i)
    if (data[i] != pattern_byte(first + i)) return static_cast<std::int64_t>(i);
  return -1;
}

/// True when a file without read permission cannot be opened here (false for root, whose
/// CAP_DAC_OVERRIDE bypasses file modes).
inline bool permissions_enforced(const std::filesystem::path& dir) {
  const auto probe = dir / "permission-probe";
  write_pattern_file(probe, 1);
  std::filesystem::permissions(probe, std::filesystem::perms::none);
  const int fd = ::open(probe.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  std::filesystem::remove(probe);
  return fd < 0;
}

/// The environment variable that tells a test it runs as the re-run child, and whose value the
/// parent passes (a path).
inline constexpr const char* child_env = "CORA_TEST_CHILD_ARG";
/// The child's exit status when it cannot drop its privileges.
inline constexpr int child_cannot_drop = 77;

/// In the child: drops root to nobody (setgid/setuid apply to every thread of the process).
/// Exits with child_cannot_drop when that is not allowed here.
inline void become_nobody() {
  if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)
    std::_Exit(child_cannot_drop);
}

/// Runs the current test again in a new process of this program, with child_env set to `arg`.
/// Returns the child's exit status (0: passed).
inline int rerun_current_test(const std::string& arg) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter =
      std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  const std::string env_arg = std::string(child_env) + "=" + arg;
  std::vector<std::string> env_strings{env_arg};
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind(std::string(child_env) + "=", 0) != 0) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::vector<char*> argv{exe.data(), const_cast<char*>(filter.c_str()), nullptr};
  pid_t pid;
  if (::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Runs `check(path)` on a file that this test's user cannot read: a mode-000 file where
/// permissions are enforced; as root, a root-only file checked by a re-run of this test as
/// nobody (skipped, with the reason, where privileges cannot be dropped).
template <class F>
void with_unreadable_file(const temp_dir& dir, F check) {
  if (const char* arg = std::getenv(child_env)) {
    become_nobody();
    check(std::filesystem::path(arg));
    return;
  }
  const auto file = dir / "unreadable";
  write_pattern_file(file, 4096);
  if (permissions_enforced(dir.path())) {
    std::filesystem::permissions(file, std::filesystem::perms::none);
    check(file);
    return;
  }
  std::filesystem::permissions(file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const int status = rerun_current_test(file.string());
  if (status == child_cannot_drop)
    GTEST_SKIP() << "root bypasses file permissions here, and this process may not drop to nobody";
  EXPECT_EQ(status, 0) << "the re-run of this test as nobody failed (its output is above)";
}

}  // namespace cora::test
