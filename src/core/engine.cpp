#include "core/engine.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <typeinfo>

#include <asio/error.hpp>
#include <asio/execution/context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/query.hpp>

#include "core/state.hpp"

namespace cora::detail {

namespace {

// A group that has seen no completion for this long while its oldest op is not expected soon
// hands its waits to the engine thread (hybrid policy).
constexpr auto park_early = std::chrono::microseconds(100);
// The engine thread wakes this long before an op is expected to finish, then spins.
constexpr auto wake_margin = std::chrono::microseconds(20);
// How long past the expected end the engine keeps spinning before sleeping in steps.
constexpr auto overrun_spin = std::chrono::microseconds(200);
// The longest sleep on a prediction: one learned from a long op must not hold up the short
// ops after it for that long.
constexpr auto max_predicted_sleep = std::chrono::milliseconds(1);
// The most the engine wakes early to make up for its own wake-ups' lateness.
constexpr clock::duration max_oversleep = std::chrono::microseconds(50);

struct group_policy {
  completion_policy policy = completion_policy::blocking;
  std::chrono::microseconds spin_limit{0};
};

int eagerness(completion_policy p) {
  switch (p) {
    case completion_policy::spin: return 3;
    case completion_policy::hybrid: return 2;
    case completion_policy::callback: return 1;
    case completion_policy::blocking: return 0;
  }
  return 0;
}

}  // namespace

asio::any_io_executor handler_executor() noexcept {
  // One thread that runs only completions of waits without an executor. It is not the engine
  // thread: a handler that blocks there (a wait(), a sync_wait) delays no detection. Never
  // destroyed: waits may still be armed while the process exits.
  struct handler_thread {
    asio::io_context ctx{1};
    asio::executor_work_guard<asio::io_context::executor_type> work{ctx.get_executor()};
    std::thread thread{[this] {
      ::prctl(PR_SET_NAME, "cora-handlers", 0, 0, 0);
      for (;;) {
        try {
          ctx.run();
          return;
        } catch (...) {
          // A handler threw: asio propagates it out of run(); the thread keeps serving.
        }
      }
    }};
  };
  static handler_thread* t = [] {
    auto* h = new handler_thread;
    h->thread.detach();
    return h;
  }();
  return t->ctx.get_executor();
}

void fire(std::vector<wait_node*>& nodes, bool inline_last) noexcept {
  const std::size_t n = nodes.size();
  for (std::size_t i = 0; i < n; ++i) {
    wait_node* node = nodes[i];
    auto* group = static_cast<poll_group*>(node->group);  // the node may be gone after the call
    node->on_complete(*node, inline_last && i + 1 == n);
    if (group) group->fired_one();
  }
  nodes.clear();
}

// ---------------------------------------------------------------------------------------------
// poll_group

void poll_group::begin_wait(stream_state* s) {
  std::lock_guard lock(mutex_);
  // Entries stay when their count drops to 0 (holding no reference), so that a steady
  // arm/complete cycle on a stream allocates nothing; stale ones are pruned when they pile up.
  auto it = streams_.find(s);
  if (it == streams_.end()) {
    if (streams_.size() >= 64 && streams_.size() >= 4 * live_) prune_locked();
    it = streams_.emplace(s, std::make_pair(intrusive_ptr<stream_state>(), std::size_t{0})).first;
  }
  if (it->second.second++ == 0) {
    it->second.first = intrusive_ptr<stream_state>::share(s);
    ++live_;
    generation_.fetch_add(1, std::memory_order_release);
  }
  pending_.fetch_add(1, std::memory_order_acq_rel);
}

intrusive_ptr<stream_state> poll_group::end_wait(stream_state* s) noexcept {
  intrusive_ptr<stream_state> last;
  std::lock_guard lock(mutex_);
  auto it = streams_.find(s);
  if (it == streams_.end() || it->second.second == 0) return last;
  if (--it->second.second == 0) {
    last = std::move(it->second.first);
    --live_;
  }
  pending_.fetch_sub(1, std::memory_order_acq_rel);
  return last;
}

void poll_group::prune_locked() noexcept {
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (it->second.second == 0)
      it = streams_.erase(it);
    else
      ++it;
  }
}

