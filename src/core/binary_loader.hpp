// Turning bytes into a loaded binary: format recognition, image choice, backend load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "core/binary_format.hpp"
#include "cora/binary.hpp"

namespace cora::detail {

class binary_state;
class device_state;
class kernel_state;

/// In-memory and file loads of images up to this size complete without a hop to the host
/// pool: the work is a checksum pass and a dlopen of the loadable part, or a driver load on an
/// idle GPU, well under a millisecond, less than a hop.
inline constexpr std::size_t inline_cpu_load_bytes = std::size_t{4} << 20;

/// Whether loading an image of `image_bytes` on `dev` may run on the thread at hand whatever the
/// device is doing: on the CPU device, for images up to inline_cpu_load_bytes. A GPU load calls
/// the driver, which waits for the device's running kernels (backend load_waits()): it runs
/// through device_state::run_when_idle, on the thread at hand only while the device is idle.
bool loads_inline(const device_state& dev, std::size_t image_bytes) noexcept;

/// What a load will do: which image of the bytes it loads, and what it checks it against.
struct load_plan {
  binary_kind kind = binary_kind::unknown;  // of the image loaded
  bool container = false;                   // the image comes from a .corabin
  corabin_image image;                      // its place (offset, size) and, in a container, its checksums
  std::uint64_t part_size = 0;              // bytes of it read and loaded, from image.offset
  std::vector<backend::kernel_desc> declared;  // the container's metadata
  std::string format;                          // binary::format()
};

/// Plans the load of a binary of `file_size` bytes on `dev`, `head` being its first bytes
/// (all of them, or at least a container's metadata): recognises it, parses and checks a
/// container's metadata and picks its image. Cheap (no pass over an image); never blocks.
bool plan_load(device_state& dev, std::span<const std::byte> head, std::uint64_t file_size,
               load_plan& plan, std::error_code& ec, std::string& message);

/// CORA_CPU_FULL_IMAGES=1: the CPU device loads a container's CPU image whole, debug sections
/// included (for debuggers that read symbols from the loaded file), not only its loaded part.
bool full_cpu_images() noexcept;

/// Loads the planned image, `image` being the bytes of its part (plan.part_size of them, from
/// plan.image.offset; valid for the call only): checks it against its checksum and the
/// metadata, then loads it (on a GPU the driver waits for running kernels: call it through
/// device_state::run_when_idle, see loads_inline).
/// A container's image is loaded named by its checksum (backend::image_key), so that a backend
/// that keeps its unloaded images (the CPU device's memory files) loads the same bytes again
/// from what it kept.
/// A caller done with the plan moves it in, its kernel records with it.
std::shared_ptr<binary_state> load_planned(std::shared_ptr<device_state> dev, load_plan plan,
                                           std::span<const std::byte> image,
                                           const load_options& options, std::error_code& ec,
                                           std::string& message);

/// plan_load and load_planned of bytes in memory (blocking, see load_planned).
std::shared_ptr<binary_state> load_binary_image(std::shared_ptr<device_state> dev,
                                                std::span<const std::byte> bytes,
                                                const load_options& options, std::error_code& ec,
                                                std::string& message);

/// Called with the loaded binary, or with an error and a message.
using file_load_callback =
    std::function<void(std::error_code ec, std::string message, std::shared_ptr<binary_state> b)>;

/// Loads `path` without blocking the caller: reads a container's metadata and the image it
/// picks (not the rest), on the calling thread where the page cache holds them and the load
/// would run there from memory, else through the I/O queue; then loads the image as a load
/// from memory does (here, on the I/O thread, the host pool, or once a GPU is idle). I/O
/// errors name the path; others do not.
void load_binary_file(std::shared_ptr<device_state> dev, const std::filesystem::path& path,
                      const load_options& options, file_load_callback done);

/// Resolves kernel `index` of `b` (loading a lazy binary first).
std::shared_ptr<kernel_state> make_kernel(const std::shared_ptr<binary_state>& b, std::size_t index,
                                          std::error_code& ec);

}  // namespace cora::detail
