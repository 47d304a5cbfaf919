// cora-inspect FILE: what a kernel binary holds. The formats found (corabin container, CPU
// image, cubin, fatbin, PTX), the images of a container, and its kernels with entry keys and
// parameter layouts in cora's canonical argument block. Reads the file without a device;
// --device N also loads it there and lists the kernels as that device sees them.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <cora/cora.hpp>

#include "backend/cuda/cuda_image.hpp"
#include "core/binary_format.hpp"
#include "cora/detail/arg_layout.hpp"
#include "cora/detail/cpu_kernel_abi.h"
#include "io/file_reader.hpp"

namespace {

using cora::backend::kernel_desc;
using cora::detail::binary_kind;

struct kernel_row {
  std::string name;
  std::optional<std::uint64_t> entry;
  std::vector<cora::param_info> params;  // canonical offsets
  std::size_t block = 0;
  std::string cpu_path;  // for kernels with a CPU image: the path their threads take
};

// The CPU-device path a kernel's source reads as (docs/kernels.md).
std::string cpu_path_of(const kernel_desc& k) {
  if (k.form & CORA_KERNEL_FLAG_PHASED) return "phased";
  if (k.form & CORA_KERNEL_FLAG_RAW_BARRIER) return "fibers";
  return "loop";
}

kernel_row row_of(const kernel_desc& k, bool cpu = false) {
  kernel_row r{k.name, k.entry_key, {}, 0, cpu ? cpu_path_of(k) : std::string()};
  std::uint64_t key;
  if (!r.entry && cora::detail::entry_key_of(k.name, key)) r.entry = key;
  std::size_t end = 0;
  for (const auto& p : k.params) {
    const std::size_t off = cora::detail::next_param_offset(end, p.align);
    r.params.push_back({off, p.size, p.align});
    end = off + p.size;
  }
  r.block = cora::detail::align_up(end, 8);
  return r;
}

void print_kernels(const std::vector<kernel_row>& rows) {
  std::size_t width = 6;
  bool cpu = false;
  for (const auto& r : rows) {
    width = std::max(width, r.name.size());
    cpu = cpu || !r.cpu_path.empty();
  }
  std::printf("  %-*s  %5s  %5s  %s%s\n", static_cast<int>(width), "kernel", "entry", "block",
              cpu ? "cpu path  " : "", "parameters: size/align@offset");
  for (const auto& r : rows) {
    std::string params;
    for (const auto& p : r.params)
      params += (params.empty() ? "" : " ") + std::to_string(p.size) + "/" + std::to_string(p.align) + "@" +
                std::to_string(p.offset);
    if (r.params.empty()) params = "(none)";
    std::string path = cpu ? r.cpu_path : std::string();
    if (cpu) path.resize(10, ' ');
    std::printf("  %-*s  %5s  %5zu  %s%s\n", static_cast<int>(width), r.name.c_str(),
                r.entry ? std::to_string(*r.entry).c_str() : "-", r.block, path.c_str(), params.c_str());
  }
  if (cpu)
    std::printf("  cpu path (blocks of more than one thread on the CPU device, as the source reads;\n"
                "  docs/kernels.md): loop = the threads as a loop; phased = each block_threads an\n"
                "  inner loop; fibers = the fallback for a raw sync_block (slow)\n");
}

std::string fatbin_summary(std::span<const std::byte> image) {
  std::vector<cora::backend::cuda::fatbin_entry> entries;
  std::string why;
  if (!cora::backend::cuda::fatbin_entries(image, entries, why)) return "malformed: " + why;
  std::string out;
  for (const auto& e : entries) {
    if (!out.empty()) out += ", ";
    out += (e.ptx ? "compute_" : "sm_") + std::to_string(e.arch) + (e.ptx ? " PTX" : " code");
  }
  return out;
}

std::string image_summary(binary_kind kind, std::span<const std::byte> image) {
  switch (kind) {
    case binary_kind::cuda_cubin: {
      const unsigned arch = cora::backend::cuda::cubin_arch(image);
      return arch ? "sm_" + std::to_string(arch) + " code" : "unknown architecture";
    }
    case binary_kind::cuda_fatbin: return fatbin_summary(image);
    case binary_kind::cuda_ptx: {
      const std::string_view text(reinterpret_cast<const char*>(image.data()), image.size());
      const auto target = text.find(".target");
      if (target == std::string_view::npos) return "PTX";
      const auto end = text.find_first_of("\r\n", target);
      return std::string(text.substr(target, end == std::string_view::npos ? end : end - target));
    }
    default: return {};
  }
}

std::vector<kernel_row> ptx_rows(std::span<const std::byte> image) {
  std::vector<kernel_row> rows;
  const std::string_view text(reinterpret_cast<const char*>(image.data()), image.size());
  for (const auto& e : cora::backend::cuda::ptx_entries(text)) rows.push_back(row_of({e.name, std::nullopt, e.params, true}));
  return rows;
}

int inspect_offline(const std::string& path, const std::vector<std::byte>& bytes) {
  const binary_kind kind = cora::detail::sniff_binary(bytes);
  std::printf("file: %s (%zu bytes)\nformat: %s\n", path.c_str(), bytes.size(), cora::detail::binary_kind_name(kind));
  std::error_code ec;
  std::string message;
  std::vector<kernel_row> rows;
  const char* source = nullptr;
  switch (kind) {
    case binary_kind::corabin: {
      const auto c = cora::detail::parse_corabin(bytes, ec, message);
      if (ec) {
        std::printf("malformed container: %s\n", message.c_str());
        return 1;
      }
      std::printf("images:\n");
      for (std::size_t i = 0; i < c.images.size(); ++i) {
        const auto& img = c.images[i];
        std::string summary = image_summary(img.kind, img.bytes);
        // What a load reads of the image, when less than all of it (a CPU image's debug
        // sections are never read).
        if (img.load_size < img.size)
          summary = "loads " + std::to_string(img.load_size) + " bytes" + (summary.empty() ? "" : ", ") + summary;
        std::printf("  [%zu] %-12s %9zu bytes%s%s\n", i, cora::detail::binary_kind_name(img.kind),
                    img.bytes.size(), summary.empty() ? "" : "  ", summary.c_str());
      }
      bool has_cpu = false;
      for (const auto& img : c.images) has_cpu = has_cpu || img.kind == binary_kind::cpu_elf;
      for (const auto& k : c.kernels) rows.push_back(row_of(k, has_cpu));
      source = "the container's metadata";
      if (rows.empty()) {
        for (const auto& img : c.images)
          if (img.kind == binary_kind::cuda_ptx) rows = ptx_rows(img.bytes);
        source = rows.empty() ? nullptr : "the container's PTX";
      }
      break;
    }
    case binary_kind::cpu_elf: {
      const auto records = cora::detail::read_cpu_kernel_records(bytes, ec, message);
      if (ec) {
        std::printf("malformed CPU image: %s\n", message.c_str());
        return 1;
      }
      for (const auto& k : records) rows.push_back(row_of(k, true));
      source = "the image's kernel records";
      break;
    }
    case binary_kind::cuda_cubin:
    case binary_kind::cuda_fatbin:
      std::printf("image: %s\n", image_summary(kind, bytes).c_str());
      break;
    case binary_kind::cuda_ptx:
      std::printf("image: %s\n", image_summary(kind, bytes).c_str());
      rows = ptx_rows(bytes);
      source = "the PTX text";
      break;
    case binary_kind::foreign_elf:
      std::printf("an ELF file that is no kernel image (wrong machine or type)\n");
      return 1;
    case binary_kind::unknown:
      std::printf("not a kernel binary (no known format: corabin, CPU kernel image, cubin, fatbin, PTX)\n");
      return 1;
  }
  if (source) {
    std::printf("kernels (%zu, from %s; offsets in cora's canonical argument block):\n", rows.size(), source);
    print_kernels(rows);
  } else {
    std::printf("kernels: not listed in the file; --device N loads it on a device and lists them\n");
  }
  return 0;
}

int inspect_on_device(const std::string& path, std::size_t index) {
  cora::runtime rt;
  cora::device& dev = rt.device(index);
  std::printf("\nloaded on device %zu, %s:\n", index, dev.name().c_str());
  cora::binary bin;
  try {
    bin = dev.load_binary(std::filesystem::path(path)).wait();
  } catch (const cora::error& e) {
    std::printf("  cannot load it: %s\n", e.what());
    return 1;
  }
  std::printf("  format: %s\n", bin.format().c_str());
  std::vector<kernel_row> rows;
  for (const auto& name : bin.kernel_names()) {
    const cora::kernel k = bin.kernel(name);
    kernel_row r{name, k.entry_key(), {}, k.args_size(), {}};
    r.params.assign(k.params().begin(), k.params().end());
    rows.push_back(std::move(r));
  }
  print_kernels(rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shows what a kernel binary holds: formats, images, kernels, entry keys, parameter layouts"};
  std::string path;
  std::optional<std::size_t> device;
  app.add_option("file", path, "Kernel binary (.corabin, CPU image, cubin, fatbin, PTX)")->required();
  app.add_option("-d,--device", device, "Also load it on device N (see cora-info) and list its kernels there");
  CLI11_PARSE(app, argc, argv);

  std::error_code ec;
  std::string message;
  const auto bytes = cora::detail::read_whole_file_sync(path, ec, message);
  if (ec) {
    std::fprintf(stderr, "cora-inspect: %s\n", message.c_str());
    return 1;
  }
  try {
    int rc = inspect_offline(path, bytes);
    if (device) rc |= inspect_on_device(path, *device);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cora-inspect: %s\n", e.what());
    return 1;
  }
}