bool poll_group::poll_once(std::vector<wait_node*>& fired) {
  summary ignored;
  return poll_once(fired, ignored);
}

bool poll_group::poll_once(std::vector<wait_node*>& fired, summary& out) {
  thread_local std::vector<intrusive_ptr<stream_state>> snapshot;
  snapshot.clear();
  out = {};
  {
    std::lock_guard lock(mutex_);
    out.generation = generation_.load(std::memory_order_relaxed);
    for (auto& [p, entry] : streams_) {
      if (!entry.first) continue;
      snapshot.push_back(entry.first);
      if (eagerness(p->policy) > eagerness(out.policy)) out.policy = p->policy;
      out.spin_limit = std::max(out.spin_limit, p->spin_limit);
    }
  }
  bool progress = false;
  const auto now = clock::now();
  for (auto& s : snapshot) {
    progress |= s->poll_when_due(fired, now);  // uncounts what it fires
    out.next_expected = std::min(out.next_expected, s->expected_ready());
  }
  snapshot.clear();
  return progress;
}

clock::time_point poll_group::next_expected(clock::time_point) {
  // Reused per thread: a spinning poll step asks this on every step.
  thread_local std::vector<intrusive_ptr<stream_state>> snapshot;
  snapshot.clear();
  {
    std::lock_guard lock(mutex_);
    for (auto& [p, entry] : streams_)
      if (entry.first) snapshot.push_back(entry.first);
  }
  auto next = clock::time_point::max();
  for (auto& s : snapshot) next = std::min(next, s->expected_ready());
  snapshot.clear();
  return next;
}

completion_policy poll_group::policy() {
  std::lock_guard lock(mutex_);
  completion_policy p = completion_policy::blocking;
  for (auto& [s, entry] : streams_)
    if (entry.first && eagerness(s->policy) > eagerness(p)) p = s->policy;
  return p;
}

intrusive_ptr<stream_state> poll_group::any_stream() {
  std::lock_guard lock(mutex_);
  for (auto& [s, entry] : streams_)
    if (entry.first) return entry.first;
  return {};
}

void poll_group::abort_all(std::error_code ec) noexcept {
  std::vector<intrusive_ptr<stream_state>> snapshot;
  {
    std::lock_guard lock(mutex_);
    for (auto& [p, entry] : streams_)
      if (entry.first) snapshot.push_back(entry.first);
  }
  for (auto& s : snapshot) s->abort_waits(ec, this);
}

// ---------------------------------------------------------------------------------------------
// executor_group

asio::execution_context::id executor_group::id;

namespace {
std::atomic<std::uint64_t> group_serials{0};
}

executor_group::executor_group(asio::execution_context& ctx)
    : asio::execution_context::service(ctx), serial_(group_serials.fetch_add(1) + 1) {}

executor_group::~executor_group() = default;  // the lanes forget themselves

executor_group& executor_group::of(const asio::any_io_executor& ex) {
  return asio::use_service<executor_group>(asio::query(ex, asio::execution::context));
}

namespace {

using tracked_io_executor = asio::io_context::basic_executor_type<std::allocator<void>, 4>;

// Replaces a strand by the executor under it. (any_executor::target() in Asio 1.22 does not
// check the type, so the type is compared here.)
template <class Strand>
bool unwrap_strand(asio::any_io_executor& ex) {
  if (ex.target_type() != typeid(Strand)) return false;
  asio::any_io_executor inner = ex.target<Strand>()->get_inner_executor();
  ex = std::move(inner);
  return true;
}

// Each thread remembers its lanes of the last few groups it waited in, by group serial (a
// group's address may be reused by a later one; its serial never is).
struct lane_cache_entry {
  std::uint64_t serial = 0;
  executor_lane* lane = nullptr;
};
constexpr std::size_t lane_cache_size = 8;
thread_local lane_cache_entry lane_cache[lane_cache_size];
thread_local std::size_t lane_cache_next = 0;

}  // namespace

executor_lane& executor_group::lane(const asio::any_io_executor& ex) {
  for (auto& e : lane_cache)
    if (e.serial == serial_) return *e.lane;
  executor_lane& l = make_lane(ex);
  lane_cache[lane_cache_next] = {serial_, &l};
  lane_cache_next = (lane_cache_next + 1) % lane_cache_size;
  return l;
}

