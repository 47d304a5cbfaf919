#include <algorithm>
#include <thread>

#include "asio/error.hpp"
#include "core/state.hpp"

namespace cora::detail {

namespace {
constexpr std::size_t keepalive_trim = 256;
// The longest a hybrid poll holds back its query of an op that has begun (watch_front_locked).
constexpr auto max_query_hold = std::chrono::milliseconds(1);
}


stream_state::stream_state(std::shared_ptr<device_state> dev, std::unique_ptr<backend::stream> bs)
    : device(std::move(dev)),
      backend(std::move(bs)),
      policy(device->runtime->options.completion),
      spin_limit(device->runtime->options.spin_limit),
      bell_(backend->bell()) {
  device->add_stream(this);
}

stream_state::~stream_state() {
  // Only reached when nothing refers to the stream any more, so its ops were waited for (or
  // drained by the engine). Wait anyway before destroying the backend stream.
  const bool drained = drain(clock::now() + std::chrono::seconds(30));
  {
    std::lock_guard lock(mutex_);
    markers_.for_each([&](marker_rec& m) { backend->release_marker(m.m); });
    markers_.clear();
    watch_front_locked();
    arena_.release(*device);
    device->remove_stream(this);
  }
  // Destroying a driver stream may wait for the device: done on a cora thread.
  device->retire_stream(std::move(backend), drained && pooled);
}

void stream_state::record_marker_locked(std::uint64_t seq) {
  const backend::marker m = backend->record_marker(seq);
  {
    std::lock_guard lock(mutex_);
    markers_.push_back({m, clock::now()});
    if (markers_.size() == 1) watch_front_locked();
  }
  last_marked_.store(seq, std::memory_order_release);
}

void stream_state::note_marker_for_tail_locked() {
  // The previous op's pending is still held: its completion may be awaited after this op is
  // enqueued, so it needs a marker of its own.
  const std::uint64_t last = last_seq_.load(std::memory_order_relaxed);
  if (last != 0 && tail_watch_.load(std::memory_order_acquire) == last && !marked(last))
    record_marker_locked(last);
}

// ---------------------------------------------------------------------------------------------
// keep-alives

void keep_ring::push(std::uint64_t seq, op_keep&& k) {
  if (size_ == buf_.size()) {
    // Grow (the only allocation): unroll into a buffer twice the size.
    std::vector<entry> bigger(buf_.empty() ? 64 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_.swap(bigger);
    head_ = 0;
  }
  entry& e = buf_[(head_ + size_) & (buf_.size() - 1)];
  e.seq = seq;
  e.keep = std::move(k);
  ++size_;
}

void keep_ring::pop_into(op_keep& out) noexcept {
  out = std::move(buf_[head_].keep);
  head_ = (head_ + 1) & (buf_.size() - 1);
  --size_;
}

namespace {
// Each thread's spare list of released keep-alives (capacity kept between uses).
thread_local std::vector<op_keep> spare_drop;
}  // namespace

keep_drop::keep_drop() noexcept : items_(std::move(spare_drop)) { spare_drop.clear(); }

keep_drop::~keep_drop() {
  release();
  // Hand the capacity back unless a nested release already left a larger list.
  if (items_.capacity() > spare_drop.capacity()) spare_drop = std::move(items_);
}

op_keep& keep_drop::next() {
  if (used_ == items_.size()) items_.emplace_back();
  return items_[used_++];
}

void keep_drop::release() noexcept {
  // Releasing may drop the last reference of another stream (whose destructor polls): each
  // nested poll takes its own list.
  for (std::size_t i = 0; i < used_; ++i) items_[i].clear();
  used_ = 0;
}

void stream_state::commit_locked(std::uint64_t seq) noexcept {
  last_seq_.store(seq, std::memory_order_release);
  tail_watch_.store(seq, std::memory_order_release);
}

void stream_state::commit_locked(std::uint64_t seq, op_keep keep, std::optional<keep_drop>& drop) {
  commit_locked(seq);
  if (keep.empty()) return;
  {
    std::lock_guard lock(mutex_);
    keepalive_.push(seq, std::move(keep));
    if (keepalive_.size() < trim_at_) return;
  }
  // Nobody has waited on this stream for a while: observe its progress so that what finished
  // ops kept alive is released. Waiters are left to their pollers.
  if (!marked(seq)) record_marker_locked(seq);
  std::lock_guard lock(mutex_);
  releasing_.fetch_add(1, std::memory_order_relaxed);  // before completed_ can move
  advance_locked(drop.emplace());
  trim_at_ = keepalive_.size() + keepalive_trim;
  if (drop->empty()) releasing_.fetch_sub(1, std::memory_order_release);
}

void stream_state::release_trimmed(keep_drop& drop) noexcept {
  // Outside both locks: a release may free memory in stream order, on this stream too.
  drop.release();
  releasing_.fetch_sub(1, std::memory_order_release);
}

void stream_state::keep_until_tail(op_keep keep) {
  if (keep.empty()) return;
  keep_drop drop;  // released last, outside the locks
  std::lock_guard submit(submit_mutex_);
  const std::uint64_t last = last_seq_.load(std::memory_order_relaxed);
  if (completed_.load(std::memory_order_acquire) >= last) {
    drop.next() = std::move(keep);  // nothing in flight: release now
    return;
  }
  // Tied to the last op so far; a marker there lets a later poll see it complete.
  if (!marked(last)) record_marker_locked(last);
  std::lock_guard lock(mutex_);
  if (completed_.load(std::memory_order_relaxed) >= last)
    drop.next() = std::move(keep);
  else
    keepalive_.push(last, std::move(keep));
}

void stream_state::mark(std::uint64_t seq) {
  std::lock_guard lock(submit_mutex_);
  if (seq == last_seq_.load(std::memory_order_relaxed) && !marked(seq)) record_marker_locked(seq);
}

op_handle stream_state::synchronize_handle() {
  std::lock_guard lock(submit_mutex_);
  const std::uint64_t last = last_seq_.load(std::memory_order_relaxed);
  if (last != 0 && !marked(last) && completed_.load(std::memory_order_acquire) < last)
    record_marker_locked(last);
  return op_handle(intrusive_ptr<completion_source>::share(this), last | sync_bit);
}

bool stream_state::query_idle() {
  {
    std::lock_guard lock(submit_mutex_);
    const std::uint64_t last = last_seq_.load(std::memory_order_relaxed);
    if (completed_.load(std::memory_order_acquire) >= last) return true;
    if (!marked(last)) record_marker_locked(last);
  }
  std::vector<wait_node*> fired;
  poll(fired);
  fire(fired, false);
  return idle_observed();
}

bool stream_state::idle_observed() noexcept {
  return completed_.load(std::memory_order_acquire) >= last_seq_.load(std::memory_order_acquire);
}

std::error_code stream_state::result_locked(std::uint64_t seq, bool sync) noexcept {
  const std::uint64_t err = error_seq_.load(std::memory_order_acquire);
  // A synchronize also reports failures dropped right after the op it waits for.
  if (err == ~std::uint64_t{0} || err > seq + (sync ? 1 : 0)) return {};
  std::error_code ec = error_;
  if (sync) {
    error_seq_.store(~std::uint64_t{0}, std::memory_order_release);
    error_.clear();
    backend->resume();  // a stream that stops on failure takes work again once it was reported
  }
  return ec;
}

bool stream_state::ready(std::uint64_t seq, std::error_code& ec) noexcept {
  const bool sync = seq & sync_bit;
  const std::uint64_t s = seq & ~sync_bit;
  if (s > completed_.load(std::memory_order_acquire)) return false;
  if (error_seq_.load(std::memory_order_acquire) == ~std::uint64_t{0}) {
    ec.clear();
    return true;
  }
  std::lock_guard lock(mutex_);
  ec = result_locked(s, sync);
  return true;
}

void stream_state::link_locked(wait_node& node) {
  // Waiters are kept sorted by position; new ones usually go last.
  wait_node* after = tail_;
  while (after && after->seq > node.seq) after = after->prev;
  node.prev = after;
  node.next = after ? after->next : head_;
  if (node.next)
    node.next->prev = &node;
  else
    tail_ = &node;
  if (after) {
    after->next = &node;
  } else {
    head_ = &node;
    watch_head_locked();
  }
  node.linked = true;
}

void stream_state::unlink_locked(wait_node& node) noexcept {
  if (!node.linked) return;
  if (node.prev) {
    node.prev->next = node.next;
  } else {
    head_ = node.next;
    watch_head_locked();
  }
  if (node.next)
    node.next->prev = node.prev;
  else
    tail_ = node.prev;
  node.prev = node.next = nullptr;
  node.linked = false;
}

bool stream_state::arm(wait_node& node, std::uint64_t seq, const asio::any_io_executor* executor) {
  poll_group* group;
  if (executor) {
    group = &executor_group::of(*executor).lane(*executor);
  } else {
    group = &engine::get().inline_group();
  }
  const bool sync = seq & sync_bit;
  const std::uint64_t s = seq & ~sync_bit;
  node.seq = s;
  node.source = this;
  node.group = group;
  node.state.store(0, std::memory_order_relaxed);
  group->begin_wait(this);
  intrusive_ptr<stream_state> hold;  // dropped after the lock
  // A marker at or after the awaited op. Right after enqueue the op is the tail and gets its
  // own marker; an older op got one when the next op was enqueued while its pending lived.
  if (s != 0 && !marked(s) && completed_.load(std::memory_order_acquire) < s) {
    std::lock_guard submit(submit_mutex_);
    if (!marked(s) && completed_.load(std::memory_order_acquire) < s)
      record_marker_locked(last_seq_.load(std::memory_order_relaxed));
  }
  {
    std::lock_guard lock(mutex_);
    if (s <= completed_.load(std::memory_order_relaxed) || s == 0) {
      node.ec = result_locked(s, sync);
      uncount_locked(node, hold);
      node.group = nullptr;
      // Completing now, by the caller: a cancellation that arrives before the caller's
      // completion has run must not withdraw (and so complete) the wait a second time.
      node.state.store(1, std::memory_order_release);
      return false;
    }
    if (group->closed()) {
      // The group's context is being destroyed: its shutdown may have withdrawn its waits
      // already, so this one ends here, as they did.
      node.ec = make_error_code(asio::error::operation_aborted);
      uncount_locked(node, hold);
      node.group = nullptr;
      node.state.store(1, std::memory_order_release);
      return false;
    }
    node.sync = sync;
    link_locked(node);
  }
  group->schedule();
  return true;
}

bool stream_state::disarm(wait_node& node) noexcept {
  int expected = 0;
  if (!node.state.compare_exchange_strong(expected, 2, std::memory_order_acq_rel)) return false;
  intrusive_ptr<stream_state> hold;  // dropped after the lock
  std::lock_guard lock(mutex_);
  unlink_locked(node);
  uncount_locked(node, hold);
  return true;
}

void stream_state::uncount_locked(wait_node& node, intrusive_ptr<stream_state>& hold) noexcept {
  if (!node.group) return;
  intrusive_ptr<stream_state> ref = static_cast<poll_group*>(node.group)->end_wait(this);
  // Every reference returned is to this stream; holding the first keeps any other from being
  // the last one while the lock is held.
  if (ref && !hold) hold = std::move(ref);
}

void stream_state::claim_locked(wait_node& node, intrusive_ptr<stream_state>& hold) noexcept {
  if (node.group) static_cast<poll_group*>(node.group)->claimed();  // before it is uncounted
  uncount_locked(node, hold);
}

void stream_state::watch_front_locked() noexcept {
  const bool rings = bell_.word && !markers_.empty() && markers_.front().m.rings;
  bell_watch_.store(rings ? markers_.front().m.seq : 0, std::memory_order_release);
  auto expected = clock::time_point::max();
  auto due = clock::time_point::min();
  if (!markers_.empty() && ewma_ns_ != 0) {
    const auto start = std::max(markers_.front().enqueued, last_done_);
    const auto length = std::chrono::nanoseconds(static_cast<std::int64_t>(ewma_ns_));
    expected = start + length;
    // Hybrid policy, a marker that must be queried: each query is a driver call, which the
    // driver serializes with every thread's submissions, so the oldest op is not asked about
    // until shortly before it is expected to end (an eighth of its length, 2 to 50 us), nor
    // later than max_query_hold after it began (an estimate learnt from a long op must not
    // hold up the short ops after it). An op found done at its first query shrinks the
    // estimate (learn_locked), so the queries move earlier until one finds it pending.
    if (!rings && policy == completion_policy::hybrid) {
      const auto lead = std::clamp<clock::duration>(length / 8, std::chrono::microseconds(2),
                                                     std::chrono::microseconds(50));
      due = std::min(expected - lead, start + max_query_hold);
    }
  }
  expected_at_.store(expected.time_since_epoch().count(), std::memory_order_relaxed);
  query_due_.store(due.time_since_epoch().count(), std::memory_order_relaxed);
}

bool stream_state::due(clock::time_point now) const noexcept {
  if (now.time_since_epoch().count() >= query_due_.load(std::memory_order_relaxed)) return true;
  // A blocking wait or a trim may have moved the completed position past a waiter.
  return completed_.load(std::memory_order_acquire) >= head_seq_.load(std::memory_order_acquire);
}

bool stream_state::quiet(clock::time_point now) noexcept {
  if (!bell_.word) return false;
  const std::uint64_t watch = bell_watch_.load(std::memory_order_acquire);
  if (watch == 0) return false;
  // 32-bit positions compared modulo 2^32, as the device writes them.
  const std::uint32_t rung = __atomic_load_n(bell_.word, __ATOMIC_ACQUIRE);
  if (static_cast<std::int32_t>(rung - static_cast<std::uint32_t>(watch)) >= 0) return false;
  // A blocking wait or a trim may have moved the completed position without firing waiters.
  if (completed_.load(std::memory_order_acquire) >= head_seq_.load(std::memory_order_acquire))
    return false;
  const clock::rep t = now.time_since_epoch().count();
  if (bell_.recheck.count() != 0 && t >= recheck_at_.load(std::memory_order_relaxed)) return false;
  // Written at most once a microsecond: pollers on other threads read this line too.
  if (t - pending_seen_.load(std::memory_order_relaxed) > 1000)
    pending_seen_.store(t, std::memory_order_relaxed);
  return true;
}

// Learns how long ops take, for the hybrid policy's sleeps. A detection right after a pending
// query measures the duration; a late one only bounds it.
void stream_state::learn_locked(const marker_rec& front, clock::time_point now) noexcept {
  const auto start = std::max(front.enqueued, last_done_);
  const double upper = std::chrono::duration<double, std::nano>(now - start).count();
  if (now - last_pending_query_ <= std::chrono::microseconds(20) || ewma_ns_ == 0) {
    ewma_ns_ = ewma_ns_ == 0 ? upper : 0.75 * ewma_ns_ + 0.25 * upper;
    late_in_row_ = 0;
    return;
  }
  const double lower = last_pending_query_ > start
                           ? std::chrono::duration<double, std::nano>(last_pending_query_ - start).count()
                           : 0.0;
  // Found done with no pending query just before: the op was shorter than predicted, or a
  // wake-up came late. Shrink toward the lower bound: a clamp to [lower, upper] would keep an
  // overestimate for ever, since every later detection then comes late and bounds it from
  // above only. A lone late detection (a wake-up that came late) shrinks the estimate by an
  // eighth, so that the next op is polled a little early and measured; a second in a row
  // (ops that became shorter) halves it, to find the new length in a few ops.
  const double shrink = ++late_in_row_ >= 2 ? 0.5 : 0.875;
  ewma_ns_ = std::max(lower, std::min(ewma_ns_, upper) * shrink);
}

bool stream_state::advance_locked(keep_drop& drop) {
  bool progress = false;
  const auto now = clock::now();
  // A lock-free poll that saw the oldest marker pending counts as a pending query.
  last_pending_query_ = std::max(
      last_pending_query_, clock::time_point(clock::duration(pending_seen_.load(std::memory_order_relaxed))));
  if (last_pending_query_ > now) last_pending_query_ = now;
  while (!markers_.empty()) {
    marker_rec& front = markers_.front();
    const auto st = backend->query(front.m);
    if (st == backend::marker_state::pending) {
      last_pending_query_ = now;
      if (bell_.recheck.count() != 0)
        recheck_at_.store((now + bell_.recheck).time_since_epoch().count(), std::memory_order_relaxed);
      break;
    }
    if (st == backend::marker_state::failed) {
      backend::fault f = backend->take_fault();
      const std::uint64_t at = f.seq ? f.seq : completed_.load(std::memory_order_relaxed) + 1;
      if (at < error_seq_.load(std::memory_order_relaxed)) {
        error_ = f.ec ? f.ec : make_error_code(errc::kernel_fault);
        error_message_ = f.message.empty() ? "device fault" : f.message;
        error_seq_.store(at, std::memory_order_release);
      }
    }
    // Only the first op found done in a pass teaches how long ops take: the ones after it
    // ended at some time before now, and began when the one before ended, also before now.
    if (!progress) learn_locked(front, now);
    last_done_ = now;
    completed_.store(front.m.seq, std::memory_order_release);
    backend->release_marker(front.m);
    markers_.pop_front();
    progress = true;
  }
  if (progress) watch_front_locked();
  const std::uint64_t done = completed_.load(std::memory_order_relaxed);
  while (!keepalive_.empty() && keepalive_.front_seq() <= done) keepalive_.pop_into(drop.next());
  if (keepalive_.size() < keepalive_trim) trim_at_ = keepalive_trim;
  return progress;
}

bool stream_state::poll_locked(std::vector<wait_node*>& fired, keep_drop& drop,
                               intrusive_ptr<stream_state>& hold) {
  const std::size_t fired_before = fired.size();
  const bool progress = advance_locked(drop);
  const std::uint64_t done = completed_.load(std::memory_order_relaxed);
  while (head_ && head_->seq <= done) {
    wait_node* n = head_;
    unlink_locked(*n);
    int expected = 0;
    if (!n->state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
    n->ec = result_locked(n->seq, n->sync);
    claim_locked(*n, hold);
    fired.push_back(n);
  }
  return progress || fired.size() > fired_before;
}


bool stream_state::poll_now(std::vector<wait_node*>& fired, clock::time_point now) {
  if (quiet(now)) return false;
  keep_drop drop;
  intrusive_ptr<stream_state> hold;  // dropped last, after the lock
  bool progress;
  {
    std::lock_guard lock(mutex_);
    locked_polls_.store(locked_polls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // Counted before completed_ can move: a blocking wait that sees its op complete then
    // sees this poll's release still to come.
    const bool keeps = !keepalive_.empty();
    if (keeps) releasing_.fetch_add(1, std::memory_order_relaxed);
    progress = poll_locked(fired, drop, hold);
    if (!keeps) return progress;
  }
  drop.release();  // finished ops' resources go here, outside the lock
  releasing_.fetch_sub(1, std::memory_order_release);
  return progress;
}

clock::time_point stream_state::expected_ready() const noexcept {
  return clock::time_point(clock::duration(expected_at_.load(std::memory_order_relaxed)));
}

void stream_state::block_on_front(clock::time_point deadline) {
  backend::marker m;
  {
    std::lock_guard lock(mutex_);
    if (markers_.empty()) return;
    m = markers_.front().m;
  }
  // The marker stays valid: only pollers pop it, and they release it after this returns only
  // if it completed, which ends this wait too.
  backend->wait_marker(m, deadline);
}


namespace {
thread_local host_func_scope* current_host_func = nullptr;
}

host_func_scope::host_func_scope(const stream_state* s) noexcept
    : stream(s), device(s->device.get()), outer_(current_host_func) {
  current_host_func = this;
}
host_func_scope::~host_func_scope() { current_host_func = outer_; }
const host_func_scope* host_func_scope::current() noexcept { return current_host_func; }

bool stream_state::advance() {
  if (quiet(clock::now())) return false;
  keep_drop drop;
  bool progress;
  {
    std::lock_guard lock(mutex_);
    const bool keeps = !keepalive_.empty();
    if (keeps) releasing_.fetch_add(1, std::memory_order_relaxed);  // as in poll()
    progress = advance_locked(drop);
    if (!keeps) return progress;
  }
  drop.release();  // finished ops' resources go here, outside the lock
  releasing_.fetch_sub(1, std::memory_order_release);
  return progress;
}

void stream_state::settle_releases() const noexcept {
  // Bounded: a release never waits on this stream, but nothing must hang if one ever did.
  for (int i = 0; i < 10000 && releasing_.load(std::memory_order_acquire) != 0; ++i)
    std::this_thread::yield();
}

std::error_code stream_state::block(std::uint64_t seq) {
  std::error_code ec;
  if (ready(seq, ec)) {
    settle_releases();
    return ec;
  }
  if (const host_func_scope* h = host_func_scope::current(); h && h->stream == this) {
    // The host function is an op of this stream: everything after it waits for it to return.
    set_error(ec, std::make_error_code(std::errc::resource_deadlock_would_occur),
              "a host function waited for its own stream; the stream cannot run past the "
              "host function until it returns (CUDA forbids the same)");
    return ec;
  }

  const bool sync = seq & sync_bit;
  const std::uint64_t s = seq & ~sync_bit;
  if (!marked(s)) {
    std::lock_guard lock(submit_mutex_);
    if (s > completed_.load(std::memory_order_acquire) && !marked(s))
      record_marker_locked(last_seq_.load(std::memory_order_relaxed));
  }
  // This thread detects only its own op: it advances the stream's completed position and
  // leaves every other waiter to its own poller, so no one else's continuation runs here.
  const auto start = clock::now();
  while (completed_.load(std::memory_order_acquire) < s) {
    if (advance()) continue;
    const auto now = clock::now();
    if (policy == completion_policy::spin || now - start < spin_limit) {
      std::this_thread::yield();
      continue;
    }
    // Long wait: sleep in the backend until the oldest marker completes, or until shortly
    // before it is expected to, then poll again.
    auto deadline = now + std::chrono::milliseconds(10);
    if (policy == completion_policy::hybrid) {
      const auto expected = expected_ready();
      if (expected != clock::time_point::max())
        deadline = std::max(now + std::chrono::microseconds(20), expected - std::chrono::microseconds(20));
      else
        deadline = now + std::chrono::microseconds(100);
    }
    block_on_front(deadline);
  }
  settle_releases();
  std::lock_guard lock(mutex_);
  return result_locked(s, sync);
}

std::string stream_state::message(std::uint64_t) const {
  std::lock_guard lock(mutex_);
  return error_message_;
}

void stream_state::dropped(std::uint64_t seq, bool) noexcept {
  std::uint64_t expected = seq & ~sync_bit;
  tail_watch_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
}

void stream_state::set_sticky(std::error_code ec, const std::string& message) noexcept {
  std::lock_guard lock(mutex_);
  const std::uint64_t at = last_seq_.load(std::memory_order_acquire) + 1;
  if (error_seq_.load(std::memory_order_relaxed) <= at) return;  // an earlier failure stands
  error_ = ec;
  try {
    error_message_ = message;
  } catch (...) {
  }
  error_seq_.store(at, std::memory_order_release);
}

void stream_state::abort_waits(std::error_code ec, poll_group* only) noexcept {
  std::vector<wait_node*> fired;
  intrusive_ptr<stream_state> hold;  // dropped last, after the lock
  {
    std::lock_guard lock(mutex_);
    for (wait_node* n = head_; n;) {
      wait_node* next = n->next;
      if (!only || n->group == only) {
        int expected = 0;
        if (n->state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
          unlink_locked(*n);
          claim_locked(*n, hold);
          n->ec = ec;
          fired.push_back(n);
        }
      }
      n = next;
    }
  }
  fire(fired, false);
}

void stream_state::detach_native() noexcept {
  std::lock_guard lock(submit_mutex_);
  const std::uint64_t last = last_seq_.load(std::memory_order_relaxed);
  if (completed_.load(std::memory_order_acquire) < last && !marked(last)) {
    try {
      record_marker_locked(last);
    } catch (...) {
      // Without room for the marker the drain records none either: the stream then stays
      // until the device is shut down, which is safe.
    }
  }
  backend->detach();
}

bool stream_state::drain(clock::time_point deadline) noexcept {
  for (;;) {
    {
      std::lock_guard lock(submit_mutex_);
      const std::uint64_t last = last_seq_.load(std::memory_order_relaxed);
      if (completed_.load(std::memory_order_acquire) >= last) return true;
      if (!marked(last)) record_marker_locked(last);
    }
    std::vector<wait_node*> fired;
    if (poll(fired)) {
      fire(fired, false);
      continue;
    }
    if (clock::now() >= deadline) return false;
    block_on_front(std::min(deadline, clock::now() + std::chrono::milliseconds(10)));
  }
}

}  // namespace cora::detail
