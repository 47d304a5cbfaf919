// device::load_binary(path): the file read through the I/O queue, and its errors.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <cstring>
#include <fstream>

#include "core/binary_format.hpp"
#include "support/device_fixture.hpp"
#include "support/temp_files.hpp"

namespace cora::test {
namespace {

class load_binary_file_test : public device_test {
 protected:
  /// Loads `path`, expecting failure with `expected`; returns the message.
  std::string load_error(const std::filesystem::path& path, std::error_code expected) {
    try {
      dev().load_binary(path).wait();
      ADD_FAILURE() << "loading " << path << " succeeded";
    } catch (const error& e) {
      // errno values come in the system category; compare them as conditions.
      EXPECT_TRUE(e.code() == expected || e.code() == expected.default_error_condition())
          << e.code() << " instead of " << expected << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos)
          << "the message does not name the path: " << e.what();
      return e.what();
    }
    return {};
  }
};
CORA_DEVICE_SUITE(load_binary_file_test);

TEST_P(load_binary_file_test, LoadsFromAnAsioCoroutine) {
  asio::io_context io;
  binary loaded;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        loaded = co_await dev().load_binary(kernel_file("test_kernels.corabin")).async_wait(asio::use_awaitable);
      },
      asio::detached);
  io.run();
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(loaded.kernel("add_f32"));
}

// Whether this system reads `path` from its caches alone, without waiting: a path lookup
// with RESOLVE_CACHED and a read with RWF_NOWAIT (the file system must offer both).
bool reads_without_waiting(const std::filesystem::path& path) {
  open_how how{};
  how.flags = O_RDONLY | O_CLOEXEC;
  how.resolve = RESOLVE_CACHED;
  const long fd = ::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof how);
  if (fd < 0) return false;
  char byte;
  ::iovec v{&byte, 1};
  const bool ok = ::preadv2(static_cast<int>(fd), &v, 1, 0, RWF_NOWAIT) == 1;
  ::close(static_cast<int>(fd));
  return ok;
}

// A small file in the page cache is read and loaded on the calling thread, as bytes in memory
// are: the load has completed when load_binary returns, with no hop to the I/O thread.
// On a GPU too, while no cora work runs on it (with work in flight the load waits, on a cora
// thread: memory_test's LoadBinaryReturnsWhileAKernelRuns).
TEST_P(load_binary_file_test, ACachedFileLoadsBeforeTheCallReturns) {
  const auto file = kernel_file("test_kernels.corabin");
  // In the page cache now. Kept, so that no unload (which holds the streams' locks on a GPU)
  // runs beside the next load.
  const auto first = dev().load_binary(file).wait();
  ASSERT_TRUE(first);
  if (!reads_without_waiting(file))
    GTEST_SKIP() << "this kernel or file system cannot read " << file << " without waiting";
  auto p = dev().load_binary(file);
  EXPECT_TRUE(p.ready());
  EXPECT_TRUE(p.wait().kernel("add_f32"));
}

TEST_P(load_binary_file_test, MissingFile) {
  temp_dir dir;
  load_error(dir / "missing.corabin", std::make_error_code(std::errc::no_such_file_or_directory));
}

TEST_P(load_binary_file_test, Directory) {
  temp_dir dir;
  load_error(dir.path(), std::make_error_code(std::errc::is_a_directory));
}

TEST_P(load_binary_file_test, EmptyFile) {
  temp_dir dir;
  const auto file = dir / "empty.corabin";
  write_pattern_file(file, 0);
  load_error(file, make_error_code(errc::invalid_binary));
}

TEST_P(load_binary_file_test, NotARegularFile) {
  load_error("/dev/null", std::make_error_code(std::errc::invalid_argument));
}

