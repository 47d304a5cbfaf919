// Capture into model runtime instances (aclmdlRI*): a CANN model runtime instance is a cora
// graph captured from a stream and its instantiation.
#include <unordered_map>

#include "acl/acl_state.hpp"

using namespace cora::acl;

namespace {

struct model_obj {
  cora::graph graph;
  cora::graph_exec exec;
  std::size_t device = 0;
};

// Live models; separate from the state's registries, which the models never refer to.
struct models {
  std::mutex mutex;
  std::unordered_map<const void*, std::shared_ptr<model_obj>> live;
  static models& get() {
    static models* m = new models;  // never destroyed: threads may use it until they exit
    return *m;
  }
};

aclError lookup_model(const char* api, aclmdlRI handle, std::shared_ptr<model_obj>& out) {
  if (!handle) return fail(ACL_ERROR_INVALID_PARAM, api, "modelRI is NULL");
  auto& m = models::get();
  std::lock_guard lock(m.mutex);
  auto it = m.live.find(handle);
  if (it == m.live.end())
    return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "modelRI is not a live handle (destroyed, or never created)");
  out = it->second;
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    const auto m = enum_value(mode);
    // Every mode behaves alike here: capture happens in cora's core, so no call made while a
    // capture is open can break it, whichever thread makes it.
    CORA_ACL_REQUIRE(m >= ACL_MODEL_RI_CAPTURE_MODE_GLOBAL && m <= ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
                     "mode is no aclmdlRICaptureMode");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    std::error_code ec;
    s->s.begin_capture(ec);
    if (ec == cora::errc::illegal_in_capture)
      return fail(ACL_ERROR_RT_STREAM_CAPTURED, ec, api, cora::last_error_message());
    if (ec) return fail(ec, api, cora::last_error_message());
    return ACL_SUCCESS;
  });
}

aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI* modelRI) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(modelRI, "modelRI is NULL");
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    std::error_code ec;
    cora::graph g = s->s.end_capture(ec);
    if (ec == cora::errc::invalid_argument) {
      const std::string why = cora::last_error_message();
      return fail(s->s.capturing() ? ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED : ACL_ERROR_RT_STREAM_NOT_CAPTURED, ec,
                  api, why);
    }
    if (ec) return fail(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED, ec, api, cora::last_error_message());
    auto model = std::make_shared<model_obj>();
    model->exec = g.instantiate(ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    model->graph = std::move(g);
    model->device = s->device;
    *modelRI = model.get();
    auto& m = models::get();
    std::lock_guard lock(m.mutex);
    m.live.emplace(model.get(), std::move(model));
    return ACL_SUCCESS;
  });
}

aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<model_obj> model;
    if (aclError e = lookup_model(api, modelRI, model)) return e;
    std::shared_ptr<stream_obj> s;
    if (aclError e = resolve_stream(api, stream, s)) return e;
    auto p = model->exec.launch(s->s);
    return check_enqueued(api, p, {{cora::errc::wrong_device, ACL_ERROR_RT_STREAM_CONTEXT},
                                   {cora::errc::illegal_in_capture, ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED}});
  });
}

aclError aclmdlRIUpdate(aclmdlRI modelRI) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<model_obj> model;
    if (aclError e = lookup_model(api, modelRI, model)) return e;
    // Takes the captured graph's parameters again (in place where the driver accepts it);
    // cora has no per-task parameter edits (aclmdlRITaskSetParams) to apply yet.
    std::error_code ec;
    model->exec.update(model->graph, ec);
    if (ec) return fail(ec, api, cora::last_error_message());
    return ACL_SUCCESS;
  });
}

aclError aclmdlRIDestroy(aclmdlRI modelRI) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    std::shared_ptr<model_obj> model;
    {
      if (!modelRI) return fail(ACL_ERROR_INVALID_PARAM, api, "modelRI is NULL");
      auto& m = models::get();
      std::lock_guard lock(m.mutex);
      auto it = m.live.find(modelRI);
      if (it == m.live.end())
        return fail(ACL_ERROR_RT_INVALID_HANDLE, api, "modelRI is not a live handle (destroyed, or never created)");
      model = std::move(it->second);
      m.live.erase(it);
    }
    // Launches in flight keep what they use: dropping the model does not wait for them.
    return ACL_SUCCESS;
  });
}

}  // extern "C"
