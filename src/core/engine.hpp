// The completion engine: who polls for device completions, and where waiters resume.
//
// A wait is armed on a stream position; the stream keeps its waiters sorted and watches only
// its oldest marker, through its doorbell where the backend has one. Polling is done by poll
// groups:
//  - an executor_lane per thread and Asio execution context (the lanes of the context's
//    executor_group): a poll step posted to the waiters' own executor that re-posts itself while
//    waits are pending, so completion and resumption happen on the waiters' context and no
//    sleeping thread is woken in the common case;
//  - the engine thread, which takes over a lane whose waits are long (hybrid, blocking), and
//    detects the waits made without an executor (their handlers run on the handler thread).
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/execution_context.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cora/detail/intrusive_ptr.hpp"
#include "cora/detail/wait.hpp"
#include "cora/runtime.hpp"

namespace cora::detail {

class stream_state;
using clock = std::chrono::steady_clock;

/// A set of waits polled together.
class poll_group {
 public:
  virtual ~poll_group() = default;

  /// Counts a wait on `s` (before it is linked into the stream).
  void begin_wait(stream_state* s);
  /// Uncounts it (after it completed or was withdrawn). Called under the stream's state lock,
  /// so that a group being destroyed (abort_all takes each stream's state lock) never sees a wait
  /// that was claimed but not yet uncounted. Returns the group's reference to the stream when
  /// this was its last wait there: the caller drops it after unlocking.
  [[nodiscard]] intrusive_ptr<stream_state> end_wait(stream_state* s) noexcept;
  /// Makes sure someone polls this group.
  virtual void schedule() = 0;

  /// Polls every watched stream once; collects the nodes that completed and uncounts them.
  /// Returns true if any stream made progress. A stream whose doorbell did not move costs a
  /// few loads (stream_state::quiet).
  bool poll_once(std::vector<wait_node*>& fired);
  /// What a poll step decides by, gathered by poll_once with no extra lock.
  struct summary {
    completion_policy policy = completion_policy::blocking;  // the most eager watched
    std::chrono::microseconds spin_limit{0};                 // the longest watched
    clock::time_point next_expected = clock::time_point::max();
    std::uint64_t generation = 0;  // the group's generation when the poll began
  };
  bool poll_once(std::vector<wait_node*>& fired, summary& out);
  std::size_t pending() const noexcept { return pending_.load(std::memory_order_acquire); }
  /// The earliest expected completion among the watched streams' oldest markers.
  clock::time_point next_expected(clock::time_point now);
  /// The most eager policy among the watched streams.
  completion_policy policy();
  /// One of the watched streams (for a blocking wait in the backend), or null.
  intrusive_ptr<stream_state> any_stream();
  /// Withdraws every wait of this group with `ec`, firing them.
  void abort_all(std::error_code ec) noexcept;
  /// A wait of this group was claimed for firing (under its stream's state lock); fire() says when
  /// its completion handler is done with the node and its executor (fired_one).
  void claimed() noexcept { firing_.fetch_add(1, std::memory_order_relaxed); }
  void fired_one() noexcept { firing_.fetch_sub(1, std::memory_order_release); }
  /// True once the group is shut down: a wait linked after that is aborted by its arm.
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }
  /// Bumped whenever a stream is first watched: a poll step knows its summary is stale.
  std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }

 protected:
  std::mutex mutex_;
  void prune_locked() noexcept;
  // Watched streams: a reference and a count of waits; entries whose count is 0 hold no
  // reference and are kept for reuse (pruned when they pile up).
  std::unordered_map<stream_state*, std::pair<intrusive_ptr<stream_state>, std::size_t>> streams_;
  std::size_t live_ = 0;
  std::atomic<std::size_t> pending_{0};
  // Claimed waits whose completion is still being handed to their executor: a group whose
  // context is being destroyed waits for them, so that no completer posts to a freed context.
  std::atomic<std::size_t> firing_{0};
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> generation_{0};
};

class executor_group;

/// The waits that one thread armed on one Asio execution context (a lane of its group),
/// polled by a chain of poll steps posted to that context: each thread that waits has a
/// chain of its own, so detection is spread over the threads that wait instead of being one
/// chain per context, and a step looks only at the streams of its own thread's waits.
class executor_lane final : public poll_group {
 public:
  explicit executor_lane(asio::any_io_executor executor) noexcept;
  ~executor_lane() override;

