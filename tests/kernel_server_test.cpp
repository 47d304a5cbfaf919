// The kernel server (examples/kernel_server), started in-process on 127.0.0.1: correct results,
// malformed requests, many connections, deadlines, graceful shutdown, batching, and the program
// stopping on SIGTERM with a request in flight.
#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "protocol.hpp"
#include "server.hpp"
#include "support/device_fixture.hpp"

extern char** environ;

namespace cora::test {
namespace {

using namespace std::chrono_literals;
namespace proto = kernel_server::protocol;
using tcp = asio::ip::tcp;

// Many connections need many descriptors (each one twice: client and server side).
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

struct reply {
  proto::reply_header h;
  std::vector<float> data;
  proto::status status() const { return static_cast<proto::status>(h.status); }
};

/// A blocking client; every test body runs under a watchdog, so a hang fails the test.
class client {
 public:
  explicit client(std::uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::address_v4::loopback(), port));
    socket_.set_option(tcp::no_delay(true));
  }

  void send(const std::vector<std::byte>& bytes) { asio::write(socket_, asio::buffer(bytes)); }
  void send(const void* p, std::size_t n) { asio::write(socket_, asio::buffer(p, n)); }
  void shutdown_send() { socket_.shutdown(tcp::socket::shutdown_send); }

  /// The next reply, or nothing when the server closed the connection.
  std::optional<reply> receive() {
    std::array<std::byte, proto::reply_header_size> hb;
    std::error_code ec;
    asio::read(socket_, asio::buffer(hb), ec);
    if (ec) return std::nullopt;
    reply r;
    r.h = proto::decode_reply(hb);
    EXPECT_EQ(r.h.magic, proto::magic);
    EXPECT_EQ(r.h.length % 4, 0u);
    r.data.resize(r.h.length / 4);
    asio::read(socket_, asio::buffer(r.data), ec);
    if (ec) return std::nullopt;
    return r;
  }

  /// True when the server has closed the connection (reads end of stream or a reset).
  bool closed_by_server() {
    std::byte b;
    std::error_code ec;
    asio::read(socket_, asio::buffer(&b, 1), ec);
    return static_cast<bool>(ec);
  }

 private:
  asio::io_context io_;
  tcp::socket socket_;
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  std::vector<float> v(n);
  for (auto& f : v) f = d(gen);
  return v;
}

std::vector<float> host_saxpy(float a, std::uint32_t rounds, const std::vector<float>& x,
                              std::vector<float> y) {
  for (std::size_t i = 0; i < y.size(); ++i)
    for (std::uint32_t r = 0; r < rounds; ++r) y[i] = a * x[i] + y[i];
  return y;
}

