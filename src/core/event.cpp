#include "cora/event.hpp"

#include "core/state.hpp"

namespace cora {

namespace detail {
event_state::~event_state() = default;
}

pending<void> event::synchronize() const {
  if (!s_) {
    return pending<void>(detail::failed_op(make_error_code(errc::invalid_handle), "empty event handle", nullptr));
  }
  detail::intrusive_ptr<detail::stream_state> stream;
  std::uint64_t seq;
  {
    std::lock_guard lock(s_->mutex);
    stream = s_->stream;
    seq = s_->seq;
  }
  if (!stream) {  // never recorded: nothing to wait for
    auto st = detail::make_intrusive<detail::async_state<void>>();
    st->complete({});
    return pending<void>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(st)), 0));
  }
  return pending<void>(detail::op_handle(detail::intrusive_ptr<detail::completion_source>(std::move(stream)), seq));
}

bool event::ready() const {
  if (!s_) throw error(errc::invalid_handle, "empty event handle");
  std::error_code ec;
  const bool done = s_->device->backend->event_done(*s_->backend, ec);
  if (ec) throw error(ec, "cannot query the event");
  return done;
}

std::chrono::duration<double, std::milli> event::elapsed(const event& start, const event& end,
                                                         std::error_code& ec) {
  if (!start || !end) {
    detail::set_error(ec, errc::invalid_handle, "empty event handle");
    return {};
  }
  if (start.s_->device != end.s_->device) {
    detail::set_error(ec, errc::wrong_device, "the events belong to different devices");
    return {};
  }
  if (!start.s_->timing || !end.s_->timing) {
    detail::set_error(ec, errc::invalid_argument, "elapsed time needs events created with timing");
    return {};
  }
  for (const auto* s : {start.s_.get(), end.s_.get()}) {
    std::lock_guard lock(const_cast<detail::event_state*>(s)->mutex);
    if (!s->stream) {
      detail::set_error(ec, errc::not_ready, "both events must have been recorded");
      return {};
    }
  }
  const double ms = start.s_->device->backend->elapsed_ms(*start.s_->backend, *end.s_->backend, ec);
  if (ec) {
    detail::set_error(ec, ec, ec == make_error_code(errc::not_ready)
                                  ? "the recorded work has not completed yet"
                                  : "cannot measure the time between the events");
    return {};
  }
  return std::chrono::duration<double, std::milli>(ms);
}

std::chrono::duration<double, std::milli> event::elapsed(const event& start, const event& end) {
  std::error_code ec;
  auto d = elapsed(start, end, ec);
  detail::throw_if(ec);
  return d;
}

void* event::native_handle() const noexcept {
  return s_ && s_->backend ? s_->backend->native_handle() : nullptr;
}

}  // namespace cora
