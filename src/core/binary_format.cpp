#include "core/binary_format.hpp"

#include <elf.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string_view>

#include "cora/detail/arg_layout.hpp"
#include "cora/detail/cpu_kernel_abi.h"
#include "cora/error.hpp"

namespace cora::detail {

namespace {

constexpr char corabin_magic[8] = {'C', 'O', 'R', 'A', 'B', 'I', 'N', '1'};
// Version 2: the image checksum is the four-lane word hash below (version 1 used bytewise
// FNV-1a, whose one-multiply-per-byte chain cost most of a load_binary of a small container).
// Version 3: the header, image table and kernel records have a checksum of their own, so an
// edited parameter layout cannot pass for the image's.
// Version 4: each image entry also gives the part of the image a loader reads (a CPU image's
// headers and loadable segments, without debug sections) with a checksum of its own, and where
// a CPU image's kernel records lie, so that a load reads and hashes only what it loads; the
// word hash has eight lanes, and the metadata's checksum folds the header's with the rest's.
// Version 5: the word hash mixes each step and finalizes its lanes (see image_checksum).
constexpr std::uint32_t corabin_version = 5;
constexpr std::uint32_t max_images = 16;
constexpr std::uint32_t max_kernels = 4096;
constexpr std::size_t max_args_block = 64 * 1024;
constexpr std::uint32_t fatbin_magic = 0xBA55ED50u;

// Little-endian on-disk layout of a .corabin container:
//   header | image table | kernel records (cora_kernel_record) | images (64-byte aligned)
struct corabin_header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_size;
  std::uint32_t image_count;
  std::uint32_t kernel_count;
  std::uint64_t records_offset;  // right after the image table
  std::uint64_t total_size;
  std::uint64_t meta_checksum;   // image_checksum() of header, table and records, this field 0
};
struct corabin_entry {
  std::uint32_t kind;
  std::uint32_t arch;
  std::uint64_t offset;
  std::uint64_t size;
  std::uint64_t checksum;        // image_checksum() of the image bytes
  std::uint64_t load_size;       // the loaded part: bytes [0, load_size) of the image
  std::uint64_t load_checksum;   // image_checksum() of the loaded part
  std::uint64_t records_offset;  // a CPU image's kernel records, inside the loaded part
  std::uint64_t records_size;    // (0 and 0 for other images)
};
static_assert(sizeof(corabin_entry) == 64);

template <class T>
bool read_at(std::span<const std::byte> bytes, std::uint64_t offset, T& out) noexcept {
  if (offset > bytes.size() || bytes.size() - offset < sizeof(T)) return false;
  std::memcpy(&out, bytes.data() + offset, sizeof(T));
  return true;
}

bool in_bounds(std::span<const std::byte> bytes, std::uint64_t offset, std::uint64_t size) noexcept {
  return offset <= bytes.size() && size <= bytes.size() - offset;
}

// Murmur3's 64-bit finalizer: every input bit reaches every output bit.
constexpr std::uint64_t fmix64(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// FNV-1a's steps over 64-bit little-endian words in eight independent lanes (so the multiplies
// overlap), each step followed by an xorshift, the lanes finalized and folded with the tail
// bytes and the length. Each step is a bijection of the lane's state, so any change confined to
// one word always changes the result. The xorshift is what version 5 added: a multiply carries
// a change only upward, so flips of a word's top bit stayed in the top bit, and two of them
// (in any lanes) cancelled: a fuzzed container with two such flips in a CPU image's relocations
// passed the check and crashed the dynamic loader. It guards against corruption, not tampering.
std::uint64_t image_checksum(std::span<const std::byte> bytes) noexcept {
  constexpr int lanes = 8;
  constexpr std::uint64_t basis = 0xcbf29ce484222325ull, prime = 0x100000001b3ull;
  std::uint64_t lane[lanes];
  for (int k = 0; k < lanes; ++k) lane[k] = basis ^ static_cast<std::uint64_t>(k);
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  for (; i + 8 * lanes <= n; i += 8 * lanes)
    // Unrolled, the lanes' chains overlap: about 3x the speed of the rolled loop GCC keeps at -O2.
#pragma GCC unroll 8
    for (int k = 0; k < lanes; ++k) {
      std::uint64_t w;
      std::memcpy(&w, bytes.data() + i + 8 * k, sizeof(w));
      const std::uint64_t x = (lane[k] ^ w) * prime;
      lane[k] = x ^ (x >> 32);
    }
  std::uint64_t h = basis;
  for (std::uint64_t l : lane) h = fmix64(h ^ fmix64(l));
  for (; i < n; ++i) h = (h ^ static_cast<std::uint8_t>(bytes[i])) * prime;
  return fmix64(h ^ n);
}

// The checksum of a container's metadata, bytes [0, end): the header's, with its own field
// zeroed, folded with that of the rest (read in place, not copied). Either part changed
// changes the result (each fold is a bijection of the part's checksum).
std::uint64_t meta_checksum(std::span<const std::byte> bytes, std::size_t end) {
  corabin_header h;
  if (end < sizeof(h) || !read_at(bytes, 0, h) || end > bytes.size()) return 0;
  h.meta_checksum = 0;
  constexpr std::uint64_t prime = 0x100000001b3ull;
  const std::uint64_t head = image_checksum(std::as_bytes(std::span(&h, 1)));
  const std::uint64_t rest = image_checksum(bytes.subspan(sizeof(h), end - sizeof(h)));
  return ((head * prime) ^ rest) * prime;
}

bool fail(std::error_code& ec, std::string& message, std::string what) {
  ec = make_error_code(errc::invalid_binary);
  message = std::move(what);
  return false;
}

bool is_ptx(std::span<const std::byte> bytes) noexcept {
  // Text that declares a PTX version near its start, after blank lines and // comments.
  const std::size_t limit = std::min<std::size_t>(bytes.size(), 4096);
  std::size_t i = 0;
  while (i < limit) {
    const char c = static_cast<char>(bytes[i]);
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      ++i;
    } else if (c == '/' && i + 1 < limit && static_cast<char>(bytes[i + 1]) == '/') {
      while (i < limit && static_cast<char>(bytes[i]) != '\n') ++i;
    } else {
      static constexpr char version[] = ".version";
      return limit - i >= sizeof(version) - 1 &&
             std::memcmp(bytes.data() + i, version, sizeof(version) - 1) == 0;
    }
  }
  return false;
}

bool valid_kernel_name(const char* name, std::size_t cap, std::string& out) {
  const void* nul = std::memchr(name, '\0', cap);
  if (!nul) return false;
  out.assign(name, static_cast<const char*>(nul));
  if (out.empty()) return false;
  for (char c : out)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  return !(out[0] >= '0' && out[0] <= '9');
}

bool read_records(std::span<const std::byte> section, std::uint64_t count_hint,
                  std::vector<backend::kernel_desc>& out, std::error_code& ec,
                  std::string& message) {
  constexpr std::size_t rs = sizeof(cora_kernel_record);
  if (section.size() % rs != 0)
    return fail(ec, message, "kernel records are truncated");
  const std::size_t n = section.size() / rs;
  if (n > max_kernels) return fail(ec, message, "too many kernel records");
  if (count_hint != std::numeric_limits<std::uint64_t>::max() && n != count_hint)
    return fail(ec, message, "kernel record count does not match the header");
  const std::size_t first = out.size();
  out.reserve(first + n);
  for (std::size_t i = 0; i < n; ++i) {
    cora_kernel_record r;
    std::memcpy(&r, section.data() + i * rs, rs);
    if (std::memcmp(r.magic, CORA_KERNEL_RECORD_MAGIC, 8) != 0 || r.record_size != rs)
      return fail(ec, message, "kernel record " + std::to_string(i) + " is malformed");
    if (r.param_count > CORA_KERNEL_MAX_PARAMS)
      return fail(ec, message, "kernel record " + std::to_string(i) + " has too many parameters");
    backend::kernel_desc k;
    if (!valid_kernel_name(r.name, sizeof(r.name), k.name))
      return fail(ec, message, "kernel record " + std::to_string(i) + " has an invalid name");
    if (r.flags & CORA_KERNEL_FLAG_HAS_ENTRY_KEY) k.entry_key = r.entry_key;
    k.form = r.flags & (CORA_KERNEL_FLAG_PHASED | CORA_KERNEL_FLAG_RAW_BARRIER);
    k.params.reserve(r.param_count);
    for (std::uint32_t p = 0; p < r.param_count; ++p) {
      const std::uint32_t size = r.param_size[p];
      const std::uint32_t align = r.param_align[p] & ~CORA_KERNEL_PARAM_POINTER;
      const bool pointer = (r.param_align[p] & CORA_KERNEL_PARAM_POINTER) != 0;
      if (size == 0 || size > max_args_block || align == 0 || (align & (align - 1)) != 0 ||
          align > 4096)
        return fail(ec, message, "kernel '" + k.name + "' has a malformed parameter");
      if (pointer && size != sizeof(void*))
        return fail(ec, message, "kernel '" + k.name + "' has a pointer parameter of the wrong size");
      k.params.push_back({size, align, pointer});
    }
    bool ok = true;
    canonical_block_size(k.params, ok);
    if (!ok) return fail(ec, message, "kernel '" + k.name + "' takes over 64 KiB of arguments");
    out.push_back(std::move(k));
  }
  // Names are unique: sorted views of them (no copies; a load reads these records every time).
  std::vector<std::string_view> names;
  names.reserve(n);
  for (std::size_t i = first; i < out.size(); ++i) names.push_back(out[i].name);
  std::sort(names.begin(), names.end());
  if (auto twice = std::adjacent_find(names.begin(), names.end()); twice != names.end())
    return fail(ec, message, "kernel '" + std::string(*twice) + "' is defined twice");
  return true;
}

}  // namespace

