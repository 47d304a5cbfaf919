// The C API's state: the runtime aclInit creates, the devices threads bind to, and a registry
// of every handle given out, so that stale or foreign handles are refused with CANN's codes
// instead of being dereferenced. Everything here is a thin layer over cora's C++ objects: the
// work itself (validation of memory, arguments, launches, completion) is the core's.
#pragma once

#include <acl/acl.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cora/cora.hpp>

/// What an exception-info callback receives (CANN's opaque aclrtExceptionInfo).
struct rtExceptionInfo {
  std::uint32_t task_id = 0;
  std::uint32_t stream_id = 0;
  std::uint32_t thread_id = 0;
  std::uint32_t device_id = 0;
  std::uint32_t error_code = 0;
};

namespace cora::acl {

// --- errors ------------------------------------------------------------------------------------

/// Records "api: message" as this thread's recent error message and returns `code`.
aclError fail(aclError code, const char* api, const std::string& message);
/// This thread's recent error message (aclGetRecentErrMsg), or null.
const char* recent_error_message() noexcept;
/// This thread's last error code (aclrtPeekAtLastError); `clear` resets it (aclrtGetLastError).
aclError last_error(bool clear) noexcept;
/// Counts a task enqueued by this thread (aclrtGetThreadLastTaskId) and returns its id.
std::uint32_t count_task() noexcept;
std::uint32_t last_task() noexcept;
/// Tells the exception-info callbacks (and aclrtGetErrorVerbose) of a failed task.
void report_task_failure(aclError code, std::size_t device, std::int32_t stream_id) noexcept;
/// Tells the aclrtRegDeviceStateCallback callbacks of a device set or reset.
void device_state_changed(std::int32_t device, aclrtDeviceState state) noexcept;
/// The stream being synchronized by this thread, for the task failures it reports.
struct synchronizing {
  synchronizing(std::size_t device, std::int32_t stream_id) noexcept;
  ~synchronizing();
  synchronizing(const synchronizing&) = delete;
  synchronizing& operator=(const synchronizing&) = delete;
};
/// CANN's code for a core error (table in docs/acl-compat.md).
aclError to_acl(std::error_code ec) noexcept;
/// fail() with the code of a core error and its detail message.
aclError fail(std::error_code ec, const char* api, const std::string& detail);
/// fail() with an explicit code for a core error.
aclError fail(aclError code, std::error_code ec, const char* api, const std::string& detail);

/// The code (and recent message) for the exception being handled.
aclError fail_current_exception(const char* api) noexcept;

/// Runs the body of a C API function: exceptions never cross the C boundary.
template <class Body>
aclError guarded(const char* api, Body&& body) noexcept {
  try {
    return body();
  } catch (...) {
    return fail_current_exception(api);
  }
}

/// The integer a caller passed for a C enum. A C caller may pass any value, but C++ must not
/// load an enum object outside its enumerators' range, so the bytes are read instead.
template <class E>
std::int64_t enum_value(const E& e) noexcept {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<std::int64_t>(v);
}

/// Fails the enclosing call (whose name is in `api`) with ACL_ERROR_INVALID_PARAM unless `cond`.
#define CORA_ACL_REQUIRE(cond, what)                                             \
  do {                                                                           \
    if (!(cond)) return ::cora::acl::fail(ACL_ERROR_INVALID_PARAM, api, what);  \
  } while (0)

/// ACL_ERROR_INVALID_PARAM unless `policy` is an aclrtMemMallocPolicy (page policy and flags).
aclError check_policy(const char* api, std::int64_t policy);

// --- objects behind the handles -----------------------------------------------------------------

struct report_queue;

struct stream_obj {
  cora::stream s;
  std::size_t device = 0;
  const void* context = nullptr;  // the aclrtContext it was created in (null: a device's own)
  std::int32_t id = 0;            // aclrtStreamGetId
  std::uint32_t priority = 0;
  std::uint32_t flags = 0;
  std::atomic<std::uint64_t> failure_mode{0};  // ACL_CONTINUE_ON_FAILURE; set from any thread
  std::shared_ptr<report_queue> subscriber;  // aclrtSubscribeReport; guarded by the state mutex
  std::shared_ptr<report_queue> host_func_thread;  // aclrtSubscribeHostFunc; likewise
};

/// An aclrtContext: a device and its default stream. Each device's primary context stands for
/// the device set by aclrtSetDevice; others come from aclrtCreateContext.
struct context_obj {
  std::size_t device = 0;
  bool primary = false;
  std::shared_ptr<stream_obj> default_stream;  // made on first use; guarded by the state mutex
  std::unordered_map<std::int64_t, std::int64_t> sys_params;  // aclrtCtxSetSysParamOpt
};

struct event_obj {
  cora::event ev;
  std::size_t device = 0;
  std::uint32_t flags = 0;
  std::uint32_t id = 0;   // aclrtGetEventId
  bool recorded = false;  // guarded by the state mutex
};

struct function_obj {
  cora::kernel k;
  std::size_t device = 0;
  const void* binary = nullptr;  // its aclrtBinHandle (null for a registered symbol's)
};

struct binary_obj {
  cora::binary bin;
  std::size_t device = 0;
  // One handle per kernel, so repeated lookups give the same handle; guarded by the state mutex.
  std::unordered_map<std::string, std::shared_ptr<function_obj>> functions;
  aclrtOpExceptionCallback exception_callback = nullptr;  // aclrtBinarySetExceptionCallback
  void* exception_user_data = nullptr;
};

/// An argument list (aclrtArgsHandle): the core's kernel_args plus the parameter handles.
struct args_obj {
  cora::kernel_args args;
  // aclrtKernelArgsInitByUserMem: the caller's data buffer, which receives the finalized block.
  void* user_mem = nullptr;
  std::size_t user_size = 0;
  // A parameter handle is the address of its index's byte here: cheap to hand out and to check.
  std::array<unsigned char, 128> params{};

