// An Asio TCP server that runs a device kernel per request (see README.md for the protocol).
//
// One cora::task per connection reads a request, awaits its copy-in / launch / copy-out (alone
// or packed with other requests into one launch) and writes the reply; no thread waits for the
// device.
#pragma once

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <cora/cora.hpp>

namespace kernel_server {

struct server_options {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  ///< 0: the system picks a free port (see server::port())
  /// Worker threads, each running its own io_context with its share of the connections;
  /// 0: hardware threads.
  unsigned threads = 0;
  /// Device streams; 0: two per worker. A stream is not held while its work runs: each launch
  /// is enqueued on the worker's stream with the fewest launches in flight, so any number of
  /// requests may be on the device. With at least as many streams as workers, each worker
  /// enqueues on streams of its own (with two or more, a long kernel on one does not hold up
  /// the worker's next launch); with fewer, workers share them.
  unsigned streams = 0;
  std::uint32_t max_request_bytes = 16u << 20;  ///< larger payloads get too_large and a close
  std::size_t max_connections = 4096;           ///< more get a busy reply and a close
  /// Longest time from a request's header arriving to its reply being ready; a request's own
  /// deadline_ms can only shorten it. Past it the client gets a timeout status and the device
  /// work is left to finish.
  std::chrono::milliseconds deadline{2000};
  /// A request's payload, and each reply, must move within this; else the connection closes.
  std::chrono::milliseconds io_timeout{10000};
  /// A connection with no request for this long is closed.
  std::chrono::milliseconds idle_timeout{60000};
  std::uint32_t max_rounds = 1u << 16;  ///< saxpy rounds allowed per request
  /// Serve op::sleep (a kernel that busy-waits): for tests and demonstrations only.
  bool enable_sleep = false;
  std::uint64_t max_sleep_us = 10'000'000;
  /// Dynamic batching: add and saxpy requests with equal parameters, on one worker, are packed
  /// into one launch of up to batch_max_elements elements. With batch_window zero a worker
  /// closes its batches as soon as it has fewer than batch_launches launches on the device: a
  /// lone request goes at once, and requests gather only while the device is busy. A nonzero
  /// window holds each batch open that long instead. batch_launches 0 counts as 1.
  bool batching = false;
  std::chrono::microseconds batch_window{0};
  unsigned batch_launches = 2;
  std::size_t batch_max_elements = 1u << 20;
  /// The kernel binary with add_f32, saxpy_rounds and slow (test_kernels.corabin).
  std::filesystem::path kernels;
};

/// Counters, read with server::stats().
struct server_stats {
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_rejected = 0;  ///< over max_connections
  std::uint64_t connections_open = 0;
  std::uint64_t requests = 0;   ///< replies sent, whatever their status
  std::uint64_t in_flight = 0;  ///< requests read and not yet answered
  std::uint64_t ok = 0;
  std::uint64_t bad_requests = 0;  ///< bad_request, too_large, unknown_op
  std::uint64_t timeouts = 0;
  std::uint64_t device_errors = 0;
  std::uint64_t batches = 0;  ///< launches that served more than one request
  std::uint64_t batched_requests = 0;
};

/// The server. Constructing it loads the kernels and binds the port; start() runs it on its
/// own threads; stop() shuts it down gracefully (also from a signal handler's completion
/// handler); join() waits until every connection is closed and the device work is done.
///
/// @par Thread safety
/// stop() and stats() may be called from any thread.
class server {
 public:
  /// @throws cora::error if the kernels do not load, std::system_error if the address does
  /// not bind.
  server(cora::device& dev, server_options options);
  /// Stops and joins.
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// The port the server listens on (the chosen one when options.port was 0).
  std::uint16_t port() const noexcept;
  asio::ip::tcp::endpoint endpoint() const;
  /// The first worker's io_context, which also accepts connections (to attach an
  /// asio::signal_set, say).
  asio::io_context& context() noexcept;

  /// Starts the worker threads.
  void start();
  /// Stops accepting, closes idle connections, lets requests in flight finish and get their
  /// replies, then closes their connections. Idempotent; returns at once.
  void stop() noexcept;
  /// Waits for the threads started by start() to end (after stop(), once drained).
  void join();

  server_stats stats() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace kernel_server
