#include "backend/cuda/cuda_image.hpp"

#include <elf.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace cora::backend::cuda {

namespace {

constexpr std::uint32_t fatbin_magic = 0xBA55ED50u;
constexpr unsigned max_fatbin_entries = 4096;

template <class T>
bool read_at(std::span<const std::byte> bytes, std::uint64_t offset, T& out) noexcept {
  if (offset > bytes.size() || bytes.size() - offset < sizeof(T)) return false;
  std::memcpy(&out, bytes.data() + offset, sizeof(T));
  return true;
}

bool range_ok(std::span<const std::byte> bytes, std::uint64_t offset, std::uint64_t size) noexcept {
  return offset <= bytes.size() && size <= bytes.size() - offset;
}

bool cubin_in_bounds(std::span<const std::byte> image, std::string& why) {
  Elf64_Ehdr eh;
  if (!read_at(image, 0, eh) || eh.e_ident[EI_CLASS] != ELFCLASS64) {
    why = "the cubin's ELF header is truncated";
    return false;
  }
  if (eh.e_shnum && (eh.e_shentsize != sizeof(Elf64_Shdr) ||
                     !range_ok(image, eh.e_shoff, std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)))) {
    why = "the cubin's section table lies outside the image";
    return false;
  }
  if (eh.e_phnum && (eh.e_phentsize != sizeof(Elf64_Phdr) ||
                     !range_ok(image, eh.e_phoff, std::uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr)))) {
    why = "the cubin's program headers lie outside the image";
    return false;
  }
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    read_at(image, eh.e_shoff + std::uint64_t{i} * sizeof(sh), sh);
    if (sh.sh_type != SHT_NOBITS && sh.sh_type != SHT_NULL && !range_ok(image, sh.sh_offset, sh.sh_size)) {
      why = "section " + std::to_string(i) + " of the cubin lies outside the image";
      return false;
    }
  }
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    read_at(image, eh.e_phoff + std::uint64_t{i} * sizeof(ph), ph);
    if (!range_ok(image, ph.p_offset, ph.p_filesz)) {
      why = "segment " + std::to_string(i) + " of the cubin lies outside the image";
      return false;
    }
  }
  return true;
}

std::string strip_comments(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text.compare(i, 2, "//") == 0) {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (text.compare(i, 2, "/*") == 0) {
      const std::size_t end = text.find("*/", i + 2);
      i = end == std::string_view::npos ? text.size() : end + 2;
      out += ' ';
    } else {
      out += text[i++];
    }
  }
  return out;
}

std::uint32_t ptx_type_size(std::string_view type) {
  // .u8 .s8 .b8 .u16 .f16 .bf16 .u32 .f32 .u64 .f64 .b64 ...
  std::size_t i = type.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(type[i - 1]))) --i;
  if (i == type.size()) return 0;
  const unsigned bits = static_cast<unsigned>(std::stoul(std::string(type.substr(i))));
  return bits >= 8 ? bits / 8 : 0;
}

}  // namespace

