#include "cora/launch.hpp"

#include <cstring>
#include <numeric>
#include <vector>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

class launch_test : public device_test {
 protected:
  // Runs add_f32 through `launch` and checks z = x + y.
  template <class Launch>
  void check_add(Launch&& launch) {
    auto s = dev().make_stream();
    const std::size_t n = 4096;
    auto x = dev().alloc<float>(n), y = dev().alloc<float>(n), z = dev().alloc<float>(n);
    auto hx = dev().alloc_host<float>(n), hy = dev().alloc_host<float>(n), hz = dev().alloc_host<float>(n);
    for (std::size_t i = 0; i < n; ++i) {
      hx[i] = static_cast<float>(i);
      hy[i] = 0.5f;
    }
    (void)s.copy(x, hx);
    (void)s.copy(y, hy);
    (void)s.fill(z, 0);
    launch(s, kernels().kernel("add_f32"), x, y, z, std::uint64_t{n}).wait();
    s.copy(hz, z).wait();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hz[i], static_cast<float>(i) + 0.5f) << i;
  }
};
CORA_DEVICE_SUITE(launch_test);

TEST_P(launch_test, TypedArguments) {
  check_add([](stream& s, const kernel& k, auto& x, auto& y, auto& z, std::uint64_t n) {
    return s.launch(k, {.grid = 7}, x, y, z, n);
  });
}

TEST_P(launch_test, RawDevicePointersAreAccepted) {
  check_add([](stream& s, const kernel& k, auto& x, auto& y, auto& z, std::uint64_t n) {
    return s.launch(k, {.grid = 3}, static_cast<const float*>(x.data()), y.data(), z.data(), n);
  });
}

TEST_P(launch_test, ArgumentList) {
  check_add([](stream& s, const kernel& k, auto& x, auto& y, auto& z, std::uint64_t n) {
    kernel_args args(k);
    args.append(x.data());
    args.append(y.data());
    args.append(z.data());
    args.append(n);
    args.finalize();
    return s.launch(k, {.grid = 5}, args);
  });
}

TEST_P(launch_test, HostBlockInCannLayout) {
  check_add([](stream& s, const kernel& k, auto& x, auto& y, auto& z, std::uint64_t n) {
    // What CANN code writes: one 8-byte slot per parameter.
    void* block[] = {x.data(), y.data(), z.data(), reinterpret_cast<void*>(n)};
    return s.launch_host_block(k, {.grid = 4}, std::as_bytes(std::span(block)));
  });
}

TEST_P(launch_test, PointerArray) {
  check_add([](stream& s, const kernel& k, auto& x, auto& y, auto& z, std::uint64_t n) {
    float* px = x.data();
    float* py = y.data();
    float* pz = z.data();
    const void* args[] = {&px, &py, &pz, &n};
    return s.launch_pointer_array(k, {.grid = 2}, args);
  });
}

TEST_P(launch_test, DeviceResidentBlock) {
  if (GetParam() == backend::cuda) GTEST_SKIP() << "the CUDA backend refuses device-resident blocks";
  check_add([this](stream& s, const kernel& k, auto& x, auto& y, auto& z, std::uint64_t n) {
    void* block[] = {x.data(), y.data(), z.data(), reinterpret_cast<void*>(n)};
    auto dblock = dev().alloc<std::byte>(sizeof(block));
    (void)s.copy(dblock.data(), block, sizeof(block));  // pageable source: read before copy() returns
    auto p = s.launch_device_block(k, {.grid = 6}, dblock.data(), sizeof(block));
    p.wait();
    return p;
  });
}

TEST_P(launch_test, MixedParameterLayoutReachesTheKernelIntact) {
  auto s = dev().make_stream();
  auto out = dev().alloc<double>(5);
  struct pair16 {
    double a, b;
  };
  (void)s.launch(kernels().kernel("mixed_args"), {}, std::uint8_t{200}, std::uint16_t{60000},
                 pair16{1.5, -2.25}, std::uint32_t{4000000000u}, out);
  double h[5] = {};
  s.copy(h, out.data(), sizeof(h)).wait();
  EXPECT_EQ(h[0], 200);
  EXPECT_EQ(h[1], 60000);
  EXPECT_EQ(h[2], 1.5);
  EXPECT_EQ(h[3], -2.25);
  EXPECT_EQ(h[4], 4000000000.0);
}

TEST_P(launch_test, EveryBlockRuns) {
  auto s = dev().make_stream();
  const std::uint32_t n = 1000;
  auto out = dev().alloc<std::uint32_t>(n);
  (void)s.fill(out, 0xff);
  (void)s.launch(kernels().kernel("iota_u32"), {.grid = dim3(10, 3, 2)}, out, std::uint64_t{n});
  std::vector<std::uint32_t> h(n);
  s.copy(h.data(), out.data(), n * 4).wait();
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_EQ(h[i], i);
}

TEST_P(launch_test, WrongArgumentCountIsAMismatch) {
  auto s = dev().make_stream();
  auto x = dev().alloc<float>(4);
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("add_f32"), {}, x, x, x).wait(), errc::argument_mismatch);
}

