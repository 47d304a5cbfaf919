// The waiting machinery behind cora::pending: wait nodes, completion sources and op handles.
// Private: no stability promise.
#pragma once

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>

#include "cora/detail/intrusive_ptr.hpp"
#include "cora/error.hpp"

namespace cora::detail {

class completion_source;

/// One waiter. Lives in the awaiting coroutine frame or in an async operation's state, and
/// stays put from arm() until on_complete is called or disarm() succeeds.
struct wait_node {
  /// Called exactly once when the wait completes, with `ec` set. `may_run_inline` is true only
  /// when the caller runs on the waiter's own executor and allows the continuation to run
  /// inside the call; otherwise the function must hand the continuation to its executor.
  void (*on_complete)(wait_node& node, bool may_run_inline) noexcept = nullptr;
  std::error_code ec;

  // Owned by the completion source while armed.
  // 0 armed, 1 completing, 2 withdrawn, 3 handed over (the completer no longer touches the
  // node; only waiters that withdraw in their destructor wait for this state).
  std::atomic<int> state{0};
  bool linked = false;
  bool sync = false;  // a synchronize: reports and clears the source's fault
  std::uint64_t seq = 0;
  wait_node* prev = nullptr;
  wait_node* next = nullptr;
  void* group = nullptr;  // the poll group responsible for detecting completion
  completion_source* source = nullptr;
};

/// Where waits that have no executor of their own complete: a thread owned by cora that runs
/// nothing but such completions (never the thread that detects completions for everyone).
asio::any_io_executor handler_executor() noexcept;

/// Owns a tree of task frames started by cora::spawn or cora::sync_wait. A resumption of one
/// of its frames that is dropped unrun (its execution context was destroyed) destroys the root
/// frame, and with it every frame of the tree, so no suspended frame is left behind.
class frame_owner : public ref_counted {
 public:
  /// Destroys the root frame unless it is already gone. Only the first call has an effect.
  void destroy_root() noexcept {
    if (gone_.exchange(true, std::memory_order_acq_rel)) return;
    if (root_) std::exchange(root_, nullptr).destroy();
  }
  /// The root frame finished or was destroyed: later resumptions are ignored.
  void root_gone() noexcept { gone_.store(true, std::memory_order_release); }
  bool gone() const noexcept { return gone_.load(std::memory_order_acquire); }
  void set_root(std::coroutine_handle<> h) noexcept { root_ = h; }

 private:
  std::coroutine_handle<> root_;
  std::atomic<bool> gone_{false};
};

/// A resumption handed to an executor. Run, it resumes the frame; dropped unrun, it destroys
/// the frame's tree through its owner (frames without an owner belong to someone else).
class resume_op {
 public:
  resume_op(std::coroutine_handle<> h, intrusive_ptr<frame_owner> owner) noexcept
      : h_(h), owner_(std::move(owner)) {}
  resume_op(resume_op&& o) noexcept : h_(std::exchange(o.h_, nullptr)), owner_(std::move(o.owner_)) {}
  resume_op& operator=(resume_op&&) = delete;
  ~resume_op() {
    if (h_ && owner_) owner_->destroy_root();
  }
  void operator()() {
    std::coroutine_handle<> h = std::exchange(h_, nullptr);
    if (owner_ && owner_->gone()) return;
    owner_.reset();
    h.resume();
  }

