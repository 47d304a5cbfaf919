// stream::read_file: files streamed into device memory through the I/O queue.
#include <sys/stat.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "core/state.hpp"  // complete stream_state, for a default-constructed stream
#include "cora/io.hpp"
#include "cora/stream.hpp"
#include "core/staging_pool.hpp"
#include "support/device_fixture.hpp"
#include "support/temp_files.hpp"

namespace cora::test {
namespace {

using namespace std::chrono_literals;
using detail::io::staging_bytes_in_use;

constexpr std::size_t chunk = 64 << 10;

struct read_mode {
  const char* name;
  bool direct;
  bool force_blocking;
};
constexpr read_mode modes[] = {
    {"default queue, O_DIRECT", true, false},
    {"default queue, buffered", false, false},
    {"blocking fallback, O_DIRECT", true, true},
    {"blocking fallback, buffered", false, true},
};

read_options options_for(const read_mode& m, std::size_t chunk_bytes = chunk, unsigned depth = 3) {
  read_options o;
  o.chunk_bytes = chunk_bytes;
  o.depth = depth;
  o.direct = m.direct;
  o.force_blocking = m.force_blocking;
  return o;
}

/// Holds a stream's work behind a host function until released (also on test failure).
class stream_gate {
 public:
  explicit stream_gate(stream& s) {
    (void)s.host_func([this] {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return open_; });
    });
  }
  ~stream_gate() { release(); }
  void release() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

class read_file_test : public device_test {
 protected:
  /// Reads [offset, offset + bytes) of `file` to the device and checks it against the pattern.
  void round_trip(stream& s, const std::filesystem::path& file, std::uint64_t offset,
                  std::size_t bytes, const read_options& o) {
    SCOPED_TRACE("offset " + std::to_string(offset) + ", " + std::to_string(bytes) + " bytes");
    if (bytes == 0) {
      EXPECT_EQ(s.read_file(nullptr, file, offset, 0, o).wait(), 0u);
      return;
    }
    auto d = dev().alloc<std::uint8_t>(bytes);
    auto h = dev().alloc_host<std::uint8_t>(bytes);
    EXPECT_EQ(s.read_file(d.data(), file, offset, bytes, o).wait(), bytes);
    s.copy(h, d).wait();
    EXPECT_EQ(pattern_mismatch(h.data(), bytes, offset), -1);
  }
};
CORA_DEVICE_SUITE(read_file_test);

TEST_P(read_file_test, RoundTripsFilesOfEverySize) {
  temp_dir dir;
  auto s = dev().make_stream();
  for (const auto& m : modes) {
    SCOPED_TRACE(m.name);
    for (std::uint64_t size : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{chunk},
                               std::uint64_t{5 * chunk + 123}}) {
      const auto file = dir / ("file-" + std::to_string(size));
      write_pattern_file(file, size);
      round_trip(s, file, 0, size, options_for(m));
    }
  }
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

TEST_P(read_file_test, ReadsRangesAtOffsets) {
  temp_dir dir;
  const std::uint64_t size = 7 * chunk + 777;
  const auto file = dir / "file";
  write_pattern_file(file, size);
  auto s = dev().make_stream();
  const std::pair<std::uint64_t, std::size_t> ranges[] = {
      {1, 100}, {4095, 4097}, {chunk - 1, chunk + 2}, {3 * chunk + 5, size - 3 * chunk - 5},
      {size - 1, 1}, {size, 0}, {12345, 5 * chunk}};
  for (const auto& m : modes) {
    SCOPED_TRACE(m.name);
    for (auto [offset, bytes] : ranges) round_trip(s, file, offset, bytes, options_for(m));
  }
  // A depth of one and chunks that are not a multiple of the O_DIRECT alignment.
  round_trip(s, file, 3, size - 3, options_for(modes[0], 10000, 1));
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

TEST_P(read_file_test, RangePastTheEndFailsWithOutOfRange) {
  temp_dir dir;
  const auto file = dir / "file";
  write_pattern_file(file, 1000);
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(2000);
  for (const auto& m : modes) {
    SCOPED_TRACE(m.name);
    auto p = s.read_file(d.data(), file, 500, 501, options_for(m));
    try {
      p.wait();
      ADD_FAILURE() << "read past the end succeeded";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::error_code(errc::out_of_range));
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    }
    EXPECT_CORA_ERROR(s.read_file(d.data(), file, 1001, 0, options_for(m)).wait(), errc::out_of_range);
  }
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

TEST_P(read_file_test, FileThatShrinksDuringTheReadFails) {
  temp_dir dir;
  for (const auto& m : modes) {
    SCOPED_TRACE(m.name);
    const auto file = dir / "shrinking";
    write_pattern_file(file, 8 * chunk);
    auto s = dev().make_stream();
    auto d = dev().alloc<std::uint8_t>(8 * chunk);
    // The gate holds the copies, so at most `depth` chunks are read before the file shrinks.
    stream_gate gate(s);
    auto p = s.read_file(d.data(), file, 0, 8 * chunk, options_for(m, chunk, 2));
    while (staging_bytes_in_use() == 0 && !p.ready()) std::this_thread::sleep_for(1ms);
    std::filesystem::resize_file(file, 2 * chunk + chunk / 2);
    gate.release();
    try {
      p.wait();
      ADD_FAILURE() << "a read of a shrinking file succeeded";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::make_error_code(std::errc::io_error)) << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find(file.string()), std::string::npos) << what;
      EXPECT_NE(what.find("shrank"), std::string::npos) << what;
    }
    s.synchronize().wait();
  }
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

TEST_P(read_file_test, MissingFileAndDirectoryFailWithThePath) {
  temp_dir dir;
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(16);
  for (const auto& m : modes) {
    SCOPED_TRACE(m.name);
    const auto missing = dir / "missing";
    try {
      s.read_file(d.data(), missing, 0, 16, options_for(m)).wait();
      ADD_FAILURE() << "read of a missing file succeeded";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory) << e.what();
      EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
    }
    try {
      s.read_file(d.data(), dir.path(), 0, 16, options_for(m)).wait();
      ADD_FAILURE() << "read of a directory succeeded";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::errc::is_a_directory) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

// A FIFO without a writer: opening it must not wait for one (that held the I/O thread, and
// every later read and load of the process, forever). It fails like any non-regular file.
TEST_P(read_file_test, FifoWithoutAWriterFailsAndLaterReadsWork) {
  temp_dir dir;
  const auto fifo = dir / "input.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto file = dir / "file";
  write_pattern_file(file, 4096);
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(16);
  for (const auto& m : modes) {
    SCOPED_TRACE(m.name);
    with_watchdog(30s, [&] {
      std::error_code ec;
      s.read_file(d.data(), fifo, 0, 16, options_for(m)).wait(ec);
      EXPECT_EQ(ec, std::errc::invalid_argument) << ec.message();
      round_trip(s, file, 0, 4096, options_for(m));
    });
  }
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

TEST_P(read_file_test, UnreadableFileFailsWithPermissionDenied) {
  temp_dir dir;
  with_unreadable_file(dir, [&](const std::filesystem::path& file) {
    auto s = dev().make_stream();
    auto d = dev().alloc<std::uint8_t>(4096);
    for (const auto& m : modes) {
      SCOPED_TRACE(m.name);
      try {
        s.read_file(d.data(), file, 0, 4096, options_for(m)).wait();
        ADD_FAILURE() << "read of an unreadable file succeeded";
      } catch (const error& e) {
        EXPECT_EQ(e.code(), std::errc::permission_denied) << e.what();
        EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
      }
    }
  });
}

TEST_P(read_file_test, InvalidArgumentsFailAtOnce) {
  temp_dir dir;
  const auto file = dir / "file";
  write_pattern_file(file, 100);
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(100);
  read_options o;
  o.depth = 0;
  EXPECT_CORA_ERROR(s.read_file(d.data(), file, 0, 100, o).wait(), errc::invalid_argument);
  o = {};
  o.chunk_bytes = 0;
  EXPECT_CORA_ERROR(s.read_file(d.data(), file, 0, 100, o).wait(), errc::invalid_argument);
  EXPECT_CORA_ERROR(s.read_file(d.data(), file, 0, 101).wait(), errc::out_of_range);  // past dst
  EXPECT_CORA_ERROR(s.read_file(nullptr, file, 0, 100).wait(), errc::invalid_pointer);
  EXPECT_CORA_ERROR(stream().read_file(d.data(), file, 0, 100).wait(), errc::invalid_handle);
}

// Cancels the wait on `p` after `after` through `awaitable_operators ||`; returns how long the
// read took to stop once cancelled, and checks that it was cancelled, not completed.
std::chrono::steady_clock::duration cancel_after(pending<std::size_t>& p,
                                                 std::chrono::milliseconds after) {
  asio::io_context io;
  std::chrono::steady_clock::time_point cancelled_at, stopped_at;
  bool timer_won = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        using namespace asio::experimental::awaitable_operators;
        asio::steady_timer timer(co_await asio::this_coro::executor, after);
        auto expire = [&]() -> asio::awaitable<void> {
          co_await timer.async_wait(asio::use_awaitable);
          cancelled_at = std::chrono::steady_clock::now();
        };
        auto r = co_await (p.async_wait(asio::experimental::as_tuple(asio::use_awaitable)) ||
                           expire());
        stopped_at = std::chrono::steady_clock::now();
        timer_won = r.index() == 1;
      },
      asio::detached);
  io.run();
  EXPECT_TRUE(timer_won) << "the read finished before it could be cancelled";
  EXPECT_TRUE(p.ready());
  return stopped_at - cancelled_at;
}

/// The byte count in "... cancelled after N of M bytes ...".
std::size_t bytes_before_cancel(pending<std::size_t>& p) {
  try {
    p.wait();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), asio::error::operation_aborted) << e.what();
    const std::string what = e.what();
    const auto at = what.find("after ");
    if (at != std::string::npos) return std::stoull(what.substr(at + 6));
    ADD_FAILURE() << "no byte count in: " << what;
  }
  return 0;
}