binary_kind sniff_binary(std::span<const std::byte> bytes) noexcept {
  if (bytes.size() >= sizeof(corabin_magic) &&
      std::memcmp(bytes.data(), corabin_magic, sizeof(corabin_magic)) == 0)
    return binary_kind::corabin;
  if (bytes.size() >= sizeof(Elf64_Ehdr) && std::memcmp(bytes.data(), ELFMAG, SELFMAG) == 0) {
    Elf64_Ehdr eh;
    std::memcpy(&eh, bytes.data(), sizeof(eh));
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB)
      return binary_kind::foreign_elf;
    if (eh.e_machine == EM_X86_64 && eh.e_type == ET_DYN) return binary_kind::cpu_elf;
    if (eh.e_machine == EM_CUDA) return binary_kind::cuda_cubin;
    return binary_kind::foreign_elf;
  }
  std::uint32_t magic = 0;
  if (bytes.size() >= 16 && read_at(bytes, 0, magic) && magic == fatbin_magic)
    return binary_kind::cuda_fatbin;
  if (is_ptx(bytes)) return binary_kind::cuda_ptx;
  return binary_kind::unknown;
}

const char* binary_kind_name(binary_kind kind) noexcept {
  switch (kind) {
    case binary_kind::corabin: return "corabin";
    case binary_kind::cpu_elf: return "cpu-elf";
    case binary_kind::cuda_cubin: return "cuda-cubin";
    case binary_kind::cuda_fatbin: return "cuda-fatbin";
    case binary_kind::cuda_ptx: return "cuda-ptx";
    case binary_kind::foreign_elf: return "foreign-elf";
    case binary_kind::unknown: break;
  }
  return "unknown";
}

