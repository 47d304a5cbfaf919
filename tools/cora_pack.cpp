// cora-pack: builds a .corabin container from kernel images (used by cora_add_kernel_binary).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "backend/cuda/cuda_image.hpp"
#include "core/binary_format.hpp"
#include "io/file_reader.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Packs kernel images into one .corabin container"};
  std::string output;
  std::vector<std::string> cpu, cuda;
  app.add_option("-o,--output", output, "Container to write")->required();
  app.add_option("--cpu", cpu, "CPU kernel image (its kernel records become the metadata)");
  app.add_option("--cuda", cuda, "CUDA image: cubin, fatbin or PTX");
  CLI11_PARSE(app, argc, argv);
  if (cpu.empty() && cuda.empty()) {
    std::cerr << "cora-pack: give at least one image\n";
    return 2;
  }

  std::vector<cora::detail::corabin_input> images;
  std::vector<cora::backend::kernel_desc> kernels;
  auto read = [](const std::string& path) {
    std::error_code ec;
    std::string message;
    auto bytes = cora::detail::read_whole_file_sync(path, ec, message);
    if (ec) {
      std::cerr << "cora-pack: " << message << "\n";
      std::exit(1);
    }
    return bytes;
  };
  for (const auto& path : cpu) {
    auto bytes = read(path);
    std::error_code ec;
    std::string message;
    auto records = cora::detail::read_cpu_kernel_records(bytes, ec, message);
    if (ec) {
      std::cerr << "cora-pack: " << path << ": " << message << "\n";
      return 1;
    }
    if (kernels.empty()) kernels = std::move(records);
    images.push_back({cora::detail::binary_kind::cpu_elf, 0, std::move(bytes)});
  }
  for (const auto& path : cuda) {
    auto bytes = read(path);
    const auto kind = cora::detail::sniff_binary(bytes);
    if (kind != cora::detail::binary_kind::cuda_cubin && kind != cora::detail::binary_kind::cuda_fatbin &&
        kind != cora::detail::binary_kind::cuda_ptx) {
      std::cerr << "cora-pack: " << path << " is no cubin, fatbin or PTX\n";
      return 1;
    }
    // A cubin runs on one architecture; the container records it so the loader picks well.
    const unsigned arch = kind == cora::detail::binary_kind::cuda_cubin ? cora::backend::cuda::cubin_arch(bytes) : 0;
    images.push_back({kind, arch, std::move(bytes)});
  }
  const auto out = cora::detail::write_corabin(images, kernels);
  std::ofstream f(output, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (!f) {
    std::cerr << "cora-pack: cannot write " << output << "\n";
    return 1;
  }
  return 0;
}