TEST_P(read_file_test, CancellationStopsA256MiBReadPromptly) {
  temp_dir dir;
  const std::size_t size = std::size_t{256} << 20;
  const auto file = dir / "big";
  write_pattern_file(file, size);
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(size);
  s.fill(d, 0xA5).wait();  // not behind the read's copies: they would slow its stop
  read_options o;
  o.chunk_bytes = 256 << 10;
  o.depth = 2;
  auto p = s.read_file(d.data(), file, 0, size, o);
  const auto stop_time = cancel_after(p, 20ms);
  EXPECT_LT(stop_time, 500ms) << "the read took long to stop";
  EXPECT_EQ(staging_bytes_in_use(), 0u) << "staging buffers outlived the cancelled read";
  const std::size_t copied = bytes_before_cancel(p);
  EXPECT_LT(copied, size);

  // The documented end state: the prefix holds the file's data, the rest is untouched.
  auto h = dev().alloc_host<std::uint8_t>(size);
  s.copy(h, d).wait();
  EXPECT_EQ(pattern_mismatch(h.data(), copied, 0), -1);
  std::size_t untouched = 0;
  for (std::size_t i = copied; i < size; ++i) untouched += h[i] == 0xA5;
  EXPECT_EQ(untouched, size - copied);
}

TEST_P(read_file_test, CancellationStopsTheBlockingFallback) {
  temp_dir dir;
  const std::size_t size = std::size_t{64} << 20;
  const auto file = dir / "big";
  write_pattern_file(file, size);
  auto s = dev().make_stream();
  auto d = dev().alloc<std::uint8_t>(size);
  read_options o;
  o.chunk_bytes = 64 << 10;
  o.depth = 2;
  o.force_blocking = true;
  // The gate keeps the read from finishing before the cancellation.
  stream_gate gate(s);
  auto p = s.read_file(d.data(), file, 0, size, o);
  std::thread release([&] {
    std::this_thread::sleep_for(50ms);
    gate.release();
  });
  cancel_after(p, 10ms);
  release.join();
  EXPECT_LT(bytes_before_cancel(p), size);
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

TEST_P(read_file_test, ManyConcurrentReadsOnDifferentStreams) {
  temp_dir dir;
  constexpr int n = 8;
  const std::size_t part = (4 << 20) + 99;
  const auto file = dir / "shared";
  write_pattern_file(file, n * part + 1);
  std::vector<stream> streams;
  std::vector<device_buffer<std::uint8_t>> bufs;
  std::vector<pending<std::size_t>> reads;
  for (int i = 0; i < n; ++i) {
    streams.push_back(dev().make_stream());
    bufs.push_back(dev().alloc<std::uint8_t>(part));
  }
  for (int i = 0; i < n; ++i) {
    read_options o;
    o.chunk_bytes = 256 << 10;
    o.depth = 1 + i % 3;
    o.direct = i % 2 == 0;
    o.force_blocking = i % 4 == 3;
    reads.push_back(streams[i].read_file(bufs[i].data(), file, 1 + i * part, part, o));
  }
  auto h = dev().alloc_host<std::uint8_t>(part);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(reads[i].wait(), part);
    streams[i].copy(h, bufs[i]).wait();
    EXPECT_EQ(pattern_mismatch(h.data(), part, 1 + i * part), -1) << "read " << i;
  }
  EXPECT_EQ(staging_bytes_in_use(), 0u);
}

TEST(io_backend, ReportsTheMechanismInUse) {
  const std::string name(io_backend_name());
  const std::string detail = io_backend_detail();
  const char* env = std::getenv("CORA_IO_BACKEND");
  if (env && std::string(env) == "blocking") {
    EXPECT_EQ(name, "blocking");
    EXPECT_NE(detail.find("CORA_IO_BACKEND"), std::string::npos) << detail;
  } else {
    EXPECT_TRUE(name == "io_uring" || name == "blocking") << name;
    EXPECT_EQ(detail.rfind(name, 0), 0u) << detail;
  }
}

}  // namespace
}  // namespace cora::test