backend::image_kind to_image_kind(binary_kind kind) noexcept {
  switch (kind) {
    case binary_kind::cuda_cubin: return backend::image_kind::cuda_cubin;
    case binary_kind::cuda_fatbin: return backend::image_kind::cuda_fatbin;
    case binary_kind::cuda_ptx: return backend::image_kind::cuda_ptx;
    default: return backend::image_kind::cpu_elf;
  }
}

namespace {

// Finds section .cora_kernels of a CPU image through its section table: its offset and size.
bool find_cpu_kernel_records(std::span<const std::byte> elf, std::uint64_t& offset,
                             std::uint64_t& size, std::error_code& ec, std::string& message) {
  Elf64_Ehdr eh;
  if (!read_at(elf, 0, eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
    return fail(ec, message, "not an ELF image");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB ||
      eh.e_machine != EM_X86_64 || eh.e_type != ET_DYN)
    return fail(ec, message, "not an x86-64 shared object");
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum ||
      !in_bounds(elf, eh.e_shoff, static_cast<std::uint64_t>(eh.e_shnum) * sizeof(Elf64_Shdr)))
    return fail(ec, message, "ELF section table is malformed");
  auto section = [&](std::uint32_t i, Elf64_Shdr& sh) {
    return read_at(elf, eh.e_shoff + static_cast<std::uint64_t>(i) * sizeof(Elf64_Shdr), sh);
  };
  Elf64_Shdr strtab;
  if (!section(eh.e_shstrndx, strtab) || strtab.sh_type != SHT_STRTAB ||
      !in_bounds(elf, strtab.sh_offset, strtab.sh_size))
    return fail(ec, message, "ELF section names are malformed");
  static constexpr char wanted[] = CORA_KERNEL_RECORD_SECTION;
  for (std::uint32_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    if (!section(i, sh)) break;
    if (sh.sh_name >= strtab.sh_size || strtab.sh_size - sh.sh_name < sizeof(wanted)) continue;
    if (std::memcmp(elf.data() + strtab.sh_offset + sh.sh_name, wanted, sizeof(wanted)) != 0)
      continue;
    if (sh.sh_type != SHT_PROGBITS || !in_bounds(elf, sh.sh_offset, sh.sh_size))
      return fail(ec, message, "the kernel record section is malformed");
    offset = sh.sh_offset;
    size = sh.sh_size;
    return true;
  }
  return fail(ec, message,
              "ELF image has no cora kernel records (not built with cora_add_kernel_binary)");
}

std::vector<backend::kernel_desc> records_of(std::span<const std::byte> section,
                                             std::error_code& ec, std::string& message) {
  std::vector<backend::kernel_desc> out;
  if (!read_records(section, std::numeric_limits<std::uint64_t>::max(), out, ec, message)) return {};
  if (out.empty()) {
    fail(ec, message, "the image defines no kernels");
    return {};
  }
  return out;
}

}  // namespace

