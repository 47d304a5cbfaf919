// Kernel binary formats: recognising images by their magic, reading the kernel records of CPU
// images, and the .corabin container. Every parser here takes untrusted bytes and must reject
// anything malformed with errc::invalid_binary (it is fuzzed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "backend/backend.hpp"

namespace cora::detail {

/// What a byte string looks like.
enum class binary_kind { unknown, corabin, cpu_elf, cuda_cubin, cuda_fatbin, cuda_ptx, foreign_elf };

/// Recognises a binary by its first bytes. Never fails; `unknown` for anything else.
binary_kind sniff_binary(std::span<const std::byte> bytes) noexcept;

/// A readable name for a kind ("corabin", "cpu-elf", "cuda-cubin"...).
const char* binary_kind_name(binary_kind kind) noexcept;

/// The image kind of a backend-loadable binary kind.
backend::image_kind to_image_kind(binary_kind kind) noexcept;

/// Reads the kernel records of a CPU image (section .cora_kernels of an x86-64 ELF).
std::vector<backend::kernel_desc> read_cpu_kernel_records(std::span<const std::byte> elf,
                                                          std::error_code& ec,
                                                          std::string& message);

/// One image inside a .corabin container.
struct corabin_image {
  binary_kind kind = binary_kind::unknown;
  std::uint32_t arch = 0;  // CUDA: 10 * major + minor of a cubin; 0 otherwise
  std::span<const std::byte> bytes;
  std::uint32_t index = 0;      // its place in the container's image table
  std::uint64_t checksum = 0;   // what the table says the bytes hash to
};

/// A parsed .corabin container (views into the caller's bytes).
struct corabin {
  std::vector<corabin_image> images;
  std::vector<backend::kernel_desc> kernels;  // metadata shared by every image
};

/// Parses and validates a .corabin container: its header, table and records (and their
/// checksum) always; the images' checksums too unless `verify_images` is false, for a loader
/// that checks only the image it picks (verify_corabin_image) rather than hash every image.
corabin parse_corabin(std::span<const std::byte> bytes, std::error_code& ec, std::string& message,
                      bool verify_images = true);

/// Checks one image of a parsed container against its checksum; false with `ec`
/// (errc::invalid_binary) and `message` if it fails.
bool verify_corabin_image(const corabin_image& image, std::error_code& ec, std::string& message);

/// An image to put into a container.
struct corabin_input {
  binary_kind kind;
  std::uint32_t arch;
  std::vector<std::byte> bytes;
};

/// Builds a container from images and the kernel metadata.
std::vector<std::byte> write_corabin(const std::vector<corabin_input>& images,
                                     const std::vector<backend::kernel_desc>& kernels);

/// The size of the canonical argument block for these parameters, or 0 with `ok` false when
/// it is over the 64 KiB limit.
std::size_t canonical_block_size(const std::vector<backend::param_desc>& params, bool& ok) noexcept;

/// Entry key of a kernel name: the number after the last '_' ("add_custom_1" -> 1).
bool entry_key_of(const std::string& name, std::uint64_t& key) noexcept;

}  // namespace cora::detail