  void* param_handle(std::uint32_t index) noexcept { return &params[index]; }
  bool param_index(const void* handle, std::uint32_t& index) const noexcept;
};

/// What aclrtKernelArgsInitByUserMem writes into the caller's handle memory.
struct user_args_header {
  static constexpr std::uint64_t magic_value = 0x5347524141524f43ull;  // "CORAARGS"
  std::uint64_t magic;
  args_obj* owner;
};
constexpr std::size_t user_args_handle_size = 64;
static_assert(sizeof(user_args_header) <= user_args_handle_size);

/// A report thread of aclrtSubscribeReport: callbacks of its streams wait here until it calls
/// aclrtProcessReport.
struct report {
  aclrtCallback fn = nullptr;
  void* user_data = nullptr;
  bool block = false;
  bool done = false;  // guarded by the queue's mutex
};

struct report_queue {
  std::uint64_t thread_id = 0;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<report>> reports;
  std::size_t streams = 0;  // subscribed streams; guarded by the state mutex
  bool closed = false;

  /// Stops the queue: blocked callbacks are released and undelivered ones dropped.
  void close();
};

// --- the state ---------------------------------------------------------------------------------

struct device_slot {
  int refcount = 0;              // aclrtSetDevice minus aclrtResetDevice, over all threads
  std::uint64_t generation = 0;  // bumped when the device's resources are released
  std::shared_ptr<stream_obj> default_stream;  // the NULL stream
  std::shared_ptr<context_obj> primary;        // the default context, while the device is set
  std::shared_ptr<stream_obj> sync_stream;     // carries aclrtMemcpy / aclrtMemset
  // Mixed mode: function handles of kernel launcher symbols used on this device.
  std::unordered_map<const void*, std::shared_ptr<function_obj>> symbol_functions;
};

/// Objects taken out of the registries, destroyed (and their streams waited for) after the
/// state mutex is released.
struct teardown {
  std::vector<std::shared_ptr<stream_obj>> streams;
  std::vector<std::shared_ptr<event_obj>> events;
  std::vector<std::shared_ptr<binary_obj>> binaries;
  std::vector<std::shared_ptr<function_obj>> functions;
  std::vector<std::shared_ptr<report_queue>> reporters;
  std::vector<std::shared_ptr<args_obj>> args;
  std::vector<std::shared_ptr<context_obj>> contexts;
  std::shared_ptr<cora::runtime> runtime;
  bool wait_streams = true;

  void run() noexcept;
};

class state {
 public:
  /// The process's state (never destroyed, so threads may use it until they exit).
  static state& get();

  std::mutex mutex;  // guards everything below
  std::shared_ptr<cora::runtime> runtime;  // null while not initialized
  std::uint64_t init_count = 0;
  std::uint64_t epoch = 0;  // bumped by each aclInit: older thread bindings are void
  std::vector<device_slot> devices;

  std::unordered_map<const void*, std::shared_ptr<stream_obj>> streams;
  std::unordered_map<const void*, std::shared_ptr<event_obj>> events;
  std::unordered_map<const void*, std::shared_ptr<binary_obj>> binaries;
  std::unordered_map<const void*, std::shared_ptr<function_obj>> functions;
  std::unordered_map<const void*, std::shared_ptr<args_obj>> args;
  // aclrtKernelArgsInitByUserMem: the handle whose finalized block goes to each user buffer, so
  // that a buffer taken over by another handle retires the older one.
  std::unordered_map<const void*, const void*> user_mem_handles;