 private:
  std::coroutine_handle<> h_;
  intrusive_ptr<frame_owner> owner_;
};

/// Something a pending op completes through: a stream position, or a host-side operation.
class completion_source : public ref_counted {
 public:
  /// Cheap completion check that makes no driver call: true once `seq` has completed, with
  /// `ec` set to its result.
  virtual bool ready(std::uint64_t seq, std::error_code& ec) noexcept = 0;
  /// Registers `node` to complete when `seq` has. `executor` is the waiter's executor, whose
  /// own thread should poll; null means the engine thread detects completion and resumes the
  /// waiter inline there. Returns false, with node.ec set, when `seq` has already completed:
  /// the caller completes the wait, and disarm() of the node then returns false.
  virtual bool arm(wait_node& node, std::uint64_t seq, const asio::any_io_executor* executor) = 0;
  /// Withdraws an armed node. Returns true if it was withdrawn before completing (the caller
  /// then completes it itself); false if completion is already under way.
  virtual bool disarm(wait_node& node) noexcept = 0;
  /// Blocks the calling thread until `seq` has completed; returns its result.
  virtual std::error_code block(std::uint64_t seq) = 0;
  /// The detail message of a failure of `seq`.
  virtual std::string message(std::uint64_t seq) const = 0;
  /// The last handle to op `seq` went away. `observed` tells whether its result was looked at.
  virtual void dropped(std::uint64_t seq, bool observed) noexcept = 0;
  /// A waiter of op `seq` was cancelled. Returns true when the op can stop early and will:
  /// it then completes by itself, soon, with asio::error::operation_aborted (or its result,
  /// if it finished first), so the waiter stays armed and sees a defined end state. Device
  /// work cannot be stopped: the default returns false and the waiter is withdrawn at once.
  virtual bool request_cancel(std::uint64_t seq) noexcept {
    (void)seq;
    return false;
  }
};

/// A host-side operation completed from any thread (binary loads, file reads, multi-waits).
class async_state_base : public completion_source {
 public:
  /// Completes the operation and every waiter. Only the first call has an effect.
  void complete(std::error_code ec, std::string message = {});

  bool ready(std::uint64_t, std::error_code& ec) noexcept override;
  bool arm(wait_node& node, std::uint64_t, const asio::any_io_executor* executor) override;
  bool disarm(wait_node& node) noexcept override;
  std::error_code block(std::uint64_t) override;
  std::string message(std::uint64_t) const override;
  void dropped(std::uint64_t, bool observed) noexcept override;

  /// Where an unobserved failure is reported when the last handle goes away (the stream whose
  /// op it was), so that a dropped failed op still surfaces at the next wait on that stream.
  void set_sticky_target(intrusive_ptr<completion_source> stream) { sticky_target_ = std::move(stream); }

 protected:
  mutable std::mutex mutex_;
  std::atomic<bool> done_{false};
  std::error_code ec_;
  std::string message_;
  wait_node* waiters_ = nullptr;
  intrusive_ptr<completion_source> sticky_target_;
};

/// Reports an error that was never observed on a stream (see async_state_base::dropped).
void report_unobserved(completion_source& stream, std::error_code ec, const std::string& message) noexcept;

template <class T>
class async_state : public async_state_base {
 public:
  void set_value(T v) { value_.emplace(std::move(v)); }
  T take_value() {
    if constexpr (std::is_copy_constructible_v<T>)
      return *value_;
    else
      return std::move(*value_);
  }

 private:
  std::optional<T> value_;
};

template <>
class async_state<void> : public async_state_base {};

/// A handle to one op's completion: a source and a position in it. Owns the "dropped" report.
class op_handle {
 public:
  op_handle() = default;
  op_handle(intrusive_ptr<completion_source> source, std::uint64_t seq) noexcept
      : source_(std::move(source)), seq_(seq) {}
  op_handle(op_handle&& o) noexcept
      : source_(std::move(o.source_)), seq_(o.seq_), observed_(o.observed_) {}
  op_handle& operator=(op_handle&& o) noexcept {
    if (this != &o) {
      release();
      source_ = std::move(o.source_);
      seq_ = o.seq_;
      observed_ = o.observed_;
    }
    return *this;
  }
  ~op_handle() { release(); }

  bool valid() const noexcept { return static_cast<bool>(source_); }
  completion_source* source() const noexcept { return source_.get(); }
  const intrusive_ptr<completion_source>& source_ptr() const noexcept { return source_; }
  std::uint64_t seq() const noexcept { return seq_; }
  void observe() noexcept { observed_ = true; }

  bool ready(std::error_code& ec) const noexcept {
    if (!source_) {
      ec = make_error_code(errc::invalid_handle);
      return true;
    }
    return source_->ready(seq_, ec);
  }

 private:
  void release() noexcept {
    if (source_) source_->dropped(seq_, observed_);
    source_.reset();
  }

  intrusive_ptr<completion_source> source_;
  std::uint64_t seq_ = 0;
  bool observed_ = false;
};

/// Throws cora::error for a failed op.
[[noreturn]] void throw_op_error(const op_handle& op, std::error_code ec);

}  // namespace cora::detail
