#include "cora/error.hpp"

#include "core/state.hpp"

namespace cora {

namespace {

class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cora"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::invalid_argument: return "invalid argument";
      case errc::invalid_handle: return "invalid handle";
      case errc::invalid_pointer: return "pointer is not a live allocation";
      case errc::out_of_range: return "range runs past the end of its allocation";
      case errc::out_of_memory: return "out of memory";
      case errc::invalid_binary: return "invalid kernel binary";
      case errc::kernel_not_found: return "kernel not found";
      case errc::argument_mismatch: return "arguments do not match the kernel's parameters";
      case errc::invalid_launch_config: return "invalid launch configuration";
      case errc::placeholder_misuse: return "placeholder misuse";
      case errc::args_not_finalized: return "argument list not finalized";
      case errc::args_finalized: return "argument list already finalized";
      case errc::too_many_arguments: return "too many arguments";
      case errc::binary_unloaded: return "binary was unloaded";
      case errc::already_unloaded: return "binary already unloaded";
      case errc::kernel_fault: return "kernel fault";
      case errc::kernel_timeout: return "kernel timed out";
      case errc::device_lost: return "device lost";
      case errc::not_supported: return "not supported by this device";
      case errc::wrong_device: return "object belongs to another device";
      case errc::runtime_shut_down: return "runtime shut down";
      case errc::no_device: return "no such device";
      case errc::driver_error: return "driver error";
      case errc::not_ready: return "not ready";
      case errc::timed_out: return "timed out";
      case errc::copy_fault: return "copy fault";
      case errc::illegal_in_capture: return "not allowed while the stream is capturing";
      case errc::aborted: return "discarded by an abort of its stream";
    }
    return "unknown cora error";
  }
};

thread_local std::string last_message;

}  // namespace

const std::error_category& error_category() noexcept {
  static const category c;
  return c;
}

const std::string& last_error_message() noexcept { return last_message; }

namespace detail {

void set_error(std::error_code& ec, std::error_code code, std::string message) {
  ec = code;
  last_message = message.empty() ? code.message() : std::move(message);
}

void throw_if(const std::error_code& ec) {
  if (ec) throw error(ec, last_message.empty() ? ec.message() : last_message);
}

void throw_op_error(const op_handle& op, std::error_code ec) {
  // A wait refused before it began (a host function waiting for its own stream) carries its
  // reason in the thread's last error message, not in the op's source.
  if (ec == std::errc::resource_deadlock_would_occur && dynamic_cast<const stream_state*>(op.source()))
    throw error(ec, last_error_message());
  std::string detail = op.source() ? op.source()->message(op.seq()) : std::string();
  if (detail.empty()) throw error(ec);
  throw error(ec, detail);
}

}  // namespace detail
}  // namespace cora