  void schedule() override;
  /// Called by the engine when it has detected completions for a parked lane.
  void engine_progress() noexcept;
  bool parked() noexcept;
  /// Called by the engine shortly before a parked lane's op is expected to end: a thread of
  /// the lane's context takes over polling, so that it learns of the completion itself and
  /// resumes the waiter without a wake-up after it. Once per expected end `at`; false when
  /// this lane was already handed back for `at` or is no longer parked.
  bool hand_back(clock::time_point at);
  /// How long a hand-back takes to reach a thread of the lane's context (a wake-up of an
  /// idle thread, learnt from past hand-backs, at most max_handoff): the engine hands back
  /// this much earlier.
  clock::duration handoff_latency() const noexcept;
  static constexpr auto max_handoff = std::chrono::microseconds(60);
  /// Withdraws the lane's waits and waits until no completion of it is being posted; waits
  /// armed later are aborted at once (closed()).
  void shut_down() noexcept;

 private:
  void poll_step();
  void post_step();

  const asio::any_io_executor executor_;
  enum class state { idle, spinning, parked };
  std::mutex state_mutex_;
  state state_ = state::idle;
  clock::time_point last_progress_{};
  clock::time_point handed_back_for_{};
  clock::time_point handed_at_{};               // the pending hand-back's time, under state_mutex_
  std::atomic<clock::rep> handoff_{0};          // handoff_latency()
  // Set before the first park: only then does the engine know the lane.
  std::atomic<bool> parked_once_{false};
};

/// The waits of one Asio execution context: one lane per thread that arms waits there (up to
/// max_lanes; beyond, threads share lanes). Poll steps go to the context's executor.
class executor_group final : public asio::execution_context::service {
 public:
  static asio::execution_context::id id;
  static constexpr std::size_t max_lanes = 64;
  explicit executor_group(asio::execution_context& ctx);
  ~executor_group() override;

  /// The group of the context behind `ex`.
  static executor_group& of(const asio::any_io_executor& ex);

  /// The calling thread's lane, made on first use; `ex` (a waiter's executor) tells where to
  /// post poll steps when the group has none yet.
  executor_lane& lane(const asio::any_io_executor& ex);
  /// Lanes made so far, and waits pending in all of them (for tests).
  std::size_t lanes();
  std::size_t pending();

 private:
  void shutdown() override;
  executor_lane& make_lane(const asio::any_io_executor& ex);

  const std::uint64_t serial_;  // names this group in threads' lane caches
  std::mutex mutex_;
  bool bound_ = false;
  asio::any_io_executor executor_;
  std::vector<std::unique_ptr<executor_lane>> lanes_;
  std::vector<std::pair<std::thread::id, executor_lane*>> by_thread_;
  bool shut_down_ = false;  // under mutex_: lanes made later start closed
};

/// The process-wide engine thread (started on first use, idle on a condition variable when
/// nothing is parked or draining).
class engine {
 public:
  static engine& get();

  /// The group of waits that have no executor: the engine thread polls and resumes them.
  poll_group& inline_group() noexcept;
  /// Hands an executor lane's long waits to the engine thread.
  void park(executor_lane* g);
  /// Forgets a lane (its context is being destroyed).
  void forget(executor_lane* g) noexcept;
  /// Keeps a stream alive until its work has completed (its last handle was dropped early).
  void drain(intrusive_ptr<stream_state> s);
  /// Wakes the engine thread.
  void wake() noexcept;
  /// Waits until the engine thread is asleep or has begun a new pass of its loop, so that the
  /// driver calls and releases of the pass it was in have returned, or until `deadline`.
  /// Returns false at the deadline. For the exit handler (core/process_exit.hpp).
  bool barrier(clock::time_point deadline) noexcept;
  /// True on the engine thread (which also runs the handlers of waits without an executor).
  bool on_engine_thread() const noexcept { return std::this_thread::get_id() == thread_id_; }

 private:
  engine();
  void run();
  class inline_group_t;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<executor_lane*> parked_;
  std::vector<intrusive_ptr<stream_state>> draining_;
  std::unique_ptr<poll_group> inline_;
  bool wake_ = false;
  // For barrier(): passes begun, whether the thread sleeps on cv_, and who waits for either.
  std::condition_variable barrier_cv_;
  std::uint64_t passes_ = 0;
  bool asleep_ = false;
  unsigned barrier_waiters_ = 0;
  clock::duration oversleep_{};  // how late this thread's timed sleeps end (engine thread only)
  void set_asleep(bool asleep) noexcept;  // under mutex_
  std::thread thread_;
  std::thread::id thread_id_;
};

/// Fires completed nodes. `inline_last`: the last node may resume inside this call.
void fire(std::vector<wait_node*>& nodes, bool inline_last) noexcept;

}  // namespace cora::detail