/// Sends one add request of `n` elements and checks the reply against the host.
void expect_add_works(client& c, std::size_t n, std::uint32_t id) {
  auto x = random_floats(n, id), y = random_floats(n, id + 1000);
  c.send(proto::make_add_request(id, x, y));
  auto r = c.receive();
  ASSERT_TRUE(r) << "connection closed";
  ASSERT_EQ(r->status(), proto::status::ok) << proto::to_string(r->status());
  EXPECT_EQ(r->h.id, id);
  ASSERT_EQ(r->data.size(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(r->data[i], x[i] + y[i]) << "at " << i;
}

class kernel_server_test : public device_test {
 protected:
  void SetUp() override {
    device_test::SetUp();
    if (IsSkipped()) return;
    raise_fd_limit();
  }

  kernel_server::server_options options() {
    kernel_server::server_options o;
    o.threads = 2;
    o.streams = 4;
    o.max_request_bytes = 1u << 20;
    o.enable_sleep = true;
    o.kernels = kernel_file("test_kernels.corabin");
    return o;
  }

  std::unique_ptr<kernel_server::server> start(const kernel_server::server_options& o) {
    auto s = std::make_unique<kernel_server::server>(dev(), o);
    s->start();
    return s;
  }

  // One worker that batches without a window and may have one launch on the device.
  std::unique_ptr<kernel_server::server> start_batching_one_launch() {
    auto o = options();
    o.threads = 1;  // one worker: every request meets the same launches
    o.batching = true;
    o.batch_window = 0us;
    o.batch_launches = 1;
    return start(o);
  }

  // Occupies the device (and the worker's one launch) with a 300 ms sleep request.
  static void occupy_device(client& sleeper, const kernel_server::server& srv) {
    sleeper.send(proto::make_sleep_request(100, 300'000));
    while (srv.stats().in_flight < 1) std::this_thread::sleep_for(1ms);
  }
};
CORA_DEVICE_SUITE(kernel_server_test);

TEST_P(kernel_server_test, AddAndSaxpyMatchTheHost) {
  with_watchdog(120s, [&] {
    auto srv = start(options());
    client c(srv->port());
    std::uint32_t id = 1;
    for (std::size_t n : {1u, 7u, 1000u, 65536u}) expect_add_works(c, n, id++);
    for (std::uint32_t rounds : {1u, 3u, 100u}) {
      const std::size_t n = 5000;
      auto x = random_floats(n, 7), y = random_floats(n, 8);
      const float a = 0.5f;
      c.send(proto::make_saxpy_request(id, a, rounds, x, y));
      auto r = c.receive();
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status(), proto::status::ok);
      EXPECT_EQ(r->h.id, id++);
      const auto want = host_saxpy(a, rounds, x, y);
      ASSERT_EQ(r->data.size(), n);
      // A GPU may fuse a*x+y into one rounding step: allow a little per round.
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_NEAR(r->data[i], want[i], 1e-5f * rounds * (1.0f + std::fabs(want[i])))
            << "at " << i;
    }
    srv->stop();
    srv->join();
    EXPECT_EQ(srv->stats().ok, 7u);
  });
}

TEST_P(kernel_server_test, PipelinedRequestsAreAnsweredInOrder) {
  with_watchdog(120s, [&] {
    auto srv = start(options());
    client c(srv->port());
    const int count = 50;
    std::vector<std::byte> all;
    for (int i = 0; i < count; ++i) {
      std::vector<float> x(64, static_cast<float>(i)), y(64, 1.0f);
      auto req = proto::make_add_request(static_cast<std::uint32_t>(i), x, y);
      all.insert(all.end(), req.begin(), req.end());
    }
    c.send(all);  // one write: requests arrive back to back, several per read
    for (int i = 0; i < count; ++i) {
      auto r = c.receive();
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status(), proto::status::ok);
      EXPECT_EQ(r->h.id, static_cast<std::uint32_t>(i));
      EXPECT_EQ(r->data.front(), static_cast<float>(i) + 1.0f);
    }
  });
}

TEST_P(kernel_server_test, MalformedRequestsGetAnErrorOrAClosedConnection) {
  with_watchdog(120s, [&] {
    auto o = options();
    o.io_timeout = 300ms;  // a stalled payload is given up on quickly
    auto srv = start(o);
    std::vector<float> x(16, 1.0f), y(16, 2.0f);
    auto valid = proto::make_add_request(1, x, y);
    auto header_of = [&](proto::request_header h) {
      auto b = proto::encode(h);
      return std::vector<std::byte>(b.begin(), b.end());
    };
    std::uint32_t id = 100;

    {  // bad magic: an error reply, then the server closes (the framing cannot be trusted)
      client c(srv->port());
      auto bad = valid;
      bad[0] = std::byte{'X'};
      c.send(bad);
      auto r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::bad_request);
      EXPECT_TRUE(c.closed_by_server());
    }
    {  // bad version
      client c(srv->port());
      auto bad = valid;
      bad[4] = std::byte{99};
      c.send(bad);
      auto r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::bad_request);
      EXPECT_TRUE(c.closed_by_server());
    }
    {  // a huge length: too_large, then closed, nothing allocated for it
      client c(srv->port());
      proto::request_header h;
      h.op = static_cast<std::uint8_t>(proto::op::add);
      h.id = 5;
      h.length = 0xFFFFFFF0u;
      c.send(header_of(h));
      auto r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::too_large);
      EXPECT_EQ(r->h.id, 5u);
      EXPECT_TRUE(c.closed_by_server());
    }
    {  // a truncated payload, then the client stops sending: closed without a reply
      client c(srv->port());
      c.send(valid.data(), valid.size() - 10);
      c.shutdown_send();
      EXPECT_FALSE(c.receive());
    }
    {  // a truncated payload and a client that stalls: closed after io_timeout
      client c(srv->port());
      c.send(valid.data(), valid.size() - 10);
      EXPECT_FALSE(c.receive());
    }
    {  // a truncated header, then end of stream
      client c(srv->port());
      c.send(valid.data(), 10);
      c.shutdown_send();
      EXPECT_FALSE(c.receive());
    }
    {  // zero-length, odd length, flags, unknown op: an error reply, the connection stays usable
      client c(srv->port());
      proto::request_header h;
      h.op = static_cast<std::uint8_t>(proto::op::add);
      h.id = 1;
      h.length = 0;
      c.send(header_of(h));
      auto r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::bad_request);
      EXPECT_EQ(r->h.id, 1u);
      EXPECT_TRUE(r->data.empty());

      h.id = 2;
      h.length = 12;  // not two equal fp32 vectors
      auto odd = header_of(h);
      odd.resize(odd.size() + 12);
      c.send(odd);
      r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::bad_request);

      auto flagged = valid;
      flagged[6] = std::byte{1};
      c.send(flagged);
      r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::bad_request);

      auto unknown = valid;
      unknown[5] = std::byte{42};
      c.send(unknown);
      r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::unknown_op);

      // saxpy with more rounds than the server allows
      auto big_rounds = proto::make_saxpy_request(3, 1.0f, 1u << 30, x, y);
      c.send(big_rounds);
      r = c.receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::bad_request);

      expect_add_works(c, 100, id++);
    }
    {  // garbage: an error reply or a close, never a crash
      std::mt19937 gen(3);
      for (int round = 0; round < 20; ++round) {
        client c(srv->port());
        std::vector<std::byte> junk(1 + gen() % 4000);
        for (auto& b : junk) b = static_cast<std::byte>(gen());
        c.send(junk);
        c.shutdown_send();
        while (auto r = c.receive()) EXPECT_NE(r->status(), proto::status::ok);
      }
    }
    // After all that, the server answers correctly.
    client c(srv->port());
    expect_add_works(c, 1000, id++);
    const auto st = srv->stats();
    EXPECT_GE(st.bad_requests, 8u);
    EXPECT_EQ(st.device_errors, 0u);
  });
}

