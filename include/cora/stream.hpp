// cora::stream: an in-order queue of device work.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cora/binary.hpp"
#include "cora/detail/intrusive_ptr.hpp"
#include "cora/detail/kernel_arg.hpp"
#include "cora/event.hpp"
#include "cora/graph.hpp"
#include "cora/kernel_args.hpp"
#include "cora/launch.hpp"
#include "cora/memory.hpp"
#include "cora/pending.hpp"

namespace cora {

class device;

namespace detail {
class stream_state;

template <class B>
concept byte_buffer = requires(const B& b) {
  { b.data() };
  { b.size_bytes() } -> std::convertible_to<std::size_t>;
};
}  // namespace detail

/// Options of a new stream.
struct stream_options {
  /// Priority, where the backend has priorities (0 = default).
  int priority = 0;
};

/// How stream::wait_value compares the word in memory with its operand (the conditions of
/// CUDA's cuStreamWaitValue and CANN's aclrtValueWait, same values).
enum class wait_condition : std::uint8_t {
  geq = 0,          ///< (signed)(*addr - value) >= 0: a cyclic "at least", for counters
  eq = 1,           ///< *addr == value
  and_nonzero = 2,  ///< (*addr & value) != 0
  nor_nonzero = 3,  ///< ~(*addr | value) != 0
};

/// Options of stream::read_file.
struct read_options {
  /// Bytes per staging buffer (rounded up to 4 KiB for O_DIRECT; at most 512 MiB).
  std::size_t chunk_bytes = std::size_t{4} << 20;
  /// Staging buffers, hence chunks being read or copied at once (at least 1).
  unsigned depth = 4;
  /// Read with O_DIRECT into aligned, registered staging buffers where the file system allows
  /// (bypassing the page cache); buffered reads otherwise, or when it refuses (EINVAL).
  bool direct = true;
  /// Read on the blocking fallback thread (pread) even where io_uring is available.
  bool force_blocking = false;
};

/// An in-order queue of device work.
///
/// Every operation is enqueued when the call is made (stream order is call order) and returns a
/// cora::pending for its completion. Operations on different streams may run concurrently.
/// Validation errors (bad pointer, wrong argument size...) complete the returned pending with
/// the error at once; if it is dropped unobserved, the error surfaces at the next wait on this
/// stream. A device fault fails the faulting op's waiters and every later waiter on this stream
/// until synchronize() reports it; other streams are unaffected.
///
/// Destroying a stream with work in flight is allowed: the work completes, then the stream is
/// freed.
///
/// @par Thread safety
/// Operations may be enqueued from several threads; each call is atomic.
class stream {
 public:
  stream() noexcept = default;
  explicit stream(detail::intrusive_ptr<detail::completion_source> s) noexcept;
  stream(stream&&) noexcept;
  stream& operator=(stream&&) noexcept;
  ~stream();

  // --- copies and fills ---------------------------------------------------------------------

  /// Copies `bytes` from `src` to `dst`, in whichever direction the two addresses tell
  /// (host-to-device, device-to-host, device-to-device, host-to-host), as CANN does. Device
  /// ranges must lie inside live allocations. Pageable host memory is allowed: a source is
  /// read before this call returns; a destination must stay alive until completion.
  pending<void> copy(void* dst, const void* src, std::size_t bytes);
  /// Copies all of `src` into `dst` (device_buffer, host_buffer, std::span...).
  template <detail::byte_buffer D, detail::byte_buffer S>
  pending<void> copy(D&& dst, const S& src) {
    return copy_checked(to_void(dst.data()), dst.size_bytes(), src.data(), src.size_bytes());
  }
  /// Sets `bytes` bytes at `dst` to `value`.
  pending<void> fill(void* dst, std::uint8_t value, std::size_t bytes);
  template <detail::byte_buffer D>
  pending<void> fill(D&& dst, std::uint8_t value) {
    return fill(to_void(dst.data()), value, dst.size_bytes());
  }

