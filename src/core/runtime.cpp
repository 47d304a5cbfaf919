#include "cora/runtime.hpp"

#include <asio/post.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/host_pool.hpp"
#include "core/process_exit.hpp"
#include "core/state.hpp"

namespace cora {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

[[noreturn]] void bad_env(const char* name, const std::string& value, const char* expected) {
  throw error(errc::invalid_argument,
              std::string(name) + "=" + value + " is not valid: expected " + expected);
}

void apply_environment(runtime_options& o) {
  if (auto v = env("CORA_BACKEND"); !v.empty()) {
    if (v == "any")
      o.backend = backend_selection::any;
    else if (v == "cpu")
      o.backend = backend_selection::cpu;
    else if (v == "cuda")
      o.backend = backend_selection::cuda;
    else
      bad_env("CORA_BACKEND", v, "any, cpu or cuda");
  }
  if (auto v = env("CORA_COMPLETION"); !v.empty()) {
    if (v == "spin")
      o.completion = completion_policy::spin;
    else if (v == "hybrid")
      o.completion = completion_policy::hybrid;
    else if (v == "blocking")
      o.completion = completion_policy::blocking;
    else if (v == "callback")
      o.completion = completion_policy::callback;
    else
      bad_env("CORA_COMPLETION", v, "spin, hybrid, blocking or callback");
  }
  if (auto v = env("CORA_DEVICE"); !v.empty()) {
    char* end = nullptr;
    const unsigned long i = std::strtoul(v.c_str(), &end, 10);
    if (!end || *end || v[0] == '-') bad_env("CORA_DEVICE", v, "a device index");
    o.default_device = i;
  }
  if (auto v = env("CORA_CPU_UNITS"); !v.empty()) {
    char* end = nullptr;
    const unsigned long n = std::strtoul(v.c_str(), &end, 10);
    if (!end || *end || n == 0 || n > 4096) bad_env("CORA_CPU_UNITS", v, "a thread count");
    o.cpu_compute_units = static_cast<unsigned>(n);
  }
  if (auto v = env("CORA_CPU_DEVICES"); !v.empty()) {
    char* end = nullptr;
    const unsigned long n = std::strtoul(v.c_str(), &end, 10);
    if (!end || *end || n == 0 || n > 64) bad_env("CORA_CPU_DEVICES", v, "a device count (1 to 64)");
    o.cpu_devices = static_cast<unsigned>(n);
  }
  const auto bytes = [](const char* name, std::size_t& out) {
    if (auto v = env(name); !v.empty()) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (!end || *end || v[0] == '-') bad_env(name, v, "a byte count");
      out = static_cast<std::size_t>(n);
    }
  };
  bytes("CORA_DEVICE_MEMORY_LIMIT", o.device_memory_limit);
  bytes("CORA_PINNED_MEMORY_LIMIT", o.pinned_memory_limit);
  bytes("CORA_POOL_RELEASE_THRESHOLD", o.pool_release_threshold);
}

}  // namespace

const char* to_string(completion_policy p) noexcept {
  switch (p) {
    case completion_policy::spin: return "spin";
    case completion_policy::hybrid: return "hybrid";
    case completion_policy::blocking: return "blocking";
    case completion_policy::callback: return "callback";
  }
  return "?";
}

struct runtime::impl {
  std::shared_ptr<detail::runtime_core> core;
  std::vector<std::shared_ptr<detail::device_state>> devices;
  std::vector<backend_status> statuses;
  std::size_t default_index = 0;
};

runtime::runtime() : runtime(runtime_options{}) {}

runtime::runtime(runtime_options options) : impl_(std::make_unique<impl>()) {
  if (options.use_environment) apply_environment(options);
  impl_->core = std::make_shared<detail::runtime_core>();
  impl_->core->options = options;

  std::vector<std::unique_ptr<backend::device>> found;
  if (options.backend != backend_selection::cpu) {
    std::string reason;
    auto gpus = backend::make_cuda_devices(reason);
    if (!gpus.empty()) detail::watch_process_exit();
    impl_->statuses.push_back({"cuda", !gpus.empty(), gpus.size(), reason});
    for (auto& g : gpus) found.push_back(std::move(g));
    if (gpus.empty() && options.backend == backend_selection::cuda)
      throw error(errc::no_device, "CORA_BACKEND=cuda but no CUDA device is usable: " + reason);
  } else {
    impl_->statuses.push_back({"cuda", false, 0, "not selected (backend = cpu)"});
  }
  if (options.backend != backend_selection::cuda) {
    backend::cpu_options cpu;
    cpu.devices = options.cpu_devices;
    cpu.compute_units = options.cpu_compute_units;
    cpu.memory = options.cpu_memory;
    auto cpus = backend::make_cpu_devices(cpu);
    impl_->statuses.push_back({"cpu", true, cpus.size(), "worker threads behaving like a device"});
    for (auto& c : cpus) found.push_back(std::move(c));
  } else {
    impl_->statuses.push_back({"cpu", false, 0, "not selected (backend = cuda)"});
  }
  for (std::size_t i = 0; i < found.size(); ++i) {
    // A device's last reference can go where it must not be destroyed (a host function's
    // capture dropped by a CPU worker, whose destruction joins it, or on CUDA's callback
    // thread, which may make no CUDA call): it is then destroyed on a cora thread.
    std::shared_ptr<detail::device_state> st(
        new detail::device_state(impl_->core, std::move(found[i]), i), [](detail::device_state* d) noexcept {
          if (d->backend->on_own_thread()) {
            try {
              asio::post(detail::device_wait_pool(), [d] { delete d; });
              return;
            } catch (...) {
            }
          }
          delete d;
        });
    impl_->devices.push_back(st);
    st->warm_up();
  }
  const std::size_t def = options.default_device.value_or(0);
  if (def >= impl_->devices.size())
    throw error(errc::no_device, "default device " + std::to_string(def) + " does not exist (" +
                                     std::to_string(impl_->devices.size()) + " devices)");
  impl_->default_index = def;
}

runtime::~runtime() {
  // Does not wait for device work (objects made from the runtime keep what it uses alive).
  for (auto& d : impl_->devices) d->shutdown();
}

std::size_t runtime::device_count() const noexcept { return impl_->devices.size(); }

cora::device& runtime::device(std::size_t i) {
  if (i >= impl_->devices.size())
    throw error(errc::no_device, "device " + std::to_string(i) + " does not exist (" +
                                     std::to_string(impl_->devices.size()) + " devices)");
  return impl_->devices[i]->handle;
}

cora::device& runtime::default_device() { return impl_->devices[impl_->default_index]->handle; }

const runtime_options& runtime::options() const noexcept { return impl_->core->options; }

std::vector<backend_status> runtime::backends() const { return impl_->statuses; }

}  // namespace cora