TEST_P(kernel_server_test, ManyConnectionsAtOnce) {
  with_watchdog(180s, [&] {
    auto srv = start(options());
    const int connections = 256, rounds = 4;
    std::atomic<int> correct{0};
    std::vector<std::unique_ptr<client>> clients;
    for (int i = 0; i < connections; ++i) clients.push_back(std::make_unique<client>(srv->port()));
    // Every connection has a request in flight before any reply is read.
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < connections; ++i) {
        std::vector<float> x(256, static_cast<float>(i)), y(256, static_cast<float>(r));
        clients[i]->send(proto::make_add_request(static_cast<std::uint32_t>(i), x, y));
      }
      for (int i = 0; i < connections; ++i) {
        auto rep = clients[i]->receive();
        if (rep && rep->status() == proto::status::ok &&
            rep->h.id == static_cast<std::uint32_t>(i) && rep->data.size() == 256 &&
            rep->data[255] == static_cast<float>(i + r))
          ++correct;
      }
    }
    EXPECT_EQ(correct.load(), connections * rounds);
    EXPECT_EQ(srv->stats().connections_open, static_cast<std::uint64_t>(connections));
  });
}

TEST_P(kernel_server_test, ConnectionsOverTheLimitGetBusy) {
  with_watchdog(60s, [&] {
    auto o = options();
    o.max_connections = 3;
    auto srv = start(o);
    std::vector<std::unique_ptr<client>> held;
    for (int i = 0; i < 3; ++i) {
      held.push_back(std::make_unique<client>(srv->port()));
      expect_add_works(*held.back(), 10, static_cast<std::uint32_t>(i));  // admitted for sure
    }
    client extra(srv->port());
    auto r = extra.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), proto::status::busy);
    EXPECT_TRUE(extra.closed_by_server());
    held.pop_back();  // a place frees up once the server sees the close
    bool admitted = false;
    for (int attempt = 0; attempt < 200 && !admitted; ++attempt) {
      client again(srv->port());
      std::vector<float> x(4, 1.0f);
      again.send(proto::make_add_request(9, x, x));
      auto rep = again.receive();
      ASSERT_TRUE(rep);
      admitted = rep->status() == proto::status::ok;
      if (!admitted) {
        EXPECT_EQ(rep->status(), proto::status::busy);
        std::this_thread::sleep_for(10ms);
      }
    }
    EXPECT_TRUE(admitted);
    EXPECT_GE(srv->stats().connections_rejected, 1u);
    expect_add_works(*held.front(), 10, 77);
  });
}