executor_lane& executor_group::make_lane(const asio::any_io_executor& ex) {
  std::lock_guard lock(mutex_);
  const auto self = std::this_thread::get_id();
  for (auto& [thread, l] : by_thread_)
    if (thread == self) return *l;
  if (!bound_) {
    // Poll steps go to the context itself, not to the strand of whichever waiter came first,
    // so that detection is not queued behind that strand's own work.
    asio::any_io_executor inner = ex;
    while (unwrap_strand<asio::strand<asio::any_io_executor>>(inner) ||
           unwrap_strand<asio::strand<asio::io_context::executor_type>>(inner) ||
           unwrap_strand<asio::strand<tracked_io_executor>>(inner)) {
    }
    executor_ = asio::prefer(inner, asio::execution::outstanding_work.untracked);
    bound_ = true;
  }
  if (lanes_.size() == max_lanes) {
    // Many threads: they share lanes, by a hash of their id (not remembered here, so that a
    // context used from ever new threads keeps no list of them).
    return *lanes_[std::hash<std::thread::id>{}(self) % max_lanes];
  }
  lanes_.push_back(std::make_unique<executor_lane>(executor_));
  if (shut_down_) lanes_.back()->shut_down();  // a wait armed from now on is aborted at once
  by_thread_.emplace_back(self, lanes_.back().get());
  return *lanes_.back();
}

std::size_t executor_group::lanes() {
  std::lock_guard lock(mutex_);
  return lanes_.size();
}

std::size_t executor_group::pending() {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (auto& l : lanes_) n += l->pending();
  return n;
}

void executor_group::shutdown() {
  std::vector<executor_lane*> lanes;
  {
    std::lock_guard lock(mutex_);
    shut_down_ = true;
    for (auto& l : lanes_) lanes.push_back(l.get());
  }
  for (executor_lane* l : lanes) l->shut_down();
}

// ---------------------------------------------------------------------------------------------
// executor_lane

executor_lane::executor_lane(asio::any_io_executor executor) noexcept
    : executor_(std::move(executor)) {}

executor_lane::~executor_lane() {
  if (parked_once_.load(std::memory_order_acquire)) engine::get().forget(this);
}

void executor_lane::post_step() {
  asio::post(executor_, [this] { poll_step(); });
}

void executor_lane::schedule() {
  bool post = false;
  {
    std::lock_guard lock(state_mutex_);
    if (state_ != state::spinning) {
      state_ = state::spinning;
      last_progress_ = clock::now();
      post = true;
    }
  }
  if (post) post_step();
}

clock::duration executor_lane::handoff_latency() const noexcept {
  return clock::duration(handoff_.load(std::memory_order_relaxed));
}

bool executor_lane::parked() noexcept {
  std::lock_guard lock(state_mutex_);
  return state_ == state::parked;
}

bool executor_lane::hand_back(clock::time_point at) {
  {
    std::lock_guard lock(state_mutex_);
    if (state_ != state::parked || handed_back_for_ == at) return false;
    handed_back_for_ = at;
    state_ = state::spinning;
    handed_at_ = clock::now();  // the step that takes over restarts the spin limit
  }
  post_step();
  return true;
}

void executor_lane::engine_progress() noexcept {
  std::lock_guard lock(state_mutex_);
  if (state_ == state::parked && pending() == 0) state_ = state::idle;
}

