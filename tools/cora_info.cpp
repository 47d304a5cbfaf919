// cora-info: the backends cora finds, why one is unavailable, and every device with its
// properties (like `nvidia-smi -L`, with details). CORA_* environment variables apply, as in
// any program that makes a cora::runtime.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include <cora/cora.hpp>

namespace {

std::string bytes_text(std::size_t bytes) {
  char out[64];
  if (bytes >= (std::size_t{1} << 30))
    std::snprintf(out, sizeof(out), "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  else if (bytes >= (std::size_t{1} << 20))
    std::snprintf(out, sizeof(out), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(out, sizeof(out), "%.1f KiB", static_cast<double>(bytes) / 1024);
  return out;
}

std::string dims(const cora::dim3& d) {
  return std::to_string(d.x) + " x " + std::to_string(d.y) + " x " + std::to_string(d.z);
}

const char* backend_name(cora::backend_kind k) { return k == cora::backend_kind::cuda ? "cuda" : "cpu"; }

/// One line per device: "device 0 [cuda 0]: NVIDIA H200 (UUID: GPU-...)".
void print_line(std::size_t i, const cora::device_properties& p) {
  std::printf("device %zu [%s %u]: %s", i, backend_name(p.backend), p.ordinal, p.name.c_str());
  if (!p.uuid.empty()) std::printf(" (UUID: %s)", p.uuid.c_str());
  std::printf("\n");
}

void print_details(const cora::device_properties& p) {
  auto row = [](const char* key, const std::string& value) {
    if (!value.empty()) std::printf("    %-20s %s\n", key, value.c_str());
  };
  const bool gpu = p.backend == cora::backend_kind::cuda;
  row("compute units", std::to_string(p.compute_units) + (gpu ? " SMs" : " worker threads"));
  row("memory", bytes_text(p.total_memory));
  if (gpu) row("compute capability", std::to_string(p.compute_major) + "." + std::to_string(p.compute_minor));
  row("max grid", dims(p.max_grid));
  row("max block", dims(p.max_block) + " (" + std::to_string(p.max_threads_per_block) + " threads)");
  row("shared memory", p.max_shared_bytes ? bytes_text(p.max_shared_bytes) + " per block" : "none");
  row("driver", p.driver);
  row("PCI bus", p.pci_bus_id);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Lists cora's backends and devices"};
  bool list = false;
  app.add_flag("-L,--list", list, "One line per device, nothing else");
  CLI11_PARSE(app, argc, argv);

  try {
    cora::runtime rt;
    if (list) {
      for (std::size_t i = 0; i < rt.device_count(); ++i) print_line(i, rt.device(i).properties());
      return 0;
    }
    const auto& o = rt.options();
    std::printf("cora %s\n", CORA_VERSION);
    std::printf("completion policy: %s", cora::to_string(o.completion));
    if (o.completion == cora::completion_policy::hybrid)
      std::printf(" (spins %lld us before handing long waits to the engine thread)",
                  static_cast<long long>(o.spin_limit.count()));
    std::printf("\n\nbackends:\n");
    for (const auto& b : rt.backends())
      std::printf("  %-5s %-12s %zu device%s  %s\n", b.name.c_str(), b.available ? "available" : "unavailable",
                  b.devices, b.devices == 1 ? " " : "s", b.detail.c_str());
    std::printf("\ndevices (default: %zu):\n", rt.default_device().index());
    for (std::size_t i = 0; i < rt.device_count(); ++i) {
      print_line(i, rt.device(i).properties());
      print_details(rt.device(i).properties());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cora-info: %s\n", e.what());
    return 1;
  }
  return 0;
}