  // --- memory ---------------------------------------------------------------------------------

  /// Allocates `n` elements of device memory for work on this stream, as a pending (errors:
  /// errc::out_of_memory, errc::invalid_argument for n == 0). The memory comes from the
  /// device's stream-ordered pool and is usable by this and every other stream as soon as the
  /// pending completes, which it does without waiting for earlier work (allocation never waits
  /// for the device). Pairs with free() for a buffer whose life is one stream's work.
  template <class T>
  pending<device_buffer<T>> alloc(std::size_t n) {
    auto st = detail::make_intrusive<detail::async_state<device_buffer<T>>>();
    std::shared_ptr<detail::device_state> owner;
    std::error_code ec;
    void* p = alloc_raw(n * sizeof(T), owner, ec);
    if (ec) {
      st->complete(ec, last_error_message());
    } else {
      st->set_value(device_buffer<T>(std::move(owner), static_cast<T*>(p), n));
      st->complete({});
    }
    return pending<device_buffer<T>>(
        detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(st)), 0));
  }

  /// Frees `buffer` once everything enqueued on this stream so far has completed (without
  /// blocking), also where that work used the memory through addresses cora cannot see (a
  /// pointer inside a struct argument, a foreign library's kernel on an adopted stream).
  /// Ops cora saw using the buffer hold it anyway, on whichever stream they run.
  template <class T, detail::memory_space Space>
  void free(basic_buffer<T, Space>&& buffer) {
    auto* owner = buffer.owner();
    free_after(owner, buffer.release(), Space == detail::memory_space::host);
  }

  // --- launches -------------------------------------------------------------------------------

  /// Launches `k` with typed arguments, checked against the kernel's parameters (count and
  /// sizes; raw pointers must lie in live allocations of this device, device_buffers pass
  /// their address). A mismatch fails the launch with errc::argument_mismatch.
  template <class... Args>
  pending<void> launch(const kernel& k, const launch_config& cfg, Args&&... args) {
    auto values = std::make_tuple(detail::to_launch_arg(args)...);
    return std::apply(
        [&](auto&... a) {
          const std::array<detail::arg_view, sizeof...(Args)> views{detail::view_of(a)...};
          return launch_typed(k, cfg, views);
        },
        values);
  }
  /// Launches `k` with a finalized argument list (placeholders included).
  pending<void> launch(const kernel& k, const launch_config& cfg, const kernel_args& args);
  pending<void> launch(const kernel& k, const launch_config& cfg, kernel_args& args) {
    return launch(k, cfg, static_cast<const kernel_args&>(args));
  }
  /// Launches `k` with a complete argument block in host memory: canonical parameters, then
  /// optional placeholder data; each placeholder slot receives the device address of the copy
  /// of its data (CANN's aclrtLaunchKernelWithHostArgs).
  pending<void> launch_host_block(const kernel& k, const launch_config& cfg,
                                  std::span<const std::byte> block,
                                  std::span<const placeholder_info> placeholders = {});
  /// Launches `k` with one pointer per parameter, each to that parameter's value (CANN's
  /// aclrtLaunchKernelWithArgsArray).
  pending<void> launch_pointer_array(const kernel& k, const launch_config& cfg,
                                     const void* const* args);
  /// Launches `k` with a canonical argument block that already lives in device memory (CANN's
  /// aclrtLaunchKernel). The CUDA backend refuses it (errc::not_supported): a GPU launch takes
  /// its parameters from the host.
  pending<void> launch_device_block(const kernel& k, const launch_config& cfg,
                                    const void* device_block, std::size_t bytes);

  // --- ordering and host work -----------------------------------------------------------------

  /// Records `ev` here: it now stands for the work enqueued so far.
  pending<void> record(event& ev);
  /// Later work on this stream waits until `ev`'s recorded work has completed.
  pending<void> wait(const event& ev);
  /// Later work on this stream waits until the word at `addr` satisfies `cond` against `value`,
  /// however it gets there: written by another stream (write_value, a copy, a kernel) or by
  /// the host. `addr` lies in device memory of this device or in pinned host memory, aligned
  /// to the word's size (errc::invalid_pointer otherwise). On CUDA only pinned host memory
  /// (alloc_host) serves: the driver's stream memory operations do not take the pool memory of
  /// alloc (errc::invalid_pointer, at once); a 64-bit word or the NOR condition on a device
  /// without them is errc::not_supported. The wait has no deadline; it ends with
  /// errc::runtime_shut_down when the runtime shuts down (on a GPU the stream itself stays
  /// blocked until the word holds). Cannot be captured.
  pending<void> wait_value(const std::uint32_t* addr, std::uint32_t value,
                           wait_condition cond = wait_condition::geq);
  pending<void> wait_value(const std::uint64_t* addr, std::uint64_t value,
                           wait_condition cond = wait_condition::geq);
  /// Writes `value` at `addr` (memory as for wait_value) in stream order, in one store that a
  /// wait_value observes whole. On CUDA a word in alloc's memory, which no wait_value there can
  /// watch, is written by a stream-ordered copy. Cannot be captured.
  pending<void> write_value(std::uint32_t* addr, std::uint32_t value);
  pending<void> write_value(std::uint64_t* addr, std::uint64_t value);
  /// Runs `fn` on a device thread once earlier work has completed; later work waits for it.
  /// `fn` must not wait for its own stream: such a wait (or its device's synchronize().wait())
  /// fails at once with std::errc::resource_deadlock_would_occur.
  pending<void> host_func(std::function<void()> fn);
  /// Returns an awaitable that completes when everything enqueued so far has completed, and
  /// reports (then clears) a device fault of this stream. It does not block: `co_await` it or
  /// call `.wait()` on it (a bare `s.synchronize();` waits for nothing and does not compile
  /// cleanly: pending is [[nodiscard]]).
  pending<void> synchronize();

  // --- failure mode ---------------------------------------------------------------------------

  /// With `stop`, once an op of this stream fails, the ops behind it that have not started are
  /// not run: they fail with that failure (so do their waiters), until synchronize() reports
  /// it; work enqueued after that runs again. Without (the default), they run, and the failure
  /// still surfaces at the next wait. Ops of other streams are unaffected.
  /// @throws cora::error (errc::not_supported where the backend cannot hold back work it has
  ///         already handed to the device: CUDA).
  void stop_on_failure(bool stop);
  void stop_on_failure(bool stop, std::error_code& ec);

  /// Discards the work enqueued so far that has not started: those ops complete, failed with
  /// errc::aborted (as does a wait_value in progress), and the failure surfaces at the next
  /// synchronize(); an op already running (a launch, a copy) finishes. Does not block.
  /// @throws cora::error (errc::not_supported where the backend cannot recall work it has
  ///         handed to the device: CUDA).
  void abort();
  void abort(std::error_code& ec);

  // --- graphs -------------------------------------------------------------------------------

  /// Starts capturing: until end_capture(), ops on this stream are checked as usual and become
  /// nodes of a graph instead of running (their pendings complete at once). Another stream
  /// joins the capture by waiting for an event recorded here during it, and must be joined
  /// back (this stream waits for an event recorded there) before end_capture(). Ops that
  /// cannot be captured (synchronize(), read_file(), a wait for an event recorded outside
  /// the capture, a launch with placeholders, graph_exec::launch) and ops that fail their
  /// checks fail with their error and abandon the capture: end_capture() then reports it.
  /// @throws cora::error (errc::illegal_in_capture when the stream already captures).
  void begin_capture();
  void begin_capture(std::error_code& ec);
  /// Ends the capture begun on this stream and returns the graph.
  /// @throws cora::error (errc::illegal_in_capture when the capture was abandoned, with the
  ///         op that abandoned it; errc::invalid_argument when this stream did not begin it).
  graph end_capture();
  graph end_capture(std::error_code& ec);
  /// Captures what `body(*this)` enqueues: begin_capture(), body, end_capture(). The pending
  /// is complete when returned; it fails when the capture was abandoned. If `body` throws,
  /// the capture is abandoned and the exception propagates.
  template <class F>
  pending<graph> capture(F&& body) {
    std::error_code ec;
    begin_capture(ec);
    if (ec) return capture_result({}, ec);
    try {
      std::forward<F>(body)(*this);
    } catch (...) {
      abandon_capture();
      throw;
    }
    graph g = end_capture(ec);
    return capture_result(std::move(g), ec);
  }
  /// True while the stream takes part in a capture.
  bool capturing() const noexcept;

  // --- files ---------------------------------------------------------------------------------

  /// Reads `bytes` bytes of `path` from `offset` into memory at `dst` (device memory of this
  /// device, usually) without blocking the caller: the file is opened and read on cora's I/O
  /// queue (io_uring, or a blocking thread where io_uring is unavailable; see cora/io.hpp)
  /// into `options.depth` pinned staging buffers, and each chunk is copied to `dst` on this
  /// stream while the next chunks are read. A staging buffer takes a new chunk only once its
  /// copy has completed. Completes when all the data is at `dst`; yields `bytes`.
  ///
  /// The copies are enqueued on this stream as chunks arrive, in file order: work enqueued
  /// meanwhile is interleaved with them, so wait for the returned pending before using the
  /// data (on this or any stream).
  ///
  /// Errors (the message names the path): the open's errno (no such file, permission denied),
  /// EISDIR for a directory, EINVAL for other non-regular files, errc::out_of_range when the
  /// range runs past the end of the file, std::errc::io_error when the file shrinks during
  /// the read, errc::invalid_pointer for a bad `dst`, errc::invalid_argument for a zero chunk
  /// size or depth. Nothing short is silently accepted.
  ///
  /// Cancellation: a terminal or partial Asio cancellation of `async_wait` (e.g. losing an
  /// `awaitable_operators ||` race against a timer) stops the read: reads in flight are
  /// cancelled, copies already enqueued finish, the staging buffers are released, then the
  /// wait completes with asio::error::operation_aborted. Because chunks are copied in file
  /// order, `dst` then holds a prefix of the range (its length is in the error message) and
  /// is untouched past it. A failed read leaves `dst` in the same state.
  pending<std::size_t> read_file(void* dst, const std::filesystem::path& path,
                                 std::uint64_t offset, std::size_t bytes,
                                 const read_options& options = {});

  // --- inspection ----------------------------------------------------------------------------

  /// The backend's stream (a CUstream on CUDA; null on the CPU device). Work other libraries
  /// enqueue on it is ordered after cora's work enqueued so far.
  void* native_handle() const noexcept;
  /// The device this stream belongs to.
  cora::device& device() const;
  /// True when everything enqueued so far has completed (may query the driver).
  bool idle() const;
  explicit operator bool() const noexcept { return static_cast<bool>(s_); }
  detail::stream_state* state() const noexcept;

 private:
  template <class P>
  static void* to_void(P* p) noexcept {
    return const_cast<void*>(static_cast<const void*>(p));
  }
  void free_after(detail::device_state* owner, void* p, bool host) noexcept;
  void* alloc_raw(std::size_t bytes, std::shared_ptr<detail::device_state>& owner, std::error_code& ec);
  pending<void> copy_checked(void* dst, std::size_t dst_bytes, const void* src,
                             std::size_t src_bytes);
  pending<void> launch_typed(const kernel& k, const launch_config& cfg,
                             std::span<const detail::arg_view> args);
  static pending<graph> capture_result(graph g, std::error_code ec);
  pending<void> value_op(void* addr, std::uint64_t value, wait_condition cond, bool wide,
                         bool write);
  void abandon_capture() noexcept;

  detail::stream_state* st() const noexcept;
  // The stream's state; held through its completion_source base so this header needs no
  // definition of it.
  detail::intrusive_ptr<detail::completion_source> s_;
};

}  // namespace cora