std::vector<backend::kernel_desc> read_cpu_kernel_records(std::span<const std::byte> elf,
                                                          std::error_code& ec,
                                                          std::string& message) {
  ec.clear();
  std::uint64_t offset = 0, size = 0;
  if (!find_cpu_kernel_records(elf, offset, size, ec, message)) return {};
  return records_of(elf.subspan(offset, size), ec, message);
}

std::vector<backend::kernel_desc> read_corabin_image_records(const corabin_image& image,
                                                             std::span<const std::byte> part,
                                                             std::error_code& ec,
                                                             std::string& message) {
  ec.clear();
  if (image.records_size == 0 || !in_bounds(part, image.records_offset, image.records_size)) {
    fail(ec, message, "ELF image has no cora kernel records (not built with cora_add_kernel_binary)");
    return {};
  }
  return records_of(part.subspan(image.records_offset, image.records_size), ec, message);
}

std::size_t loadable_size(std::span<const std::byte> image) noexcept {
  Elf64_Ehdr eh;
  if (image.size() < sizeof(eh)) return image.size();
  std::memcpy(&eh, image.data(), sizeof(eh));
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phoff > image.size() ||
      (image.size() - eh.e_phoff) / sizeof(Elf64_Phdr) < eh.e_phnum)
    return image.size();
  std::uint64_t end = eh.e_phoff + std::uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr);
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, image.data() + eh.e_phoff + i * sizeof(Elf64_Phdr), sizeof(ph));
    if (ph.p_offset > image.size() || ph.p_filesz > image.size() - ph.p_offset) return image.size();
    if (ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC || ph.p_type == PT_NOTE ||
        ph.p_type == PT_GNU_EH_FRAME || ph.p_type == PT_INTERP || ph.p_type == PT_TLS)
      end = std::max<std::uint64_t>(end, ph.p_offset + ph.p_filesz);
  }
  return static_cast<std::size_t>(end);
}

