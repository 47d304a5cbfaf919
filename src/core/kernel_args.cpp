#include "cora/kernel_args.hpp"

#include <cstring>

#include "core/state.hpp"
#include "cora/detail/arg_layout.hpp"

namespace cora {

namespace {
constexpr std::size_t max_params = 128;
constexpr std::size_t max_block = 64 * 1024;
}  // namespace

void kernel_args::reset(const cora::kernel& k) {
  kernel_ = k;
  params_.clear();
  values_.assign(k.args_size(), std::byte{0});
  buffers_.clear();
  block_.clear();
  placeholders_.clear();
  end_ = 0;
  buffers_fetched_ = false;
  finalized_ = false;
}

param_handle kernel_args::append(const void* data, std::size_t size, std::error_code& ec) {
  if (!kernel_) {
    detail::set_error(ec, errc::invalid_handle, "the argument list has no kernel");
    return {};
  }
  if (finalized_) {
    detail::set_error(ec, errc::args_finalized, "append after finalize()");
    return {};
  }
  if (buffers_fetched_) {
    detail::set_error(ec, errc::placeholder_misuse,
                      "append after a placeholder buffer was fetched: append every parameter first");
    return {};
  }
  if (!data || size == 0) {
    detail::set_error(ec, errc::invalid_argument, "append of a null or empty parameter");
    return {};
  }
  if (params_.size() >= max_params) {
    detail::set_error(ec, errc::too_many_arguments, "an argument list holds at most 128 parameters");
    return {};
  }
  const auto kp = kernel_.params();
  const std::size_t i = params_.size();
  if (i >= kp.size()) {
    detail::set_error(ec, errc::argument_mismatch,
                      "kernel '" + std::string(kernel_.name()) + "' takes " +
                          std::to_string(kp.size()) + " parameters");
    return {};
  }
  if (size != kp[i].size) {
    detail::set_error(ec, errc::argument_mismatch,
                      "parameter " + std::to_string(i) + " of kernel '" +
                          std::string(kernel_.name()) + "' has " + std::to_string(kp[i].size) +
                          " bytes; " + std::to_string(size) + " given");
    return {};
  }
  std::memcpy(values_.data() + kp[i].offset, data, size);
  params_.push_back({static_cast<std::uint32_t>(kp[i].offset), static_cast<std::uint32_t>(size), false});
  end_ = kp[i].offset + size;
  ec.clear();
  return {static_cast<std::uint32_t>(i)};
}

param_handle kernel_args::append(const void* data, std::size_t size) {
  std::error_code ec;
  auto h = append(data, size, ec);
  detail::throw_if(ec);
  return h;
}

param_handle kernel_args::append_placeholder(std::error_code& ec) {
  if (!kernel_) {
    detail::set_error(ec, errc::invalid_handle, "the argument list has no kernel");
    return {};
  }
  if (finalized_) {
    detail::set_error(ec, errc::args_finalized, "append after finalize()");
    return {};
  }
  if (buffers_fetched_) {
    detail::set_error(ec, errc::placeholder_misuse,
                      "append after a placeholder buffer was fetched: append every parameter first");
    return {};
  }
  if (params_.size() >= max_params) {
    detail::set_error(ec, errc::too_many_arguments, "an argument list holds at most 128 parameters");
    return {};
  }
  const auto kp = kernel_.params();
  const std::size_t i = params_.size();
  if (i >= kp.size()) {
    detail::set_error(ec, errc::argument_mismatch,
                      "kernel '" + std::string(kernel_.name()) + "' takes " +
                          std::to_string(kp.size()) + " parameters");
    return {};
  }
  if (kp[i].size != sizeof(void*)) {
    detail::set_error(ec, errc::placeholder_misuse,
                      "parameter " + std::to_string(i) + " is not a pointer: it cannot be a placeholder");
    return {};
  }
  params_.push_back({static_cast<std::uint32_t>(kp[i].offset), static_cast<std::uint32_t>(sizeof(void*)), true});
  end_ = kp[i].offset + sizeof(void*);
  ec.clear();
  return {static_cast<std::uint32_t>(i)};
}

param_handle kernel_args::append_placeholder() {
  std::error_code ec;
  auto h = append_placeholder(ec);
  detail::throw_if(ec);
  return h;
}

void* kernel_args::placeholder_buffer(param_handle ph, std::size_t size, std::error_code& ec) {
  if (ph.index >= params_.size()) {
    detail::set_error(ec, errc::invalid_handle, "no such parameter in the argument list");
    return nullptr;
  }
  if (!params_[ph.index].placeholder) {
    detail::set_error(ec, errc::placeholder_misuse,
                      "parameter " + std::to_string(ph.index) + " is not a placeholder");
    return nullptr;
  }
  if (size == 0) {
    detail::set_error(ec, errc::invalid_argument, "a placeholder buffer needs at least one byte");
    return nullptr;
  }
  if (size > max_block) {  // could never fit the block; and no allocation of any size is tried
    detail::set_error(ec, errc::too_many_arguments,
                      "a placeholder buffer of " + std::to_string(size) +
                          " bytes exceeds the 64 KiB argument block");
    return nullptr;
  }
  if (buffers_.size() < params_.size()) buffers_.resize(params_.size());
  auto& buf = buffers_[ph.index];
  if (buf.size() != size) buf.assign(size, std::byte{0});
  buffers_fetched_ = true;
  finalized_ = false;
  ec.clear();
  return buf.data();
}

void* kernel_args::placeholder_buffer(param_handle ph, std::size_t size) {
  std::error_code ec;
  void* p = placeholder_buffer(ph, size, ec);
  detail::throw_if(ec);
  return p;
}

void kernel_args::update(param_handle p, const void* data, std::size_t size, std::error_code& ec) {
  if (p.index >= params_.size()) {
    detail::set_error(ec, errc::invalid_handle, "no such parameter in the argument list");
    return;
  }
  const auto& prm = params_[p.index];
  if (prm.placeholder) {
    detail::set_error(ec, errc::placeholder_misuse,
                      "parameter " + std::to_string(p.index) +
                          " is a placeholder: write its buffer instead of updating it");
    return;
  }
  if (!data || size != prm.size) {
    detail::set_error(ec, errc::argument_mismatch,
                      "parameter " + std::to_string(p.index) + " has " + std::to_string(prm.size) +
                          " bytes; " + std::to_string(size) + " given");
    return;
  }
  std::memcpy(values_.data() + prm.offset, data, size);
  finalized_ = false;  // finalize again before the next launch, as CANN requires
  ec.clear();
}

void kernel_args::update(param_handle p, const void* data, std::size_t size) {
  std::error_code ec;
  update(p, data, size, ec);
  detail::throw_if(ec);
}

void kernel_args::finalize(std::error_code& ec) {
  if (!kernel_) {
    detail::set_error(ec, errc::invalid_handle, "the argument list has no kernel");
    return;
  }
  const auto kp = kernel_.params();
  if (params_.size() != kp.size()) {
    detail::set_error(ec, errc::argument_mismatch,
                      "kernel '" + std::string(kernel_.name()) + "' takes " +
                          std::to_string(kp.size()) + " parameters; " +
                          std::to_string(params_.size()) + " appended");
    return;
  }
  // Block: the canonical parameters, then each placeholder's payload at an 8-aligned offset.
  block_ = values_;
  placeholders_.clear();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].placeholder) continue;
    if (i >= buffers_.size() || buffers_[i].empty()) {
      detail::set_error(ec, errc::placeholder_misuse,
                        "placeholder " + std::to_string(i) + " has no buffer: fetch and fill it first");
      return;
    }
    const std::size_t at = detail::align_up(block_.size(), 8);
    if (at + buffers_[i].size() > max_block) {
      detail::set_error(ec, errc::too_many_arguments, "the argument block exceeds 64 KiB");
      return;
    }
    block_.resize(at + buffers_[i].size());
    std::memcpy(block_.data() + at, buffers_[i].data(), buffers_[i].size());
    placeholders_.push_back({params_[i].offset, static_cast<std::uint32_t>(at)});
  }
  finalized_ = true;
  ec.clear();
}

void kernel_args::finalize() {
  std::error_code ec;
  finalize(ec);
  detail::throw_if(ec);
}

std::size_t kernel_args::block_size() const noexcept {
  std::size_t n = values_.size();
  for (const auto& b : buffers_)
    if (!b.empty()) n = detail::align_up(n, 8) + b.size();
  return n;
}

}  // namespace cora
