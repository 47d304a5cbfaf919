// The fallback queue: one thread doing blocking open/pread/close calls in submission order, for
// kernels or sandboxes without io_uring and for read_options::force_blocking.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>

#include "io/io_queue.hpp"

namespace cora::detail::io {

class blocking_io_queue final : public io_queue {
 public:
  blocking_io_queue();
  ~blocking_io_queue() override;

  std::string_view name() const noexcept override { return "blocking"; }
  std::uint64_t open(std::string path, int flags, io_callback done) override;
  std::uint64_t read(int fd, void* buf, std::size_t len, std::uint64_t offset, int buf_index,
                     io_callback done) override;
  /// Skips the request if it has not started yet; a pread under way runs to its end.
  void cancel(std::uint64_t id) noexcept override;
  void close(int fd) noexcept override;

 private:
  struct job {
    enum class kind { open, read, close } k = kind::read;
    std::uint64_t id = 0;
    std::string path;
    int flags = 0;
    int fd = -1;
    void* buf = nullptr;
    std::size_t len = 0;
    std::uint64_t offset = 0;
    io_callback done;
  };
  std::uint64_t push(job j);
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<job> jobs_;
  std::unordered_set<std::uint64_t> cancelled_;
  std::uint64_t next_id_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cora::detail::io
