// The kernel server's wire protocol (see README.md): fixed little-endian headers, fp32 payloads.
// Shared by the server, its tests and the load generator.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace kernel_server::protocol {

/// "CKS1" on the wire: the first four bytes of every request and reply.
inline constexpr std::uint32_t magic = 0x31534B43;
inline constexpr std::uint8_t version = 1;
inline constexpr std::size_t request_header_size = 20;
inline constexpr std::size_t reply_header_size = 16;

/// What a request asks for.
enum class op : std::uint8_t {
  add = 1,    ///< payload x[n], y[n]; reply x + y
  saxpy = 2,  ///< payload a, rounds (u32), x[n], y[n]; reply y + a*x applied `rounds` times
  sleep = 3,  ///< payload microseconds (u64); empty reply. Off unless the server enables it
};

/// What a reply reports.
enum class status : std::uint8_t {
  ok = 0,
  bad_request = 1,   ///< malformed header or payload
  too_large = 2,     ///< length above the server's limit; the connection is closed
  unknown_op = 3,    ///< an op this server does not serve
  timeout = 4,       ///< the deadline passed before the device finished
  device_error = 5,  ///< the device reported a failure
  busy = 6,          ///< too many connections; the connection is closed
};

inline const char* to_string(status s) noexcept {
  switch (s) {
    case status::ok: return "ok";
    case status::bad_request: return "bad_request";
    case status::too_large: return "too_large";
    case status::unknown_op: return "unknown_op";
    case status::timeout: return "timeout";
    case status::device_error: return "device_error";
    case status::busy: return "busy";
  }
  return "unknown";
}

struct request_header {
  std::uint32_t magic = protocol::magic;
  std::uint8_t version = protocol::version;
  std::uint8_t op = 0;
  std::uint16_t flags = 0;        ///< reserved, must be 0
  std::uint32_t id = 0;           ///< echoed in the reply
  std::uint32_t deadline_ms = 0;  ///< 0: the server's default; else the smaller of the two
  std::uint32_t length = 0;       ///< payload bytes that follow
};

struct reply_header {
  std::uint32_t magic = protocol::magic;
  std::uint8_t version = protocol::version;
  std::uint8_t status = 0;
  std::uint16_t reserved = 0;
  std::uint32_t id = 0;
  std::uint32_t length = 0;
};

/// The fixed part of a saxpy payload, before x and y.
struct saxpy_params {
  float a = 0;
  std::uint32_t rounds = 0;
};
inline constexpr std::size_t saxpy_params_size = 8;

// Explicit little-endian packing keeps the format independent of struct layout and host order.
namespace detail {
inline void put32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void put16(std::byte* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::byte>(v);
  p[1] = static_cast<std::byte>(v >> 8);
}
inline std::uint32_t get32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}
inline std::uint16_t get16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>(std::to_integer<std::uint8_t>(p[0]) |
                                    (std::to_integer<std::uint8_t>(p[1]) << 8));
}
}  // namespace detail

inline std::array<std::byte, request_header_size> encode(const request_header& h) noexcept {
  std::array<std::byte, request_header_size> b{};
  detail::put32(&b[0], h.magic);
  b[4] = static_cast<std::byte>(h.version);
  b[5] = static_cast<std::byte>(h.op);
  detail::put16(&b[6], h.flags);
  detail::put32(&b[8], h.id);
  detail::put32(&b[12], h.deadline_ms);
  detail::put32(&b[16], h.length);
  return b;
}

inline request_header decode_request(std::span<const std::byte, request_header_size> b) noexcept {
  request_header h;
  h.magic = detail::get32(&b[0]);
  h.version = std::to_integer<std::uint8_t>(b[4]);
  h.op = std::to_integer<std::uint8_t>(b[5]);
  h.flags = detail::get16(&b[6]);
  h.id = detail::get32(&b[8]);
  h.deadline_ms = detail::get32(&b[12]);
  h.length = detail::get32(&b[16]);
  return h;
}

inline std::array<std::byte, reply_header_size> encode(const reply_header& h) noexcept {
  std::array<std::byte, reply_header_size> b{};
  detail::put32(&b[0], h.magic);
  b[4] = static_cast<std::byte>(h.version);
  b[5] = static_cast<std::byte>(h.status);
  detail::put16(&b[6], h.reserved);
  detail::put32(&b[8], h.id);
  detail::put32(&b[12], h.length);
  return b;
}

inline reply_header decode_reply(std::span<const std::byte, reply_header_size> b) noexcept {
  reply_header h;
  h.magic = detail::get32(&b[0]);
  h.version = std::to_integer<std::uint8_t>(b[4]);
  h.status = std::to_integer<std::uint8_t>(b[5]);
  h.reserved = detail::get16(&b[6]);
  h.id = detail::get32(&b[8]);
  h.length = detail::get32(&b[12]);
  return h;
}

/// fp32 values travel as IEEE-754 binary32, little-endian (the host order of every machine
/// cora runs on, so payloads are copied as they are).
static_assert(sizeof(float) == 4);

/// A complete add request: header then x and y.
inline std::vector<std::byte> make_add_request(std::uint32_t id, std::span<const float> x,
                                               std::span<const float> y,
                                               std::uint32_t deadline_ms = 0) {
  request_header h;
  h.op = static_cast<std::uint8_t>(op::add);
  h.id = id;
  h.deadline_ms = deadline_ms;
  h.length = static_cast<std::uint32_t>(x.size_bytes() + y.size_bytes());
  std::vector<std::byte> out(request_header_size + h.length);
  auto hb = encode(h);
  std::memcpy(out.data(), hb.data(), hb.size());
  std::memcpy(out.data() + request_header_size, x.data(), x.size_bytes());
  std::memcpy(out.data() + request_header_size + x.size_bytes(), y.data(), y.size_bytes());
  return out;
}

/// A complete saxpy request: header, parameters, x and y.
inline std::vector<std::byte> make_saxpy_request(std::uint32_t id, float a, std::uint32_t rounds,
                                                 std::span<const float> x, std::span<const float> y,
                                                 std::uint32_t deadline_ms = 0) {
  request_header h;
  h.op = static_cast<std::uint8_t>(op::saxpy);
  h.id = id;
  h.deadline_ms = deadline_ms;
  h.length = static_cast<std::uint32_t>(saxpy_params_size + x.size_bytes() + y.size_bytes());
  std::vector<std::byte> out(request_header_size + h.length);
  auto hb = encode(h);
  std::byte* p = out.data();
  std::memcpy(p, hb.data(), hb.size());
  p += request_header_size;
  std::memcpy(p, &a, 4);
  detail::put32(p + 4, rounds);
  p += saxpy_params_size;
  std::memcpy(p, x.data(), x.size_bytes());
  std::memcpy(p + x.size_bytes(), y.data(), y.size_bytes());
  return out;
}

/// A complete sleep request (the device is busy for `us` microseconds).
inline std::vector<std::byte> make_sleep_request(std::uint32_t id, std::uint64_t us,
                                                 std::uint32_t deadline_ms = 0) {
  request_header h;
  h.op = static_cast<std::uint8_t>(op::sleep);
  h.id = id;
  h.deadline_ms = deadline_ms;
  h.length = 8;
  std::vector<std::byte> out(request_header_size + 8);
  auto hb = encode(h);
  std::memcpy(out.data(), hb.data(), hb.size());
  detail::put32(out.data() + request_header_size, static_cast<std::uint32_t>(us));
  detail::put32(out.data() + request_header_size + 4, static_cast<std::uint32_t>(us >> 32));
  return out;
}

}  // namespace kernel_server::protocol