TEST_P(kernel_server_test, DeadlineShorterThanTheKernelGivesTimeout) {
  with_watchdog(60s, [&] {
    auto srv = start(options());
    client c(srv->port());
    c.send(proto::make_sleep_request(1, 300'000, /*deadline_ms=*/20));
    auto r = c.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), proto::status::timeout);
    EXPECT_EQ(r->h.id, 1u);
    // The same connection goes on while the abandoned kernel still runs on its stream.
    expect_add_works(c, 1000, 2);
    // A request that fits its deadline succeeds.
    c.send(proto::make_sleep_request(3, 1000, 5000));
    r = c.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), proto::status::ok);
    // Stopping waits for the abandoned kernel; then every stream is back in the pool.
    srv->stop();
    srv->join();
    EXPECT_EQ(srv->stats().timeouts, 1u);
  });
}

// A worker owns two streams by default: a long kernel on one leaves the other to the worker's
// next launches, which are answered while the kernel still runs.
TEST_P(kernel_server_test, ALongKernelDoesNotHoldUpTheWorkersOtherRequests) {
  with_watchdog(60s, [&] {
    auto o = options();
    o.threads = 1;  // one worker: every request is its
    o.streams = 0;  // the default: two streams of its own
    o.deadline = 10s;
    auto srv = start(o);
    client sleeper(srv->port());
    sleeper.send(proto::make_sleep_request(1, 3'000'000));
    while (srv->stats().in_flight < 1) std::this_thread::sleep_for(1ms);
    client c(srv->port());
    expect_add_works(c, 1000, 2);
    expect_add_works(c, 1000, 3);
    EXPECT_EQ(srv->stats().in_flight, 1u) << "the adds waited for the long kernel";
    auto r = sleeper.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), proto::status::ok);
  });
}

TEST_P(kernel_server_test, DeadlinesUnderLoadLeaveTheServerHealthy) {
  with_watchdog(120s, [&] {
    auto o = options();
    o.streams = 2;
    auto srv = start(o);
    // More slow requests than streams, with deadlines around their run time: some time out
    // while running, some while waiting for a stream, some finish.
    std::vector<std::unique_ptr<client>> clients;
    for (int i = 0; i < 8; ++i) {
      clients.push_back(std::make_unique<client>(srv->port()));
      clients.back()->send(proto::make_sleep_request(static_cast<std::uint32_t>(i), 20'000,
                                                     static_cast<std::uint32_t>(5 + 10 * i)));
    }
    int timeouts = 0, oks = 0;
    for (auto& c : clients) {
      auto r = c->receive();
      ASSERT_TRUE(r);
      if (r->status() == proto::status::timeout) ++timeouts;
      if (r->status() == proto::status::ok) ++oks;
    }
    EXPECT_EQ(timeouts + oks, 8);
    EXPECT_GE(timeouts, 1);
    for (auto& c : clients) expect_add_works(*c, 500, 1);
  });
}