bool check_corabin_image_kind(const corabin_image& image, std::error_code& ec, std::string& message) {
  return sniff_binary(image.bytes) == image.kind ||
         fail(ec, message, "corabin image " + std::to_string(image.index) + " is not what its entry says");
}

bool verify_corabin_image(const corabin_image& image, std::error_code& ec, std::string& message) {
  if (image.bytes.size() != image.size)
    return fail(ec, message, "corabin image " + std::to_string(image.index) + " fails its checksum");
  const std::uint64_t whole = image_checksum(image.bytes);
  // Where the loaded part is the whole image (GPU images), one pass checks both sums.
  const std::uint64_t part =
      image.load_size == image.size ? whole : image_checksum(image.bytes.first(image.load_size));
  if (whole != image.checksum || part != image.load_checksum)
    return fail(ec, message, "corabin image " + std::to_string(image.index) + " fails its checksum");
  return check_corabin_image_kind(image, ec, message);
}

bool verify_corabin_load_part(const corabin_image& image, std::span<const std::byte> part,
                              std::error_code& ec, std::string& message) {
  if (part.size() != image.load_size || image_checksum(part) != image.load_checksum)
    return fail(ec, message, "corabin image " + std::to_string(image.index) + " fails its checksum");
  corabin_image whole = image;
  whole.bytes = part;
  return check_corabin_image_kind(whole, ec, message);
}

std::uint64_t corabin_meta_size(std::span<const std::byte> head) noexcept {
  corabin_header h;
  if (!read_at(head, 0, h) || std::memcmp(h.magic, corabin_magic, sizeof(corabin_magic)) != 0) return 0;
  if (h.image_count > max_images || h.kernel_count > max_kernels) return sizeof(corabin_header);
  return sizeof(corabin_header) + std::uint64_t{h.image_count} * sizeof(corabin_entry) +
         std::uint64_t{h.kernel_count} * sizeof(cora_kernel_record);
}