  /// Forgets the argument list in user memory `handle` (issue 18, item 10: entries were kept
  /// until aclFinalize).
  void retire_user_args_locked(const void* handle);
  std::unordered_map<std::uint64_t, std::shared_ptr<report_queue>> reporters;
  std::unordered_map<std::uint64_t, std::shared_ptr<report_queue>> host_func_threads;
  std::unordered_map<const void*, std::shared_ptr<context_obj>> contexts;
  std::unordered_map<std::int64_t, std::int64_t> sys_params;  // aclrtSetSysParamOpt
  std::int32_t next_stream_id = 1;
  std::uint32_t next_event_id = 1;

  /// Moves every object of device `index` into `out` and voids the device's bindings.
  void release_device_locked(std::size_t index, teardown& out);
};

/// The calling thread's device and context.
struct context {
  std::shared_ptr<cora::runtime> runtime;
  std::size_t index = 0;
  cora::device* device = nullptr;
  std::shared_ptr<context_obj> ctx;
};

/// Fails with ACL_ERROR_UNINITIALIZE before aclInit.
aclError require_init_locked(state& st, const char* api);
/// The runtime made by aclInit (ACL_ERROR_UNINITIALIZE before it), whatever device is set.
aclError initialized_runtime(const char* api, std::shared_ptr<cora::runtime>& out);
/// The calling thread's device: ACL_ERROR_UNINITIALIZE, ACL_ERROR_RT_CONTEXT_NULL without one.
aclError current_locked(state& st, const char* api, context& out);
aclError current(const char* api, context& out);
/// The calling thread's device, if it has one; records no error.
bool peek_current_device_locked(state& st, std::size_t& index);
/// Binds the calling thread to device `index` (aclrtSetDevice): its primary context.
void bind_thread_locked(state& st, std::size_t index);
/// Binds the calling thread to a context made by aclrtCreateContext.
void bind_thread_locked(state& st, const std::shared_ptr<context_obj>& ctx);
/// The primary context of a device that is set (made on first use).
const std::shared_ptr<context_obj>& primary_context_locked(state& st, std::size_t index);
/// The default stream of a context (made on first use).
const std::shared_ptr<stream_obj>& context_stream_locked(state& st, context_obj& ctx, cora::device& dev);
/// A new stream of the calling thread's context.
std::shared_ptr<stream_obj> new_stream_locked(state& st, const context& ctx, const cora::stream_options& o = {});
/// Fails with ACL_ERROR_RT_INVALID_DEVICEID unless `deviceId` names a device.
aclError check_device_locked(state& st, const char* api, std::int64_t deviceId);

/// The stream behind a handle; NULL is the current device's default stream.
aclError resolve_stream_locked(state& st, const char* api, aclrtStream handle,
                               std::shared_ptr<stream_obj>& out);
aclError resolve_stream(const char* api, aclrtStream handle, std::shared_ptr<stream_obj>& out);
/// The internal stream of device `ctx` for synchronous copies and fills.
aclError sync_stream_locked(state& st, const char* api, const context& ctx,
                            std::shared_ptr<stream_obj>& out);

/// A registered handle of `map`, or ACL_ERROR_RT_INVALID_HANDLE (NULL: ACL_ERROR_INVALID_PARAM).
template <class T>
aclError lookup_locked(state& st, const std::unordered_map<const void*, std::shared_ptr<T>>& map,
                       const char* api, const void* handle, const char* what, std::shared_ptr<T>& out) {
  if (!handle) return fail(ACL_ERROR_INVALID_PARAM, api, std::string(what) + " is NULL");
  if (aclError e = require_init_locked(st, api)) return e;
  auto it = map.find(handle);
  if (it == map.end())
    return fail(ACL_ERROR_RT_INVALID_HANDLE, api,
                std::string(what) + " is not a live handle (destroyed, or never created)");
  out = it->second;
  return ACL_SUCCESS;
}

/// The function behind `func`: a function handle, or (when `symbols`) a registered symbol.
aclError resolve_function(const char* api, const void* func, bool symbols,
                          std::shared_ptr<function_obj>& out);

/// The argument list behind a handle (the per-thread one or one built in user memory).
aclError resolve_args(const char* api, aclrtArgsHandle handle, std::shared_ptr<args_obj>& out);

// --- waiting -------------------------------------------------------------------------------------

/// The detail message of a failed op.
std::string op_message(const cora::pending<void>& p);
/// Waits for `p`; its failure becomes CANN's code.
aclError wait(const char* api, cora::pending<void>& p);
/// An op that failed at once (validation) gives its error now; one still running is left to
/// run, and its failure surfaces at the next synchronization, as CANN's async errors do.
/// `overrides` gives other codes for some core errors of this call.
aclError check_enqueued(const char* api, cora::pending<void>& p,
                        std::initializer_list<std::pair<cora::errc, aclError>> overrides = {});
/// Waits until `s` has no work left, up to `timeout_ms` (-1: forever); then reports its fault.
aclError synchronize_stream(const char* api, stream_obj& s, std::int32_t timeout_ms);

}  // namespace cora::acl