void executor_lane::poll_step() {
  thread_local std::vector<wait_node*> fired;
  std::vector<wait_node*> local;
  local.swap(fired);  // a nested poll step (inline resumption that runs the context) gets its own
  local.clear();
  summary seen;
  const bool progress = poll_once(local, seen);
  const auto now = clock::now();
  bool repost = false, park = false;
  {
    std::lock_guard lock(state_mutex_);
    if (handed_at_ != clock::time_point{}) {
      // Learn how long a hand-back takes to run here (mostly an idle thread's wake-up; the
      // poll just made adds little).
      const auto took = std::min<clock::duration>(now - handed_at_, max_handoff);
      const clock::rep old = handoff_.load(std::memory_order_relaxed);
      handoff_.store(old == 0 ? took.count() : (3 * old + took.count()) / 4, std::memory_order_relaxed);
      handed_at_ = {};
      last_progress_ = now;  // the spin limit counts from here, not from the hand-back
    }
    if (progress) last_progress_ = now;
    if (pending() == 0) {
      state_ = state::idle;
    } else {
      // Decided by what poll_once saw; a stream added to the watch meanwhile (its op may be
      // short, or of a more eager policy) gets one more step, which sees it.
      const completion_policy p = seen.policy;
      if (p == completion_policy::spin || seen.generation != generation()) {
        repost = true;
      } else if (p == completion_policy::hybrid) {
        const auto expected = seen.next_expected;
        const bool far = expected != clock::time_point::max() && expected - now > park_early;
        repost = !far && now - last_progress_ < seen.spin_limit;
        park = !repost;
      } else {
        park = true;
      }
      state_ = repost ? state::spinning : state::parked;
    }
  }
  if (repost) post_step();
  if (park) {
    parked_once_.store(true, std::memory_order_release);
    engine::get().park(this);
  }
  fire(local, true);
  local.swap(fired);
}

