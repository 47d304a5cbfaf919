// How typed launch arguments become bytes: device buffers pass their device address, pointers
// are checked against the device's allocations, everything else is copied by value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cora/memory.hpp"

namespace cora::detail {

class device_state;

/// One argument of a typed launch, viewed as bytes.
struct arg_view {
  enum class kind : std::uint8_t { value, pointer, buffer };
  const void* data;
  std::uint32_t size;
  std::uint32_t align;
  kind k;
  const device_state* owner;  // for buffers: the device that owns the memory
};

template <class T>
struct launch_arg {
  static_assert(std::is_trivially_copyable_v<T>, "kernel arguments must be trivially copyable");
  T value;
  static constexpr arg_view::kind k = std::is_pointer_v<T> ? arg_view::kind::pointer
                                                           : arg_view::kind::value;
  const device_state* owner = nullptr;
};

template <class T>
launch_arg<T*> to_launch_arg(device_buffer<T>& b) {
  return {b.data(), b.owner()};
}
template <class T>
launch_arg<T*> to_launch_arg(const device_buffer<T>& b) {
  return {b.data(), b.owner()};
}
template <class T>
launch_arg<std::decay_t<T>> to_launch_arg(T&& v) {
  return {v, nullptr};
}

template <class T>
constexpr arg_view::kind view_kind(const launch_arg<T>& a) {
  if (a.owner) return arg_view::kind::buffer;
  return launch_arg<T>::k;
}

template <class T>
arg_view view_of(const launch_arg<T>& a) {
  return {&a.value, static_cast<std::uint32_t>(sizeof(T)), static_cast<std::uint32_t>(alignof(T)),
          view_kind(a), a.owner};
}

}  // namespace cora::detail