corabin parse_corabin_meta(std::span<const std::byte> head, std::uint64_t file_size,
                           std::error_code& ec, std::string& message) {
  ec.clear();
  corabin out;
  corabin_header h;
  if (!read_at(head, 0, h) || std::memcmp(h.magic, corabin_magic, sizeof(corabin_magic)) != 0) {
    fail(ec, message, "not a corabin container");
    return {};
  }
  if (h.version != corabin_version) {
    fail(ec, message, "unsupported corabin version " + std::to_string(h.version));
    return {};
  }
  if (h.header_size != sizeof(corabin_header) || h.total_size != file_size || head.size() > file_size) {
    fail(ec, message, "corabin container is truncated or has trailing bytes");
    return {};
  }
  if (h.image_count == 0 || h.image_count > max_images || h.kernel_count > max_kernels) {
    fail(ec, message, "corabin container has a bad image or kernel count");
    return {};
  }
  const std::uint64_t table = sizeof(corabin_header);
  if (!in_bounds(head, table, std::uint64_t{h.image_count} * sizeof(corabin_entry))) {
    fail(ec, message, "corabin image table is truncated");
    return {};
  }
  const std::uint64_t records_size = std::uint64_t{h.kernel_count} * sizeof(cora_kernel_record);
  if (h.records_offset != table + std::uint64_t{h.image_count} * sizeof(corabin_entry) ||
      !in_bounds(head, h.records_offset, records_size)) {
    fail(ec, message, "corabin kernel records are truncated or misplaced");
    return {};
  }
  if (meta_checksum(head, h.records_offset + records_size) != h.meta_checksum) {
    fail(ec, message, "corabin metadata (header, image table, kernel records) fails its checksum");
    return {};
  }
  if (!read_records(head.subspan(h.records_offset, records_size), h.kernel_count, out.kernels,
                    ec, message))
    return {};
  for (std::uint32_t i = 0; i < h.image_count; ++i) {
    corabin_entry e;
    read_at(head, table + std::uint64_t{i} * sizeof(corabin_entry), e);
    if (e.size == 0 || e.offset > file_size || e.size > file_size - e.offset) {
      fail(ec, message, "corabin image " + std::to_string(i) + " lies outside the file");
      return {};
    }
    const auto kind = static_cast<binary_kind>(e.kind);
    if (kind != binary_kind::cpu_elf && kind != binary_kind::cuda_cubin &&
        kind != binary_kind::cuda_fatbin && kind != binary_kind::cuda_ptx) {
      fail(ec, message, "corabin image " + std::to_string(i) + " has an unknown kind");
      return {};
    }
    // The loaded part is the whole of any image but a CPU one, and holds a CPU image's records.
    const bool cpu = kind == binary_kind::cpu_elf;
    if (e.load_size == 0 || e.load_size > e.size || (!cpu && e.load_size != e.size) ||
        (!cpu && (e.records_offset != 0 || e.records_size != 0)) ||
        e.records_offset > e.load_size || e.records_size > e.load_size - e.records_offset) {
      fail(ec, message, "corabin image " + std::to_string(i) + " has a malformed entry");
      return {};
    }
    corabin_image image;
    image.kind = kind;
    image.arch = e.arch;
    image.index = i;
    image.checksum = e.checksum;
    image.offset = e.offset;
    image.size = e.size;
    image.load_size = e.load_size;
    image.load_checksum = e.load_checksum;
    image.records_offset = e.records_offset;
    image.records_size = e.records_size;
    out.images.push_back(image);
  }
  return out;
}

corabin parse_corabin(std::span<const std::byte> bytes, std::error_code& ec, std::string& message,
                      bool verify_images) {
  corabin out = parse_corabin_meta(bytes, bytes.size(), ec, message);
  if (ec) return {};
  for (auto& image : out.images) {
    image.bytes = bytes.subspan(image.offset, image.size);
    if (verify_images ? !verify_corabin_image(image, ec, message)
                      : !check_corabin_image_kind(image, ec, message))
      return {};
  }
  return out;
}