TEST_P(kernel_server_test, ShutdownFinishesRequestsInFlight) {
  with_watchdog(120s, [&] {
    auto srv = start(options());
    client idle(srv->port());
    expect_add_works(idle, 10, 9);  // admitted, now between requests
    std::vector<std::unique_ptr<client>> busy;
    for (int i = 0; i < 3; ++i) {
      busy.push_back(std::make_unique<client>(srv->port()));
      busy.back()->send(proto::make_sleep_request(static_cast<std::uint32_t>(i), 500'000));
    }
    while (srv->stats().in_flight < 3) std::this_thread::sleep_for(1ms);
    srv->stop();
    for (auto& c : busy) {  // each gets its reply, then the connection closes
      auto r = c->receive();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status(), proto::status::ok);
      EXPECT_TRUE(c->closed_by_server());
    }
    EXPECT_TRUE(idle.closed_by_server());
    srv->join();
    EXPECT_EQ(srv->stats().connections_open, 0u);
    EXPECT_THROW(client late(srv->port()), std::system_error);  // no longer accepting

    // The device is fine: a new server on it answers.
    auto again = start(options());
    client c(again->port());
    expect_add_works(c, 1000, 1);
  });
}

TEST_P(kernel_server_test, StopWithoutStartAndDestroyRunning) {
  with_watchdog(60s, [&] {
    { kernel_server::server idle_server(dev(), options()); }
    auto srv = start(options());
    client c(srv->port());
    expect_add_works(c, 10, 1);
    srv.reset();  // the destructor stops and joins
    EXPECT_TRUE(c.closed_by_server());
  });
}

TEST_P(kernel_server_test, BatchingPacksConcurrentRequestsAndSplitsReplies) {
  with_watchdog(120s, [&] {
    auto o = options();
    o.batching = true;
    o.batch_window = 20ms;  // wide: every request sent below lands in one window
    auto srv = start(o);
    const int connections = 32;
    std::vector<std::unique_ptr<client>> clients;
    for (int i = 0; i < connections; ++i) clients.push_back(std::make_unique<client>(srv->port()));
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<float>> xs, ys;
      for (int i = 0; i < connections; ++i) {
        const std::size_t n = 1 + static_cast<std::size_t>(i) * 37;  // different sizes
        xs.push_back(random_floats(n, static_cast<unsigned>(i + 100 * round)));
        ys.push_back(random_floats(n, static_cast<unsigned>(i + 7)));
        if (i % 2)
          clients[i]->send(proto::make_add_request(static_cast<std::uint32_t>(i), xs[i], ys[i]));
        else  // two saxpy kinds (a differs) next to the adds: three batches
          clients[i]->send(proto::make_saxpy_request(static_cast<std::uint32_t>(i),
                                                     i % 4 ? 2.0f : 3.0f, 2, xs[i], ys[i]));
      }
      for (int i = 0; i < connections; ++i) {
        auto r = clients[i]->receive();
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status(), proto::status::ok);
        ASSERT_EQ(r->h.id, static_cast<std::uint32_t>(i));
        const auto want =
            i % 2 ? std::vector<float>{} : host_saxpy(i % 4 ? 2.0f : 3.0f, 2, xs[i], ys[i]);
        ASSERT_EQ(r->data.size(), xs[i].size());
        for (std::size_t k = 0; k < xs[i].size(); ++k) {
          if (i % 2)
            ASSERT_EQ(r->data[k], xs[i][k] + ys[i][k]);
          else
            ASSERT_NEAR(r->data[k], want[k], 1e-4f * (1.0f + std::fabs(want[k])));
        }
      }
    }
    const auto st = srv->stats();
    EXPECT_GE(st.batches, 1u);
    EXPECT_GT(st.batched_requests, st.batches);
  });
}

// Without a window, a worker's requests gather while it has batch_launches launches on the
// device and go as one launch when one of them completes.
TEST_P(kernel_server_test, BatchesGatherWhileTheDeviceIsBusy) {
  with_watchdog(120s, [&] {
    auto srv = start_batching_one_launch();
    client sleeper(srv->port());
    occupy_device(sleeper, *srv);
    const int connections = 16;
    std::vector<std::unique_ptr<client>> clients;
    std::vector<std::vector<float>> xs, ys;
    for (int i = 0; i < connections; ++i) {
      clients.push_back(std::make_unique<client>(srv->port()));
      xs.push_back(random_floats(100 + static_cast<std::size_t>(i), static_cast<unsigned>(i)));
      ys.push_back(random_floats(100 + static_cast<std::size_t>(i), static_cast<unsigned>(i + 50)));
      clients.back()->send(proto::make_add_request(static_cast<std::uint32_t>(i), xs[i], ys[i]));
    }
    // All of them wait behind the sleeping kernel's launch.
    while (srv->stats().in_flight < connections + 1) std::this_thread::sleep_for(1ms);
    auto r = sleeper.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), proto::status::ok);
    for (int i = 0; i < connections; ++i) {
      auto got = clients[i]->receive();
      ASSERT_TRUE(got);
      ASSERT_EQ(got->status(), proto::status::ok);
      ASSERT_EQ(got->data.size(), xs[i].size());
      for (std::size_t k = 0; k < xs[i].size(); ++k) ASSERT_EQ(got->data[k], xs[i][k] + ys[i][k]);
    }
    const auto st = srv->stats();
    EXPECT_EQ(st.batches, 1u);
    EXPECT_EQ(st.batched_requests, static_cast<std::uint64_t>(connections));
    // With the device idle again, a lone request goes at once, as a launch of its own.
    expect_add_works(*clients[0], 64, 99);
    EXPECT_EQ(srv->stats().batches, 1u);
  });
}

