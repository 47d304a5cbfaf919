// The CANN sample 0_launch_kernel on cora's C++ API: an fp16 vector add over 8 blocks of 2048
// elements, in "simple" mode (three pointer arguments) or "placeholder" mode (two extra int32
// tiling arguments delivered through placeholders). Generates the inputs and the golden
// output, runs the kernel, writes output/output_z.bin and checks it as the sample's
// verify_result.py does.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include <cora/cora.hpp>

namespace {

constexpr std::uint32_t num_blocks = 8;
constexpr std::uint32_t total_length = 8 * 2048;
constexpr std::int32_t tile_num = 8;

cora::task<void> run(cora::device& dev, const std::string& mode, const std::string& binary_path,
                     const std::vector<cora::half>& x, const std::vector<cora::half>& y,
                     std::vector<cora::half>& z) {
  cora::stream s = dev.make_stream();
  auto hx = dev.alloc_host<cora::half>(total_length);
  auto hy = dev.alloc_host<cora::half>(total_length);
  auto hz = dev.alloc_host<cora::half>(total_length);
  auto dx = dev.alloc<cora::half>(total_length);
  auto dy = dev.alloc<cora::half>(total_length);
  auto dz = dev.alloc<cora::half>(total_length);
  std::copy(x.begin(), x.end(), hx.begin());
  std::copy(y.begin(), y.end(), hy.begin());
  (void)s.copy(dx, hx);
  (void)s.copy(dy, hy);

  cora::binary bin = co_await dev.load_binary(std::filesystem::path(binary_path));
  cora::kernel add = bin.kernel("add_custom");
  cora::kernel_args args(add);
  args.append(dx.data());
  args.append(dy.data());
  args.append(dz.data());
  if (mode == "placeholder") {
    auto len = args.append_placeholder();
    auto num = args.append_placeholder();
    *static_cast<std::int32_t*>(args.placeholder_buffer(len, sizeof(std::int32_t))) = total_length;
    *static_cast<std::int32_t*>(args.placeholder_buffer(num, sizeof(std::int32_t))) = tile_num;
  }
  args.finalize();
  (void)s.launch(add, {.grid = num_blocks}, args);
  co_await s.copy(hz, dz);
  z.assign(hz.begin(), hz.end());
  bin.unload();
}

bool write_file(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cora's port of the CANN launch_kernel sample"};
  std::string mode = "simple";
  std::string kernels_dir = CORA_SAMPLE_KERNELS_DIR;
  std::string output_dir = "output";
  unsigned seed = std::random_device{}();
  app.add_option("-m,--mode", mode, "simple or placeholder")->check(CLI::IsMember({"simple", "placeholder"}));
  app.add_option("--kernels", kernels_dir, "Directory holding add_custom.corabin and add_custom_tiling.corabin");
  app.add_option("--output", output_dir, "Directory for output_z.bin and golden.bin");
  app.add_option("--seed", seed, "Seed of the input data");
  CLI11_PARSE(app, argc, argv);

  // Inputs as gen_data.py makes them: uniform in [1, 100), rounded to fp16; golden = x + y.
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(1.0f, 100.0f);
  std::vector<cora::half> x(total_length), y(total_length), golden(total_length), z;
  for (std::uint32_t i = 0; i < total_length; ++i) {
    x[i] = cora::half(dist(rng));
    y[i] = cora::half(dist(rng));
    golden[i] = cora::half(float(x[i]) + float(y[i]));
  }

  try {
    cora::runtime rt;
    cora::device& dev = rt.default_device();
    std::printf("[INFO] Kernel launch sample runs in %s mode on %s.\n", mode.c_str(), dev.name().c_str());
    const std::string binary = kernels_dir + (mode == "simple" ? "/add_custom.corabin" : "/add_custom_tiling.corabin");
    cora::sync_wait(run(dev, mode, binary, x, y, z));
    std::printf("[INFO] Run the launch_kernel sample successfully.\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[ERROR] %s\n", e.what());
    return 1;
  }

  std::filesystem::create_directories(output_dir);
  if (!write_file(output_dir + "/output_z.bin", z.data(), z.size() * sizeof(cora::half)) ||
      !write_file(output_dir + "/golden.bin", golden.data(), golden.size() * sizeof(cora::half))) {
    std::fprintf(stderr, "[ERROR] cannot write to %s\n", output_dir.c_str());
    return 1;
  }

  // verify_result.py: np.isclose(output, golden, rtol=1e-3, atol=1e-5); error ratio <= 1e-3.
  const double rtol = 1e-3, atol = 1e-5, tolerance = 1e-3;
  std::size_t mismatches = 0;
  for (std::uint32_t i = 0; i < total_length; ++i) {
    const double a = float(z[i]), b = float(golden[i]);
    const bool close = (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= atol + rtol * std::fabs(b);
    if (!close) {
      if (mismatches < 100)
        std::printf("[ERROR] index %u: expected %f, actual %f, rdiff %f\n", i, b, a,
                    std::fabs(a - b) / std::max(std::fabs(b), 1e-12));
      ++mismatches;
    }
  }
  const double ratio = static_cast<double>(mismatches) / total_length;
  std::printf("error ratio: %.4f, tolerance: %.4f\n", ratio, tolerance);
  if (ratio > tolerance) {
    std::printf("[FAILURE] result error\n");
    return 1;
  }
  std::printf("[SUCCESS] result correct\n");
  return 0;
}
