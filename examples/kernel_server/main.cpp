// kernel_server: serves vector kernels over TCP (protocol in README.md). SIGINT or SIGTERM
// stops it gracefully: no new connections, requests in flight finish, exit status 0.
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <csignal>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include <cora/cora.hpp>

#include "server.hpp"

int main(int argc, char** argv) {
  kernel_server::server_options o;
  o.kernels = CORA_EXAMPLE_KERNELS_DIR "/test_kernels.corabin";
  std::string kernels = o.kernels.string();
  unsigned deadline_ms = static_cast<unsigned>(o.deadline.count());
  unsigned window_us = static_cast<unsigned>(o.batch_window.count());
  unsigned io_timeout_ms = static_cast<unsigned>(o.io_timeout.count());
  unsigned idle_timeout_ms = static_cast<unsigned>(o.idle_timeout.count());
  double run_for = 0;

  CLI::App app{"cora kernel server: vector kernels over TCP, one coroutine per connection"};
  app.add_option("--address", o.address, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads, one io_context each (0: hardware threads)")
      ->capture_default_str();
  app.add_option("--streams", o.streams, "device streams (0: two per worker; a worker launches on the least busy of its own)")
      ->capture_default_str();
  app.add_option("--max-request-bytes", o.max_request_bytes, "largest payload accepted")
      ->capture_default_str();
  app.add_option("--max-connections", o.max_connections, "connections served at once")
      ->capture_default_str();
  app.add_option("--deadline-ms", deadline_ms, "per-request deadline")->capture_default_str();
  app.add_option("--io-timeout-ms", io_timeout_ms, "a payload or reply must move within this")
      ->capture_default_str();
  app.add_option("--idle-timeout-ms", idle_timeout_ms, "close connections idle this long")
      ->capture_default_str();
  app.add_option("--max-rounds", o.max_rounds, "saxpy rounds allowed per request")
      ->capture_default_str();
  app.add_flag("--batching", o.batching, "pack concurrent requests of one kind into one launch");
  app.add_option("--batch-window-us", window_us,
                 "hold each batch open this long (0: close batches when the device has room)")
      ->capture_default_str();
  app.add_option("--batch-launches", o.batch_launches,
                 "with no window: launches per worker on the device before requests gather")
      ->capture_default_str();
  app.add_flag("--enable-sleep", o.enable_sleep, "serve the sleep op (for demonstrations)");
  app.add_option("--kernels", kernels, "kernel binary with add_f32, saxpy_rounds and slow")
      ->capture_default_str();
  app.add_option("--run-for", run_for,
                 "stop by itself after this many seconds (0: until a signal)");
  CLI11_PARSE(app, argc, argv);
  o.kernels = kernels;
  o.deadline = std::chrono::milliseconds(deadline_ms);
  o.batch_window = std::chrono::microseconds(window_us);
  o.io_timeout = std::chrono::milliseconds(io_timeout_ms);
  o.idle_timeout = std::chrono::milliseconds(idle_timeout_ms);

  try {
    cora::runtime rt;
    cora::device& dev = rt.default_device();
    kernel_server::server srv(dev, o);

    // The signal set and the run-for timer share a strand, so each may cancel the other: once
    // both are done the io_context runs dry and join() returns.
    auto control = asio::make_strand(srv.context());
    asio::signal_set signals(control, SIGINT, SIGTERM);
    asio::steady_timer limit(control);
    signals.async_wait([&](std::error_code ec, int sig) {
      if (ec) return;
      std::printf("signal %d: stopping (requests in flight finish)\n", sig);
      std::fflush(stdout);
      srv.stop();
      limit.cancel();
    });
    if (run_for > 0) {
      limit.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(run_for)));
      limit.async_wait([&](std::error_code ec) {
        if (ec) return;
        srv.stop();
        signals.cancel();  // lets the io_context run out of work
      });
    }

    std::printf("kernel_server listening on %s port %u, device %s\n", o.address.c_str(),
                static_cast<unsigned>(srv.port()), dev.name().c_str());
    std::fflush(stdout);
    srv.start();
    srv.join();
    const auto s = srv.stats();
    std::printf(
        "stopped: %llu connections, %llu replies (%llu ok, %llu bad, %llu timeouts, %llu device "
        "errors)\n",
        static_cast<unsigned long long>(s.connections_accepted),
        static_cast<unsigned long long>(s.requests), static_cast<unsigned long long>(s.ok),
        static_cast<unsigned long long>(s.bad_requests),
        static_cast<unsigned long long>(s.timeouts),
        static_cast<unsigned long long>(s.device_errors));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_server: %s\n", e.what());
    return 1;
  }
}
