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
  std::uint64_t offset = 0;     // where the image lies in the container
  std::uint64_t size = 0;       // and its size in bytes
  /// What a loader reads: bytes [0, load_size) of the image (a CPU image's headers and
  /// loadable segments, without its debug sections; all of any other), with their checksum.
  std::uint64_t load_size = 0;
  std::uint64_t load_checksum = 0;
  /// A CPU image's kernel records, inside the loaded part (0 and 0 for other images).
  std::uint64_t records_offset = 0;
  std::uint64_t records_size = 0;
};

/// A parsed .corabin container (views into the caller's bytes; no image bytes when only its
/// metadata was parsed).
struct corabin {
  std::vector<corabin_image> images;
  std::vector<backend::kernel_desc> kernels;  // metadata shared by every image
};

/// Parses and validates a .corabin container: its header, table and records (and their
/// checksum) always; the images' checksums too unless `verify_images` is false, for a loader
/// that checks only the image it picks (verify_corabin_image) rather than hash every image.
corabin parse_corabin(std::span<const std::byte> bytes, std::error_code& ec, std::string& message,
                      bool verify_images = true);

/// Bytes at the start of a container that hold its metadata (header, image table, kernel
/// records), as its header says; 0 when `head` holds no container header.
std::uint64_t corabin_meta_size(std::span<const std::byte> head) noexcept;

/// Parses and validates a container's metadata (header, table, records and their checksum) from
/// the first bytes of a container of `file_size` bytes in all (at least corabin_meta_size of
/// them), so that a loader reads only the metadata and the image it picks. The images get their
/// offset and size, no bytes.
corabin parse_corabin_meta(std::span<const std::byte> head, std::uint64_t file_size,
                           std::error_code& ec, std::string& message);

/// Checks one image of a parsed container, its `bytes` set: its size, its checksum and that its
/// bytes are of its kind; false with `ec` (errc::invalid_binary) and `message` if it fails.
bool verify_corabin_image(const corabin_image& image, std::error_code& ec, std::string& message);

/// Checks the loaded part of an image (`part`, its first load_size bytes) against its own
/// checksum and kind, for a loader that reads no more of the image.
bool verify_corabin_load_part(const corabin_image& image, std::span<const std::byte> part,
                              std::error_code& ec, std::string& message);

/// The kernel records of a container's CPU image, read from its loaded part `part` where the
/// image's entry says they lie.
std::vector<backend::kernel_desc> read_corabin_image_records(const corabin_image& image,
                                                             std::span<const std::byte> part,
                                                             std::error_code& ec,
                                                             std::string& message);

/// Bytes of a CPU image that the dynamic loader reads: up to the end of its last loadable
/// segment (the program headers and every PT_LOAD inside), so debug sections and the section
/// table need not be read or copied. The whole image when its headers do not say.
std::size_t loadable_size(std::span<const std::byte> image) noexcept;

/// Checks only that an image's bytes are of the kind its entry says.
bool check_corabin_image_kind(const corabin_image& image, std::error_code& ec, std::string& message);

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
