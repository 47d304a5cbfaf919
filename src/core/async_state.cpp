#include <asio/error.hpp>

#include "core/engine.hpp"
#include "core/graph_state.hpp"
#include "core/state.hpp"

namespace cora::detail {

void async_state_base::complete(std::error_code ec, std::string message) {
  // The list is taken apart under the lock, where disarm() unlinks: a node withdrawn by a
  // concurrent cancellation is never touched here after its owner may have freed it.
  wait_node* fired = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    ec_ = ec;
    message_ = std::move(message);
    done_.store(true, std::memory_order_release);
    wait_node** tail = &fired;
    for (wait_node* n = std::exchange(waiters_, nullptr); n;) {
      wait_node* next = n->next;
      n->prev = n->next = nullptr;
      n->linked = false;
      int expected = 0;
      if (n->state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        n->ec = ec;
        *tail = n;  // ours now: its links form the list of nodes to fire
        tail = &n->next;
      }
      n = next;
    }
  }
  while (fired) {
    wait_node* n = fired;
    fired = n->next;
    n->next = nullptr;
    n->on_complete(*n, false);
  }
}

bool async_state_base::ready(std::uint64_t, std::error_code& ec) noexcept {
  if (!done_.load(std::memory_order_acquire)) return false;
  ec = ec_;
  return true;
}

bool async_state_base::arm(wait_node& node, std::uint64_t, const asio::any_io_executor*) {
  std::lock_guard lock(mutex_);
  if (done_.load(std::memory_order_relaxed)) {
    node.ec = ec_;
    node.state.store(1, std::memory_order_release);  // completed by the caller: not withdrawable
    return false;
  }
  node.source = this;
  node.group = nullptr;
  node.state.store(0, std::memory_order_relaxed);
  node.prev = nullptr;
  node.next = waiters_;
  if (waiters_) waiters_->prev = &node;
  waiters_ = &node;
  node.linked = true;
  return true;
}

bool async_state_base::disarm(wait_node& node) noexcept {
  std::lock_guard lock(mutex_);
  int expected = 0;
  if (!node.state.compare_exchange_strong(expected, 2, std::memory_order_acq_rel)) return false;
  if (node.linked) {
    if (node.prev)
      node.prev->next = node.next;
    else
      waiters_ = node.next;
    if (node.next) node.next->prev = node.prev;
    node.linked = false;
  }
  return true;
}

std::error_code async_state_base::block(std::uint64_t seq) {
  std::error_code ec;
  if (ready(seq, ec)) return ec;
  struct blocking_node : wait_node {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
  } node;
  node.on_complete = [](wait_node& n, bool) noexcept {
    auto& b = static_cast<blocking_node&>(n);
    std::lock_guard lock(b.m);
    b.done = true;
    b.cv.notify_one();
  };
  if (!arm(node, seq, nullptr)) return node.ec;
  std::unique_lock lock(node.m);
  node.cv.wait(lock, [&] { return node.done; });
  return node.ec;
}

std::string async_state_base::message(std::uint64_t) const {
  std::lock_guard lock(mutex_);
  return message_;
}

void async_state_base::dropped(std::uint64_t, bool observed) noexcept {
  if (observed || !sticky_target_) return;
  std::error_code ec;
  if (!ready(0, ec) || !ec) return;
  std::lock_guard lock(mutex_);
  report_unobserved(*sticky_target_, ec, message_);
}

void report_unobserved(completion_source& stream, std::error_code ec,
                       const std::string& message) noexcept {
  static_cast<stream_state&>(stream).set_sticky(ec, message);
}

op_handle failed_op(std::error_code ec, std::string message, stream_state* stream) {
  auto st = make_intrusive<async_state<void>>();
  // During a capture a failed check abandons the capture, which end_capture() reports.
  if (stream && stream->capturing.load(std::memory_order_acquire)) {
    capture_invalidate(*stream, ec, message);
    stream = nullptr;
  }
  if (stream) st->set_sticky_target(intrusive_ptr<completion_source>::share(stream));
  st->complete(ec, std::move(message));
  return op_handle(intrusive_ptr<completion_source>(std::move(st)), 0);
}

}  // namespace cora::detail
