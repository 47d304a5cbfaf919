// The io_uring queue: one ring per process, owned by a dedicated I/O thread that submits every
// request and reaps every completion.
#pragma once

#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/io_queue.hpp"

namespace cora::detail::io {

class uring_io_queue final : public io_queue {
 public:
  /// Sets up the ring and starts its thread. Null, with `why` set, where io_uring is
  /// unavailable (ENOSYS on old kernels, EPERM under seccomp or io_uring_disabled, missing
  /// opcodes).
  static std::unique_ptr<uring_io_queue> create(std::string& why);
  ~uring_io_queue() override;

  std::string_view name() const noexcept override { return "io_uring"; }
  std::uint64_t open(std::string path, int flags, io_callback done) override;
  std::uint64_t read(int fd, void* buf, std::size_t len, std::uint64_t offset, int buf_index,
                     io_callback done) override;
  void cancel(std::uint64_t id) noexcept override;
  void close(int fd) noexcept override;
  int register_buffer(void* p, std::size_t len) noexcept override;
  void unregister_buffer(int index) noexcept override;

  /// What the ring offers ("256 entries, fixed buffers").
  std::string detail() const;

 private:
  uring_io_queue() = default;

  struct request {
    io_callback done;
    std::string path;  // an open's path, alive until the kernel is done with it
  };

  bool on_io_thread() const noexcept { return std::this_thread::get_id() == thread_id_; }
  /// Runs `fn` on the I/O thread: at once when called there, else queued and the thread woken.
  void post(std::function<void()> fn);
  /// The next free submission entry; flushes the queue when it is full. I/O thread only.
  io_uring_sqe* next_sqe();
  void arm_wakeup();
  void run();

  io_uring ring_{};
  unsigned entries_ = 0;
  int wake_fd_ = -1;
  std::uint64_t wake_count_ = 0;  // the eventfd's counter, read by the ring
  std::atomic<bool> wake_pending_{false};
  std::atomic<std::uint64_t> next_id_{first_id};
  bool stop_ = false;

  // Posted work (any thread to the I/O thread).
  std::mutex post_mutex_;
  std::vector<std::function<void()>> posted_;

  // Requests in flight by id; touched only by the I/O thread.
  std::unordered_map<std::uint64_t, request> live_;

  // Fixed-buffer slots (a sparse table registered at start, where the kernel has them).
  mutable std::mutex slot_mutex_;
  std::vector<int> free_slots_;
  unsigned slot_count_ = 0;

  std::thread thread_;
  std::thread::id thread_id_;

  static constexpr std::uint64_t ignore_id = 0;  // completions nobody waits for (cancel, close)
  static constexpr std::uint64_t wake_id = 1;    // the eventfd read that wakes the thread
  static constexpr std::uint64_t first_id = 2;
};

}  // namespace cora::detail::io