std::vector<std::byte> write_corabin(const std::vector<corabin_input>& images,
                                     const std::vector<backend::kernel_desc>& kernels) {
  corabin_header h{};
  std::memcpy(h.magic, corabin_magic, sizeof(corabin_magic));
  h.version = corabin_version;
  h.header_size = sizeof(corabin_header);
  h.image_count = static_cast<std::uint32_t>(images.size());
  h.kernel_count = static_cast<std::uint32_t>(kernels.size());
  h.records_offset = sizeof(corabin_header) + images.size() * sizeof(corabin_entry);
  std::uint64_t end = h.records_offset + kernels.size() * sizeof(cora_kernel_record);
  std::vector<corabin_entry> entries;
  for (const auto& img : images) {
    end = align_up(end, 64);
    corabin_entry e{};
    e.kind = static_cast<std::uint32_t>(img.kind);
    e.arch = img.arch;
    e.offset = end;
    e.size = img.bytes.size();
    e.checksum = image_checksum(img.bytes);
    e.load_size = e.size;
    if (img.kind == binary_kind::cpu_elf) {
      // A CPU image's loader reads its headers and loadable segments, which hold its records;
      // an image without records keeps none (its load fails on that).
      std::error_code ec;
      std::string message;
      std::uint64_t offset = 0, size = 0;
      if (find_cpu_kernel_records(img.bytes, offset, size, ec, message)) {
        e.records_offset = offset;
        e.records_size = size;
      }
      e.load_size = std::max<std::uint64_t>(loadable_size(img.bytes), offset + size);
      if (e.load_size == 0) e.load_size = e.size;
    }
    e.load_checksum = image_checksum(std::span(img.bytes).first(e.load_size));
    entries.push_back(e);
    end += img.bytes.size();
  }
  h.total_size = end;
  std::vector<std::byte> out(end);
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + sizeof(h), entries.data(), entries.size() * sizeof(corabin_entry));
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    cora_kernel_record r{};
    std::memcpy(r.magic, CORA_KERNEL_RECORD_MAGIC, 8);
    r.record_size = sizeof(r);
    r.param_count = static_cast<std::uint32_t>(kernels[i].params.size());
    r.flags = kernels[i].form & (CORA_KERNEL_FLAG_PHASED | CORA_KERNEL_FLAG_RAW_BARRIER);
    std::memcpy(r.name, kernels[i].name.data(),
                std::min(kernels[i].name.size(), sizeof(r.name) - 1));
    if (kernels[i].entry_key) {
      r.entry_key = *kernels[i].entry_key;
      r.flags |= CORA_KERNEL_FLAG_HAS_ENTRY_KEY;
    }
    for (std::size_t p = 0; p < kernels[i].params.size() && p < CORA_KERNEL_MAX_PARAMS; ++p) {
      r.param_size[p] = kernels[i].params[p].size;
      r.param_align[p] =
          kernels[i].params[p].align | (kernels[i].params[p].pointer ? CORA_KERNEL_PARAM_POINTER : 0u);
    }
    std::memcpy(out.data() + h.records_offset + i * sizeof(r), &r, sizeof(r));
  }
  for (std::size_t i = 0; i < images.size(); ++i)
    std::memcpy(out.data() + entries[i].offset, images[i].bytes.data(), images[i].bytes.size());
  h.meta_checksum = meta_checksum(out, h.records_offset + kernels.size() * sizeof(cora_kernel_record));
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

std::size_t canonical_block_size(const std::vector<backend::param_desc>& params, bool& ok) noexcept {
  std::size_t end = 0;
  for (const auto& p : params) {
    // next_param_offset with a mask, not a division: every load checks every kernel's records
    // (twice on the CPU device), and alignments are powers of two (read_records checks them).
    const std::size_t slot = slot_alignment(p.align);
    end = ((slot & (slot - 1)) == 0 ? (end + slot - 1) & ~(slot - 1) : next_param_offset(end, p.align)) + p.size;
    if (end > max_args_block) {
      ok = false;
      return 0;
    }
  }
  ok = true;
  return align_up(end, 8);
}

bool entry_key_of(const std::string& name, std::uint64_t& key) noexcept {
  const auto us = name.rfind('_');
  if (us == std::string::npos || us + 1 >= name.size() || us == 0) return false;
  std::uint64_t k = 0;
  for (std::size_t i = us + 1; i < name.size(); ++i) {
    const char c = name[i];
    if (c < '0' || c > '9') return false;
    if (k > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) return false;
    k = k * 10 + static_cast<std::uint64_t>(c - '0');
  }
  key = k;
  return true;
}

}  // namespace cora::detail