TEST_P(launch_test, WrongArgumentSizeIsAMismatch) {
  auto s = dev().make_stream();
  auto x = dev().alloc<float>(4);
  try {
    s.launch(kernels().kernel("add_f32"), {}, x, x, x, 4).wait();  // int, not uint64_t
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::argument_mismatch));
    EXPECT_NE(std::string(e.what()).find("argument 3"), std::string::npos) << e.what();
  }
}

TEST_P(launch_test, PointerThatIsNoLiveAllocationIsRejected) {
  auto s = dev().make_stream();
  float host[4] = {};
  auto x = dev().alloc<float>(4);
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("add_f32"), {}, x, x, host, std::uint64_t{4}).wait(),
                    errc::invalid_pointer);
  float* freed = static_cast<float*>(dev().malloc(64));
  dev().free(freed);
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("add_f32"), {}, x, x, freed, std::uint64_t{4}).wait(),
                    errc::invalid_pointer);
}

TEST_P(launch_test, ZeroGridIsInvalid) {
  auto s = dev().make_stream();
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("empty"), {.grid = 0}).wait(), errc::invalid_launch_config);
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("empty"), {.grid = dim3(4, 0, 1)}).wait(),
                    errc::invalid_launch_config);
}

TEST_P(launch_test, GridOverTheDeviceLimitIsInvalid) {
  auto s = dev().make_stream();
  const auto max = dev().properties().max_grid;
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("empty"), {.grid = dim3(1, max.y + 1, 1)}).wait(),
                    errc::invalid_launch_config);
}

TEST_P(launch_test, BlockOverTheDeviceLimitIsInvalid) {
  auto s = dev().make_stream();
  const auto threads = dev().properties().max_threads_per_block;
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("empty"), {.block = threads + 1}).wait(),
                    errc::invalid_launch_config);
}

TEST_P(launch_test, AttributesTheDeviceCannotHonourAreErrors) {
  if (GetParam() == backend::cuda) GTEST_SKIP() << "the GPU honours these attributes";
  auto s = dev().make_stream();
  auto k = kernels().kernel("empty");
  EXPECT_CORA_ERROR(s.launch(k, {.shared_bytes = 1024}).wait(), errc::not_supported);
  EXPECT_CORA_ERROR(s.launch(k, {.cluster = dim3(2)}).wait(), errc::not_supported);
  EXPECT_CORA_ERROR(s.launch(k, {.priority = 1}).wait(), errc::not_supported);
  const unsigned units = dev().properties().compute_units;
  EXPECT_CORA_ERROR(s.launch(k, {.grid = units + 1, .cooperative = true}).wait(), errc::invalid_launch_config);
  s.launch(k, {.grid = units, .schedule = schedule_mode::batch}).wait();
}

TEST_P(launch_test, HostBlockOfTheWrongSizeIsAMismatch) {
  auto s = dev().make_stream();
  void* block[3] = {};
  EXPECT_CORA_ERROR(s.launch_host_block(kernels().kernel("add_f32"), {}, std::as_bytes(std::span(block))).wait(),
                    errc::argument_mismatch);
}

TEST_P(launch_test, PlaceholderTableMustPointAtPointerSlotsAndData) {
  auto s = dev().make_stream();
  auto k = kernels().kernel("add_f32");
  std::vector<std::byte> block(k.args_size() + 16);
  placeholder_info bad_slot[] = {{24, 32}};  // offset 24 is the uint64 n, still 8 bytes: ok slot
  placeholder_info bad_data[] = {{0, 4}};    // data inside the parameters
  placeholder_info off_slot[] = {{4, 32}};   // not a parameter's offset
  EXPECT_CORA_ERROR(s.launch_host_block(k, {}, block, bad_data).wait(), errc::placeholder_misuse);
  EXPECT_CORA_ERROR(s.launch_host_block(k, {}, block, off_slot).wait(), errc::placeholder_misuse);
  (void)bad_slot;
}

TEST_P(launch_test, NullEntryOfAPointerArrayIsInvalid) {
  auto s = dev().make_stream();
  const void* args[4] = {};
  EXPECT_CORA_ERROR(s.launch_pointer_array(kernels().kernel("add_f32"), {}, args).wait(), errc::invalid_argument);
}

TEST_P(launch_test, KernelOfAnotherDeviceIsRejected) {
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cpu;
  o.cpu_devices = 2;
  runtime rt(o);
  auto b = rt.device(0).load_binary(kernel_file("test_kernels.corabin")).wait();
  auto s = rt.device(1).make_stream();
  EXPECT_CORA_ERROR(s.launch(b.kernel("empty"), {}).wait(), errc::wrong_device);
}

TEST_P(launch_test, EmptyKernelHandleIsInvalid) {
  auto s = dev().make_stream();
  EXPECT_CORA_ERROR(s.launch(kernel(), {}).wait(), errc::invalid_handle);
}

}  // namespace
}  // namespace cora::test
