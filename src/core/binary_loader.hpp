// Turning bytes into a loaded binary: format recognition, image choice, backend load.
#pragma once

#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "cora/binary.hpp"

namespace cora::detail {

class binary_state;
class device_state;
class kernel_state;

/// Loads `bytes` on `dev` (blocking: call it off the caller's executor).
std::shared_ptr<binary_state> load_binary_image(std::shared_ptr<device_state> dev,
                                                std::vector<std::byte> bytes,
                                                const load_options& options, std::error_code& ec,
                                                std::string& message);

/// Resolves kernel `index` of `b` (loading a lazy binary first).
std::shared_ptr<kernel_state> make_kernel(const std::shared_ptr<binary_state>& b, std::size_t index,
                                          std::error_code& ec);

}  // namespace cora::detail