void executor_lane::shut_down() noexcept {
  // Before the waits are withdrawn: an arm that links its wait after abort_all took the
  // stream's lock sees it there and aborts the wait itself (stream_state::arm).
  closed_.store(true, std::memory_order_release);
  if (parked_once_.load(std::memory_order_acquire)) engine::get().forget(this);
  abort_all(asio::error::operation_aborted);
  // Completions claimed by pollers of other contexts may still be posting to this one: the
  // context (and its scheduler, which then destroys what they posted) stays until they are.
  while (firing_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

// ---------------------------------------------------------------------------------------------
// engine

class engine::inline_group_t final : public poll_group {
 public:
  explicit inline_group_t(engine& e) : engine_(e) {}
  void schedule() override { engine_.wake(); }

 private:
  engine& engine_;
};

engine& engine::get() {
  // Never destroyed: waits may still be armed while the process exits.
  static engine* e = new engine;
  return *e;
}

engine::engine() : inline_(std::make_unique<inline_group_t>(*this)) {
  thread_ = std::thread([this] { run(); });
  thread_id_ = thread_.get_id();
  thread_.detach();
}

poll_group& engine::inline_group() noexcept { return *inline_; }

void engine::park(executor_lane* g) {
  {
    std::lock_guard lock(mutex_);
    if (std::find(parked_.begin(), parked_.end(), g) == parked_.end()) parked_.push_back(g);
    wake_ = true;
  }
  cv_.notify_one();
}

void engine::forget(executor_lane* g) noexcept {
  std::lock_guard lock(mutex_);
  parked_.erase(std::remove(parked_.begin(), parked_.end(), g), parked_.end());
}

void engine::drain(intrusive_ptr<stream_state> s) {
  {
    std::lock_guard lock(mutex_);
    draining_.push_back(std::move(s));
    wake_ = true;
  }
  cv_.notify_one();
}

void engine::wake() noexcept {
  {
    std::lock_guard lock(mutex_);
    wake_ = true;
  }
  cv_.notify_one();
}

void engine::set_asleep(bool asleep) noexcept {
  asleep_ = asleep;
  if (asleep && barrier_waiters_ > 0) barrier_cv_.notify_all();
}

bool engine::barrier(clock::time_point deadline) noexcept {
  try {
    if (std::this_thread::get_id() == thread_id_) return true;  // the caller: in no driver call
    // The engine thread holds mutex_ through a pass, driver calls included, and a driver call
    // may be held up for as long as a kernel runs: the deadline bounds taking the lock too.
    std::unique_lock lock(mutex_, std::defer_lock);
    while (!lock.try_lock()) {
      if (clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (asleep_) return true;  // on cv_: between passes, in no driver call
    const std::uint64_t start = passes_;
    ++barrier_waiters_;
    wake_ = true;
    cv_.notify_one();
    const bool passed =
        barrier_cv_.wait_until(lock, deadline, [&] { return asleep_ || passes_ != start; });
    --barrier_waiters_;
    return passed;
  } catch (...) {
    return false;
  }
}

void engine::run() {
  // Timed sleeps must end on time: the hybrid policy sleeps until shortly before an op ends.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  std::vector<wait_node*> fired;
  std::vector<intrusive_ptr<stream_state>> done;
  auto backoff = std::chrono::microseconds(20);
  for (;;) {
    bool progress = false;
    auto next = clock::time_point::max();
    bool any_hybrid = false, any_waits = false;
    intrusive_ptr<stream_state> block_stream;
    {
      std::unique_lock lock(mutex_);
      const auto work = [&] {
        return wake_ || !parked_.empty() || inline_->pending() > 0 || !draining_.empty();
      };
      if (!work()) {
        set_asleep(true);
        cv_.wait(lock, work);
        set_asleep(false);
      }
      ++passes_;
      if (barrier_waiters_ > 0) barrier_cv_.notify_all();
      wake_ = false;
      const auto now = clock::now();
      for (auto it = parked_.begin(); it != parked_.end();) {
        executor_lane* g = *it;
        if (!g->parked()) {
          it = parked_.erase(it);
          continue;
        }
        progress |= g->poll_once(fired);
        g->engine_progress();
        if (!g->parked()) {
          it = parked_.erase(it);
          continue;
        }
        const auto p = g->policy();
        if (p == completion_policy::hybrid || p == completion_policy::spin) {
          const auto expected = g->next_expected(now);
          // Expected within the wake margin (plus the time a hand-back takes to reach the
          // lane's thread): the lane's own thread spins for the rest, so completion is learnt
          // where the waiter resumes, not posted to a sleeping thread after it
          // (docs/architecture.md, "The completion engine"). Once per expected end: an op
          // that overruns its estimate stays with the engine.
          const auto lead = g->handoff_latency();
          if (expected != clock::time_point::max() && expected > now &&
              expected - now <= wake_margin + lead && g->hand_back(expected)) {
            it = parked_.erase(it);
            continue;
          }
          any_waits = true;
          any_hybrid = true;
          next = std::min(next, expected == clock::time_point::max() ? expected : expected - lead);
          ++it;
          continue;
        }
        any_waits = true;
        if (!block_stream) block_stream = g->any_stream();
        ++it;
      }
      if (inline_->pending() > 0) {
        progress |= inline_->poll_once(fired);
        if (inline_->pending() > 0) {
          any_waits = true;
          any_hybrid = true;
          next = std::min(next, inline_->next_expected(now));
        }
      }
      bool draining = false;
      for (auto it = draining_.begin(); it != draining_.end();) {
        (*it)->drain(clock::now());  // non-blocking: polls once
        if ((*it)->idle_observed()) {
          done.push_back(std::move(*it));
          it = draining_.erase(it);
        } else {
          draining = true;
          ++it;
        }
      }
      if (draining && !any_waits) {
        any_waits = true;  // nobody waits for these: poll them lazily
        next = clock::time_point::max();
      }
    }
    fire(fired, false);
    done.clear();  // last references to drained streams go here, outside the lock
    if (progress) {
      backoff = std::chrono::microseconds(20);
      continue;
    }
    if (!any_waits) continue;

    const auto now = clock::now();
    if (!any_hybrid && block_stream) {
      // Blocking policy: sleep in the driver on the oldest op, a bounded time so that waits
      // parked meanwhile are not starved.
      block_stream->block_on_front(now + std::chrono::milliseconds(2));
      block_stream.reset();
      continue;
    }
    block_stream.reset();
    std::unique_lock lock(mutex_);
    if (wake_) continue;
    if (any_hybrid && next != clock::time_point::max()) {
      if (next - now > wake_margin) {
        // This thread's own wake-ups run late by oversleep_ (learnt): it asks for that much
        // earlier.
        const auto until = std::min(next - wake_margin - oversleep_, now + max_predicted_sleep);
        set_asleep(true);
        const bool timed_out = cv_.wait_until(lock, until) == std::cv_status::timeout;
        set_asleep(false);
        if (timed_out) {
          const auto late = std::clamp<clock::duration>(clock::now() - until, clock::duration::zero(), max_oversleep);
          oversleep_ = (3 * oversleep_ + late) / 4;
        }
        continue;
      }
      if (now < next + overrun_spin) continue;  // expected any moment: spin
    }
    set_asleep(true);
    cv_.wait_for(lock, backoff);
    set_asleep(false);
    backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace cora::detail