unsigned cubin_arch(std::span<const std::byte> image) noexcept {
  Elf64_Ehdr eh;
  if (!read_at(image, 0, eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_machine != EM_CUDA)
    return 0;
  // CUDA's ELF ABI 8 (CUDA 12.8 on) keeps the SM in bits 8-15 of e_flags, older ones in 0-7.
  return eh.e_ident[EI_ABIVERSION] >= 8 ? (eh.e_flags >> 8) & 0xffu : eh.e_flags & 0xffu;
}

bool fatbin_entries(std::span<const std::byte> image, std::vector<fatbin_entry>& out,
                    std::string& why) noexcept {
  // Header: magic u32, version u16, header size u16, bytes of entries u64. Each entry: kind u16
  // (1 PTX, 2 ELF), version u16, header size u32, payload size u64, ..., architecture u32 at 28.
  out.clear();
  std::uint32_t magic = 0;
  std::uint16_t header_size = 0;
  std::uint64_t fat_size = 0;
  if (!read_at(image, 0, magic) || magic != fatbin_magic || !read_at(image, 6, header_size) ||
      !read_at(image, 8, fat_size) || header_size < 16 || !range_ok(image, header_size, fat_size)) {
    why = "the fatbin's header describes more bytes than the image has";
    return false;
  }
  std::uint64_t at = header_size;
  const std::uint64_t end = header_size + fat_size;
  try {
    while (at < end) {
      std::uint16_t kind = 0;
      std::uint32_t entry_header = 0, arch = 0;
      std::uint64_t payload = 0;
      if (!read_at(image, at, kind) || !read_at(image, at + 4, entry_header) ||
          !read_at(image, at + 8, payload) || entry_header < 32 || !range_ok(image, at, entry_header) ||
          !range_ok(image, at + entry_header, payload) || at + entry_header + payload > end) {
        why = "entry " + std::to_string(out.size()) + " of the fatbin lies outside the image";
        return false;
      }
      read_at(image, at + 28, arch);
      out.push_back({kind == 1, arch, at, payload});
      at += entry_header + payload;
      if (out.size() > max_fatbin_entries) {
        why = "the fatbin has too many entries";
        return false;
      }
    }
  } catch (...) {
    why = "out of memory";
    return false;
  }
  if (out.empty()) {
    why = "the fatbin is empty";
    return false;
  }
  return true;
}

bool image_in_bounds(std::span<const std::byte> image, image_kind kind, std::string& why) noexcept {
  try {
    if (kind == image_kind::cuda_cubin) return cubin_in_bounds(image, why);
    if (kind == image_kind::cuda_fatbin) {
      std::vector<fatbin_entry> entries;
      return fatbin_entries(image, entries, why);
    }
    return true;
  } catch (...) {
    why = "out of memory";
    return false;
  }
}

std::vector<ptx_entry> ptx_entries(std::string_view ptx) {
  const std::string text = strip_comments(ptx);
  std::vector<ptx_entry> out;
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  auto is_ident = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '%';
  };
  std::size_t pos = 0;
  while ((pos = text.find(".entry", pos)) != std::string::npos) {
    pos += 6;
    if (pos < text.size() && !is_space(text[pos])) continue;  // .entry_something
    while (pos < text.size() && is_space(text[pos])) ++pos;
    const std::size_t name_start = pos;
    while (pos < text.size() && is_ident(text[pos])) ++pos;
    ptx_entry e;
    e.name = text.substr(name_start, pos - name_start);
    if (e.name.empty()) continue;
    while (pos < text.size() && is_space(text[pos])) ++pos;
    if (pos < text.size() && text[pos] == '(') {
      const std::size_t close = text.find(')', pos);
      if (close == std::string::npos) break;
      std::string_view list(text.data() + pos + 1, close - pos - 1);
      pos = close + 1;
      // Parameters: ".param .u64 name", ".param .align 8 .b8 name[16]", ".param .u64 .ptr ...".
      std::size_t start = 0;
      while (start <= list.size()) {
        std::size_t comma = list.find(',', start);
        if (comma == std::string_view::npos) comma = list.size();
        std::string_view decl = list.substr(start, comma - start);
        start = comma + 1;
        std::uint32_t size = 0, align = 0, count = 1;
        std::size_t i = 0;
        bool any = false;
        while (i < decl.size()) {
          while (i < decl.size() && is_space(decl[i])) ++i;
          const std::size_t t = i;
          while (i < decl.size() && !is_space(decl[i])) ++i;
          std::string_view token = decl.substr(t, i - t);
          if (token.empty()) continue;
          any = true;
          if (token == ".align") {
            while (i < decl.size() && is_space(decl[i])) ++i;
            const std::size_t n = i;
            while (i < decl.size() && std::isdigit(static_cast<unsigned char>(decl[i]))) ++i;
            if (i > n && !align) align = static_cast<std::uint32_t>(std::stoul(std::string(decl.substr(n, i - n))));
          } else if (token[0] == '.' && token != ".param" && token != ".ptr" && !size) {
            size = ptx_type_size(token);
          } else if (const auto lb = token.find('['); lb != std::string_view::npos) {
            const auto rb = token.find(']', lb);
            if (rb != std::string_view::npos && rb > lb + 1)
              count = static_cast<std::uint32_t>(std::stoul(std::string(token.substr(lb + 1, rb - lb - 1))));
          }
        }
        if (!any) {
          if (comma == list.size()) break;
          continue;
        }
        e.params.push_back({size * count, align ? align : std::max<std::uint32_t>(size, 1)});
        if (comma == list.size()) break;
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace cora::backend::cuda