// A FIFO without a writer: the open must not wait for one (on the blocking fallback that held
// the one I/O thread, and every later load of the process, forever).
TEST_P(load_binary_file_test, FifoWithoutAWriterFailsAndLaterLoadsWork) {
  temp_dir dir;
  const auto fifo = dir / "kernels.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  with_watchdog(std::chrono::seconds(30), [&] {
    load_error(fifo, std::make_error_code(std::errc::invalid_argument));
    EXPECT_TRUE(dev().load_binary(kernel_file("test_kernels.corabin")).wait().kernel("add_f32"));
  });
}

TEST_P(load_binary_file_test, UnreadableFile) {
  temp_dir dir;
  with_unreadable_file(dir, [&](const std::filesystem::path& file) {
    load_error(file, std::make_error_code(std::errc::permission_denied));
  });
}

// sysfs attributes claim 4096 bytes and hold fewer: the read ends early, as when a file
// shrinks between the size check and the read.
TEST_P(load_binary_file_test, ShortRead) {
  const std::filesystem::path file = "/sys/devices/system/cpu/online";
  struct stat st {};
  std::ifstream in(file);
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (::stat(file.c_str(), &st) != 0 || static_cast<std::size_t>(st.st_size) <= content.size())
    GTEST_SKIP() << file << " is missing or reports no more than it holds";
  const std::string what = load_error(file, std::make_error_code(std::errc::io_error));
  EXPECT_NE(what.find("short read"), std::string::npos) << what;
}

namespace {

void write_bytes(const std::filesystem::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// What a load gives: the error's message, or the kernel names of the binary.
std::string outcome(pending<binary> p) {
  try {
    std::string names = "loaded:";
    for (const auto& n : p.wait().kernel_names()) names += " " + n;
    return names;
  } catch (const error& e) {
    std::string what = e.what();
    // A load from a file names the path first.
    const auto at = what.find("': ");
    return at == std::string::npos ? what : what.substr(at + 3);
  }
}

}  // namespace

// A load from a file reads the first 32 KiB, then the rest of the metadata when the header
// says there is more (here 40 kernel records, about 45 KiB), then the image: the same result
// as a load of the same bytes from memory.
TEST_P(load_binary_file_test, MetadataLongerThanTheFirstReadIsReadWhole) {
  std::vector<cora::backend::kernel_desc> kernels;
  for (int i = 0; i < 40; ++i) kernels.push_back({"k" + std::to_string(i), std::nullopt, {{8, 8}}, true, 0});
  const std::string ptx = ".version 8.0\n.target sm_90\n.address_size 64\n";
  std::vector<std::byte> image(ptx.size());
  std::memcpy(image.data(), ptx.data(), ptx.size());
  const auto bytes = detail::write_corabin({{detail::binary_kind::cuda_ptx, 0, image}}, kernels);
  ASSERT_GT(detail::corabin_meta_size(bytes), 40u * 1024);
  temp_dir dir;
  const auto file = dir / "many_kernels.corabin";
  write_bytes(file, bytes);
  const std::string from_memory = outcome(dev().load_binary(std::span<const std::byte>(bytes)));
  const std::string from_file = outcome(dev().load_binary(file));
  EXPECT_EQ(from_file, from_memory);
  EXPECT_EQ(from_file.find("truncated"), std::string::npos) << from_file;
  if (dev().properties().backend == backend_kind::cpu) {
    EXPECT_NE(from_file.find("no image for"), std::string::npos) << from_file;
  }
}

// A container cut short on disk, in the middle of the image a load picks: the header's total
// size gives it away before any image byte is read.
TEST_P(load_binary_file_test, ContainerCutShortIsAnInvalidBinary) {
  std::ifstream in(kernel_file("test_kernels.corabin"), std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(c.size() / 2);
  std::memcpy(bytes.data(), c.data(), bytes.size());
  temp_dir dir;
  const auto file = dir / "cut.corabin";
  write_bytes(file, bytes);
  const std::string what = load_error(file, make_error_code(errc::invalid_binary));
  EXPECT_NE(what.find("truncated"), std::string::npos) << what;
}

}  // namespace
}  // namespace cora::test