// batch_launches 0 counts as 1: batches still close and requests are served.
TEST_P(kernel_server_test, ZeroBatchLaunchesStillServes) {
  with_watchdog(120s, [&] {
    auto o = options();
    o.batching = true;
    o.batch_window = 0us;
    o.batch_launches = 0;
    auto srv = start(o);
    client c(srv->port());
    for (std::uint32_t id = 1; id <= 3; ++id) expect_add_works(c, 100 * id, id);
    EXPECT_EQ(srv->stats().ok, 3u);
  });
}

// A request whose deadline passes while it waits in a batch gets timeout; the batch leaves it
// out, and the connection goes on.
TEST_P(kernel_server_test, DeadlineWhileWaitingInABatch) {
  with_watchdog(120s, [&] {
    auto srv = start_batching_one_launch();
    client sleeper(srv->port());
    occupy_device(sleeper, *srv);
    client c(srv->port());
    auto x = random_floats(256, 1), y = random_floats(256, 2);
    c.send(proto::make_add_request(7, x, y, /*deadline_ms=*/20));
    auto r = c.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), proto::status::timeout);
    EXPECT_EQ(r->h.id, 7u);
    expect_add_works(c, 300, 8);  // queued behind the sleep, then served
    r = sleeper.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), proto::status::ok);
    const auto st = srv->stats();
    EXPECT_EQ(st.timeouts, 1u);
    EXPECT_EQ(st.ok, 2u);
  });
}

// The program itself: SIGTERM with a request in flight gives that request its reply, then the
// process exits with status 0.
TEST_P(kernel_server_test, ProgramStopsGracefullyOnSigterm) {
  if (GetParam() != backend::cpu) GTEST_SKIP() << "the program picks its own device";
  with_watchdog(120s, [&] {
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    // CORA_TEST_KERNEL_SERVER: where a build copied to another machine keeps the program.
    const char* moved = std::getenv("CORA_TEST_KERNEL_SERVER");
    std::string program = moved && *moved ? moved : KERNEL_SERVER_PROGRAM,
                kernels = kernel_file("test_kernels.corabin").string();
    std::vector<std::string> args = {program, "--port",         "0",         "--threads",
                                     "2",     "--enable-sleep", "--kernels", kernels};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The child runs on the CPU device whatever this machine has.
    std::vector<std::string> env_store = {"CORA_BACKEND=cpu"};
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "CORA_BACKEND=", 13) != 0) env_store.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, program.c_str(), &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);

    // "kernel_server listening on 127.0.0.1 port N, ..."
    std::string line;
    char ch;
    while (read(out[0], &ch, 1) == 1 && ch != '\n') line += ch;
    const auto at = line.find(" port ");
    ASSERT_NE(at, std::string::npos) << line;
    const auto port = static_cast<std::uint16_t>(std::stoi(line.substr(at + 6)));

    client c(port);
    expect_add_works(c, 100, 1);
    c.send(proto::make_sleep_request(2, 300'000));
    // The pause lets the server read the request, so it is in flight when the signal comes.
    // Were it not read yet, a close without a reply would be right too: it was never taken.
    std::this_thread::sleep_for(100ms);
    kill(pid, SIGTERM);
    if (auto r = c.receive()) {
      EXPECT_EQ(r->status(), proto::status::ok);
      EXPECT_EQ(r->h.id, 2u);
      EXPECT_TRUE(c.closed_by_server());
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    std::string rest;
    while (read(out[0], &ch, 1) == 1) rest += ch;
    close(out[0]);
    EXPECT_NE(rest.find("stopped:"), std::string::npos) << rest;
  });
}

}  // namespace
}  // namespace cora::test
