// The completion engine: how soon waits served by the engine thread see their ops complete.
#include <chrono>
#include <future>
#include <thread>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

class engine_test : public device_test {};
CORA_DEVICE_SUITE(engine_test);

// The hybrid policy sleeps until an op is expected to end, learning durations per stream. A
// long op must not teach it to sleep that long for the short ops that follow (each would
// then take as long as the long one to be seen complete).
TEST_P(engine_test, LongOpDoesNotDelayLaterShortOpsOnTheEngineThread) {
  auto s = dev().make_stream();
  s.host_func([] { std::this_thread::sleep_for(300ms); }).wait();
  clock::duration worst{};
  for (int i = 0; i < 12; ++i) {
    std::promise<void> done;
    const auto t0 = clock::now();
    // No executor: the engine thread detects completion and runs the handler.
    s.host_func([] { std::this_thread::sleep_for(2ms); }).async_wait([&](std::error_code) { done.set_value(); });
    done.get_future().wait();
    if (i >= 6) worst = std::max(worst, clock::now() - t0);
  }
  EXPECT_LT(worst, 50ms) << "short ops are detected as late as the long op before them";
}

}  // namespace
}  // namespace cora::test
