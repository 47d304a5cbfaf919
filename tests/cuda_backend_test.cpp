// The CUDA backend: driver loading and error codes (no GPU needed), image checks, and on a GPU
// the loader (cubin, fatbin, PTX; wrong architecture; JIT errors), parameter layouts, launch
// attributes, markers of every kind, and a faulting kernel.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <latch>
#include <numeric>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_device.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/cuda_image.hpp"
#include "backend/cuda/cuda_module.hpp"
#include "core/process_exit.hpp"
#include "core/state.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

namespace cuda = cora::backend::cuda;

std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

/// The error a pending fails with, and its message (empty code on success).
template <class P>
std::pair<std::error_code, std::string> outcome(P&& p) {
  try {
    p.wait();
    return {};
  } catch (const error& e) {
    return {e.code(), e.what()};
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// --- without a GPU --------------------------------------------------------------------------

TEST(cuda_driver, MissingLibraryIsReportedClearly) {
  cuda::driver_api api;
  std::string reason;
  EXPECT_FALSE(cuda::load_driver("libcuda-absent-for-cora-test.so.1", api, reason));
  EXPECT_TRUE(contains(reason, "libcuda-absent-for-cora-test.so.1")) << reason;
  EXPECT_TRUE(contains(reason, "NVIDIA driver")) << reason;
}

TEST(cuda_driver, StubLibraryIsNoDriver) {
  const std::filesystem::path stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!std::filesystem::exists(stub)) GTEST_SKIP() << "no CUDA toolkit stubs here";
  // The process's driver first: once the stub is loaded, dlopen("libcuda.so.1") would find
  // it by its soname. Loaded by path, the stub is a library of its own beside a real driver.
  std::string why;
  cuda::driver(why);
  cuda::driver_api api;
  std::string reason;
  EXPECT_FALSE(cuda::load_driver(stub.c_str(), api, reason));
  EXPECT_TRUE(contains(reason, "stub")) << reason;
}

TEST(cuda_driver, ResultsHaveACategoryAndCoraCodes) {
  const auto ec = cuda::make_cuda_error(CUDA_ERROR_INVALID_HANDLE);
  EXPECT_STREQ(ec.category().name(), "cuda");
  EXPECT_TRUE(contains(ec.message(), "CUDA_ERROR_INVALID_HANDLE")) << ec.message();
  EXPECT_TRUE(contains(cuda::make_cuda_error(static_cast<CUresult>(12345)).message(), "12345"));
  EXPECT_EQ(cuda::to_error_code(CUDA_SUCCESS), std::error_code());
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_ILLEGAL_ADDRESS), errc::kernel_fault);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_LAUNCH_FAILED), errc::kernel_fault);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_LAUNCH_TIMEOUT), errc::kernel_timeout);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_ECC_UNCORRECTABLE), errc::device_lost);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_OUT_OF_MEMORY), errc::out_of_memory);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_NO_BINARY_FOR_GPU), errc::invalid_binary);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_INVALID_PTX), errc::invalid_binary);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES), errc::invalid_launch_config);
  EXPECT_EQ(cuda::to_error_code(CUDA_ERROR_INVALID_HANDLE), ec);  // no cora meaning: kept
  EXPECT_TRUE(cuda::context_fatal(CUDA_ERROR_ILLEGAL_ADDRESS));
  EXPECT_TRUE(cuda::context_fatal(CUDA_ERROR_LAUNCH_FAILED));
  EXPECT_FALSE(cuda::context_fatal(CUDA_ERROR_OUT_OF_MEMORY));
  EXPECT_FALSE(cuda::context_fatal(CUDA_ERROR_NOT_READY));
}

TEST(cuda_images, CubinArchitectureIsRead) {
  EXPECT_EQ(cuda::cubin_arch(read_bytes(kernel_file("cuda_test_kernels.sm80.cubin"))), 80u);
  EXPECT_EQ(cuda::cubin_arch(read_bytes(kernel_file("cuda_test_kernels.sm90.cubin"))), 90u);
  EXPECT_EQ(cuda::cubin_arch(read_bytes(kernel_file("cuda_test_kernels.ptx"))), 0u);
}

TEST(cuda_images, ImagesWhoseHeadersPointOutsideAreRefused) {
  std::string why;
  auto cubin = read_bytes(kernel_file("cuda_test_kernels.sm90.cubin"));
  ASSERT_GT(cubin.size(), 256u);
  EXPECT_TRUE(cuda::image_in_bounds(cubin, cora::backend::image_kind::cuda_cubin, why)) << why;
  cubin.resize(cubin.size() / 2);
  EXPECT_FALSE(cuda::image_in_bounds(cubin, cora::backend::image_kind::cuda_cubin, why));
  EXPECT_FALSE(why.empty());

  const auto container = read_bytes(kernel_file("cuda_test_kernels.corabin"));
  // The fatbin inside the container starts at its magic.
  const std::byte magic[4] = {std::byte{0x50}, std::byte{0xed}, std::byte{0x55}, std::byte{0xba}};
  auto it = std::search(container.begin(), container.end(), std::begin(magic), std::end(magic));
  ASSERT_NE(it, container.end());
  std::vector<std::byte> fatbin(it, container.end());
  EXPECT_TRUE(cuda::image_in_bounds(fatbin, cora::backend::image_kind::cuda_fatbin, why)) << why;
  fatbin.resize(fatbin.size() - 100);
  EXPECT_FALSE(cuda::image_in_bounds(fatbin, cora::backend::image_kind::cuda_fatbin, why));
}

TEST(cuda_images, AlignmentIsGuessedFromOffsetAndSize) {
  EXPECT_EQ(cuda::guess_alignment(0, 8), 8u);
  EXPECT_EQ(cuda::guess_alignment(0, 1), 1u);
  EXPECT_EQ(cuda::guess_alignment(2, 2), 2u);
  EXPECT_EQ(cuda::guess_alignment(8, 16), 8u);
  EXPECT_EQ(cuda::guess_alignment(16, 16), 16u);
  EXPECT_EQ(cuda::guess_alignment(12, 4), 4u);
  EXPECT_EQ(cuda::guess_alignment(0, 12), 4u);
  EXPECT_EQ(cuda::guess_alignment(0, 64), 16u);
}

TEST(cuda_runtime, BackendStatusExplainsItself) {
  runtime_options o;
  o.use_environment = false;
  runtime rt(o);
  const auto backends = rt.backends();
  auto it = std::find_if(backends.begin(), backends.end(), [](const backend_status& b) { return b.name == "cuda"; });
  ASSERT_NE(it, backends.end());
  EXPECT_FALSE(it->detail.empty());
  if (it->available) {
    EXPECT_TRUE(contains(it->detail, "markers:")) << it->detail;
    EXPECT_EQ(rt.device(0).backend(), backend_kind::cuda);  // GPUs are listed first
  }
}

// --- on a GPU -------------------------------------------------------------------------------

class cuda_backend_test : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = shared_runtime(backend::cuda);
    if (!rt_) CORA_NO_DEVICE(backend::cuda, shared_runtime_failures()[backend::cuda]);
  }
  cora::device& dev() { return rt_->device(0); }
  cora::binary& cuda_kernels() {
    static cora::binary b;
    if (!b) b = dev().load_binary(kernel_file("cuda_test_kernels.corabin")).wait();
    return b;
  }
  cora::binary& test_kernels() {
    static cora::binary b;
    if (!b) b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
    return b;
  }
  /// Fills n words with `value` through `k` (fill_u32) and checks them.
  void expect_fill_works(const cora::kernel& k, std::uint32_t value) {
    auto s = dev().make_stream();
    const std::size_t n = 4096;
    auto d = dev().alloc<std::uint32_t>(n);
    auto h = dev().alloc_host<std::uint32_t>(n);
    (void)s.launch(k, {.grid = 8, .block = 128}, d.data(), value, std::uint64_t{n});
    s.copy(h, d).wait();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], value) << i;
  }
  runtime* rt_ = nullptr;
};

TEST_F(cuda_backend_test, DeviceReportsItsProperties) {
  const auto& p = dev().properties();
  EXPECT_EQ(p.backend, backend_kind::cuda);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.compute_units, 0u);
  EXPECT_GT(p.total_memory, std::size_t{1} << 30);
  EXPECT_GE(p.compute_major, 3);
  EXPECT_GE(p.max_threads_per_block, 512u);
  EXPECT_GE(p.max_grid.x, 65535u);
  EXPECT_GE(p.max_block.x, 512u);
  EXPECT_GT(p.max_shared_bytes, 0u);
  EXPECT_TRUE(contains(p.driver, "CUDA")) << p.driver;
  EXPECT_FALSE(p.pci_bus_id.empty());
  EXPECT_EQ(p.uuid.rfind("GPU-", 0), 0u) << p.uuid;
}

TEST_F(cuda_backend_test, CubinForAnotherArchitectureIsInvalidBinary) {
  const auto& p = dev().properties();
  if (p.compute_major == 8 && p.compute_minor >= 0) GTEST_SKIP() << "the device runs sm_80 code";
  try {
    dev().load_binary(kernel_file("cuda_test_kernels.sm80.cubin")).wait();
    ADD_FAILURE() << "an sm_80 cubin loaded on compute capability " << p.compute_major << "." << p.compute_minor;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_binary) << e.what();
    EXPECT_TRUE(contains(e.what(), "sm_80")) << e.what();
    EXPECT_TRUE(contains(e.what(), "CUDA_ERROR_")) << e.what();
  }
}

TEST_F(cuda_backend_test, PtxSyntaxErrorReportsTheJitLog) {
  try {
    dev().load_binary(kernel_file("bad_syntax.ptx")).wait();
    ADD_FAILURE() << "broken PTX loaded";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_binary) << e.what();
    EXPECT_TRUE(contains(e.what(), "JIT log")) << e.what();
    EXPECT_TRUE(contains(e.what(), "this_is_not_an_instruction") || contains(e.what(), "line")) << e.what();
  }
}

TEST_F(cuda_backend_test, PtxFromMemoryIsCompiledAndRuns) {
  const auto ptx = read_bytes(kernel_file("cuda_test_kernels.ptx"));
  auto bin = dev().load_binary(std::span<const std::byte>(ptx)).wait();
  EXPECT_EQ(bin.format(), "cuda-ptx");
  expect_fill_works(bin.kernel("fill_u32"), 0x5eed0001u);
}

TEST_F(cuda_backend_test, CubinAndFatbinFromFilesRun) {
  const auto& p = dev().properties();
  if (p.compute_major == 9 && p.compute_minor == 0) {
    auto cubin = dev().load_binary(kernel_file("cuda_test_kernels.sm90.cubin")).wait();
    EXPECT_EQ(cubin.format(), "cuda-cubin");
    expect_fill_works(cubin.kernel("fill_u32"), 0x5eed0002u);
  }
  EXPECT_EQ(cuda_kernels().format(), "corabin/cuda-fatbin");
  expect_fill_works(cuda_kernels().kernel("fill_u32"), 0x5eed0003u);
  EXPECT_EQ(test_kernels().kernel("scale_7").entry_key(), 7u);
  EXPECT_EQ(test_kernels().kernel_by_entry(7).name(), "scale_7");
}

// Memory from other allocators (cuMemAlloc, cuMemAllocManaged called directly) is accepted by
// launches and copies; pageable host memory stays refused as a kernel's device pointer.
TEST_F(cuda_backend_test, ForeignDeviceAndManagedMemoryAreAccepted) {
  std::string reason;
  const auto* api = cuda::driver(reason);
  ASSERT_NE(api, nullptr) << reason;
  auto* ctx = static_cast<CUcontext>(dev().native_handle());
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(api->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  const std::size_t n = 4096;
  CUdeviceptr plain = 0, managed = 0;
  ASSERT_EQ(api->cuMemAlloc(&plain, n * 4), CUDA_SUCCESS);
  ASSERT_EQ(api->cuMemAllocManaged(&managed, n * 4, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  auto s = dev().make_stream();
  auto h = dev().alloc_host<std::uint32_t>(n);
  auto fill = cuda_kernels().kernel("fill_u32");
  std::uint32_t value = 0x0f0f0001u;
  for (CUdeviceptr p : {plain, managed}) {
    auto* ptr = reinterpret_cast<std::uint32_t*>(p);
    (void)s.launch(fill, {.grid = 8, .block = 128}, ptr, value, std::uint64_t{n});
    s.copy(h.data(), ptr, n * 4).wait();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], value) << i;
    // The driver reports a cuMemAlloc allocation's bounds: a range past its end is refused.
    if (p == plain) {
      try {
        s.copy(h.data(), ptr + 1, n * 4).wait();
        ADD_FAILURE() << "a copy past the end of a foreign allocation was accepted";
      } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::out_of_range) << e.what();
      }
    }
    ++value;
  }
  std::vector<std::uint32_t> pageable(n);
  try {
    s.launch(fill, {.grid = 1, .block = 32}, pageable.data(), value, std::uint64_t{n}).wait();
    ADD_FAILURE() << "pageable host memory was accepted as a device pointer";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_pointer) << e.what();
  }
  s.synchronize().wait();
  EXPECT_EQ(api->cuMemFree(plain), CUDA_SUCCESS);
  EXPECT_EQ(api->cuMemFree(managed), CUDA_SUCCESS);
}

// An adopted stream orders cora's work with the foreign work enqueued after it on the same
// native stream, and is never destroyed by cora.
TEST_F(cuda_backend_test, AdoptedStreamOrdersCoraWorkWithForeignWork) {
  std::string reason;
  const auto* api = cuda::driver(reason);
  ASSERT_NE(api, nullptr) << reason;
  ASSERT_EQ(api->cuCtxSetCurrent(static_cast<CUcontext>(dev().native_handle())), CUDA_SUCCESS);
  CUstream native = nullptr;
  ASSERT_EQ(api->cuStreamCreateWithPriority(&native, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  const std::size_t n = 1 << 20;
  auto d = dev().alloc<std::uint32_t>(n);
  std::vector<std::uint32_t> out(n);
  {
    auto s = dev().adopt_stream(native);
    EXPECT_EQ(s.native_handle(), native);
    // A slow kernel first, so the foreign copy would see stale data without the ordering.
    auto flag = dev().alloc<std::uint32_t>(1);
    (void)s.launch(test_kernels().kernel("slow"), {}, std::uint64_t{20000}, flag);
    (void)s.launch(cuda_kernels().kernel("fill_u32"), {.grid = 64, .block = 256}, d, 0xabcd0123u, std::uint64_t{n});
    ASSERT_EQ(api->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(out.data()),
                                 reinterpret_cast<CUdeviceptr>(d.data()), n * 4, native),
              CUDA_SUCCESS);
    ASSERT_EQ(api->cuStreamSynchronize(native), CUDA_SUCCESS);
  }  // the cora stream goes; the native one stays
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(out[i], 0xabcd0123u) << i;
  EXPECT_EQ(api->cuStreamQuery(native), CUDA_SUCCESS);
  EXPECT_EQ(api->cuStreamDestroy(native), CUDA_SUCCESS);
}

TEST_F(cuda_backend_test, ParametersReachTheKernelWhateverCudasLayout) {
  auto s = dev().make_stream();
  // CUDA puts (double*, int32, int32, double) at 0, 8, 12, 16; cora's block at 0, 8, 16, 24.
  auto sum = cuda_kernels().kernel("sum_args");
  ASSERT_EQ(sum.params().size(), 4u);
  EXPECT_EQ(sum.params()[2].offset, 16u);
  auto out = dev().alloc<double>(1);
  auto h = dev().alloc_host<double>(1);
  (void)s.launch(sum, {}, out.data(), std::int32_t{2}, std::int32_t{40}, 0.5);
  s.copy(h, out).wait();
  EXPECT_EQ(h[0], 42.5);

  // The same through a canonical host block, as CANN callers build it.
  std::vector<std::byte> block(sum.args_size());
  double* out_ptr = out.data();
  const std::int32_t a = 7, b = 8;
  const double c = 0.25;
  std::memcpy(block.data() + sum.params()[0].offset, &out_ptr, sizeof(out_ptr));
  std::memcpy(block.data() + sum.params()[1].offset, &a, sizeof(a));
  std::memcpy(block.data() + sum.params()[2].offset, &b, sizeof(b));
  std::memcpy(block.data() + sum.params()[3].offset, &c, sizeof(c));
  (void)s.launch_host_block(sum, {}, block);
  s.copy(h, out).wait();
  EXPECT_EQ(h[0], 15.25);

  // Mixed sizes and alignments; the container's metadata fixes the alignment of the struct.
  auto mixed = test_kernels().kernel("mixed_args");
  ASSERT_EQ(mixed.params().size(), 5u);
  EXPECT_EQ(mixed.params()[2].align, 8u);
  auto vals = dev().alloc<double>(5);
  auto hv = dev().alloc_host<double>(5);
  struct pair16 {
    double a, b;
  };
  (void)s.launch(mixed, {}, std::uint8_t{3}, std::uint16_t{500}, pair16{1.5, -2.5}, std::uint32_t{70000}, vals.data());
  s.copy(hv, vals).wait();
  EXPECT_EQ(hv[0], 3.0);
  EXPECT_EQ(hv[1], 500.0);
  EXPECT_EQ(hv[2], 1.5);
  EXPECT_EQ(hv[3], -2.5);
  EXPECT_EQ(hv[4], 70000.0);
}

TEST_F(cuda_backend_test, DeviceResidentArgumentBlocksAreRefused) {
  auto s = dev().make_stream();
  auto k = cuda_kernels().kernel("fill_u32");
  auto block = dev().alloc<std::byte>(k.args_size());
  auto [ec, what] = outcome(s.launch_device_block(k, {}, block.data(), k.args_size()));
  EXPECT_EQ(ec, errc::not_supported) << what;
  EXPECT_TRUE(contains(what, "host")) << what;
}

TEST_F(cuda_backend_test, LaunchAttributesAreHonouredOrRefused) {
  auto s = dev().make_stream();
  auto fill = cuda_kernels().kernel("fill_u32");
  auto d = dev().alloc<std::uint32_t>(1024);
  const std::uint64_t n = 1024;
  EXPECT_EQ(outcome(s.launch(fill, {.grid = 2, .block = 256, .cooperative = true}, d.data(), 1u, n)).first,
            std::error_code());
  EXPECT_EQ(outcome(s.launch(fill, {.grid = 4, .block = 64, .schedule = schedule_mode::batch}, d.data(), 1u, n)).first,
            std::error_code());
  if (dev().properties().compute_major >= 9) {
    EXPECT_EQ(outcome(s.launch(fill, {.grid = 4, .block = 32, .cluster = dim3(2)}, d.data(), 2u, n)).first,
              std::error_code());
    EXPECT_EQ(outcome(s.launch(fill, {.grid = 3, .block = 32, .cluster = dim3(2)}, d.data(), 2u, n)).first,
              errc::invalid_launch_config);
  }
  EXPECT_EQ(outcome(s.launch(fill, {.grid = 1, .priority = 0}, d.data(), 3u, n)).first, std::error_code());
  auto [pec, pwhat] = outcome(s.launch(fill, {.grid = 1, .priority = 100}, d.data(), 3u, n));
  EXPECT_EQ(pec, errc::invalid_launch_config) << pwhat;
  EXPECT_TRUE(contains(pwhat, "priority")) << pwhat;
  auto [tec, twhat] = outcome(s.launch(fill, {.grid = 1, .timeout = std::chrono::microseconds(10)}, d.data(), 3u, n));
  EXPECT_EQ(tec, errc::not_supported) << twhat;
  EXPECT_EQ(outcome(s.launch(fill, {.grid = 1, .block = 4096}, d.data(), 3u, n)).first, errc::invalid_launch_config);

  // Dynamic shared memory past the default 48 KiB opts in; past the device's limit fails.
  auto sum = cuda_kernels().kernel("shared_sum");
  const std::uint64_t words = 16 * 1024;  // 64 KiB
  auto in = dev().alloc<std::uint32_t>(words);
  auto h = dev().alloc_host<std::uint32_t>(words);
  std::iota(h.begin(), h.end(), 1u);
  auto out = dev().alloc<std::uint64_t>(1);
  auto hout = dev().alloc_host<std::uint64_t>(1);
  (void)s.copy(in, h);
  const auto shared = static_cast<std::uint32_t>(words * 4);
  ASSERT_EQ(outcome(s.launch(sum, {.grid = 1, .block = 256, .shared_bytes = shared}, in.data(), words, out.data())).first,
            std::error_code());
  s.copy(hout, out).wait();
  EXPECT_EQ(hout[0], words * (words + 1) / 2);
  auto [sec, swhat] = outcome(s.launch(sum, {.grid = 1, .block = 256, .shared_bytes = 1u << 30}, in.data(), words, out.data()));
  EXPECT_EQ(sec, errc::invalid_launch_config) << swhat;
}

TEST_F(cuda_backend_test, HostFunctionsAndEventsKeepStreamOrder) {
  auto s = dev().make_stream();
  auto slow = test_kernels().kernel("slow");
  auto flags = dev().alloc<std::uint32_t>(1);
  auto start = dev().make_event(), end = dev().make_event();
  std::atomic<int> ran{0};
  (void)s.record(start);
  (void)s.launch(slow, {}, std::uint64_t{2000}, flags.data());
  (void)s.record(end);
  (void)s.host_func([&] { ran = 1; });
  auto other = dev().make_stream();
  (void)other.wait(end);
  auto h = dev().alloc_host<std::uint32_t>(1);
  other.copy(h, flags).wait();
  EXPECT_EQ(h[0], 1u);  // the copy waited for the kernel on the other stream
  s.synchronize().wait();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(end.ready());
  EXPECT_GE(event::elapsed(start, end).count(), 1.0);
  // A throwing host function fails its op until a synchronize reports it; then the stream
  // goes on.
  auto [ec, what] = outcome(s.host_func([] { throw std::runtime_error("from the host function"); }));
  EXPECT_TRUE(ec) << what;
  EXPECT_TRUE(contains(what, "from the host function")) << what;
  EXPECT_TRUE(outcome(s.synchronize()).first);
  EXPECT_EQ(outcome(s.synchronize()).first, std::error_code());
  expect_fill_works(cuda_kernels().kernel("fill_u32"), 9u);
}

// Runs `n` launch-and-await rounds through a coroutine and a blocking wait on a fresh runtime.
void exercise_runtime(completion_policy policy, const char* marker_mode) {
  if (marker_mode)
    ::setenv("CORA_CUDA_MARKER", marker_mode, 1);
  else
    ::unsetenv("CORA_CUDA_MARKER");
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cuda;
  o.completion = policy;
  runtime rt(o);
  ::unsetenv("CORA_CUDA_MARKER");
  const auto backends = rt.backends();
  if (marker_mode) {
    EXPECT_TRUE(contains(backends[0].detail, std::string("markers: ") + marker_mode)) << backends[0].detail;
  }
  auto& dev = rt.device(0);
  auto bin = dev.load_binary(kernel_file("cuda_test_kernels.corabin")).wait();
  auto fill = bin.kernel("fill_u32");
  auto s = dev.make_stream();
  const std::size_t n = 256;
  auto d = dev.alloc<std::uint32_t>(n);
  auto h = dev.alloc_host<std::uint32_t>(n);
  with_watchdog(std::chrono::seconds(60), [&] {
    cora::sync_wait([&]() -> task<void> {
      for (std::uint32_t i = 1; i <= 100; ++i) {
        co_await s.launch(fill, {.grid = 1, .block = 256}, d.data(), i, std::uint64_t{n});
        co_await s.copy(h, d);
        if (h[0] != i || h[n - 1] != i) throw std::runtime_error("wrong data in round " + std::to_string(i));
      }
    }());
    for (std::uint32_t i = 0; i < 20; ++i) s.launch(fill, {.grid = 1, .block = 256}, d.data(), i, std::uint64_t{n}).wait();
    dev.synchronize().wait();
  });
  EXPECT_GT(dev.state()->backend->markers_recorded(), 0u);
}

TEST_F(cuda_backend_test, EventMarkersCompleteWaits) { exercise_runtime(completion_policy::hybrid, "event"); }
TEST_F(cuda_backend_test, CounterMarkersCompleteWaits) { exercise_runtime(completion_policy::spin, "counter"); }
TEST_F(cuda_backend_test, CallbackPolicyCompletesWaits) { exercise_runtime(completion_policy::callback, nullptr); }
TEST_F(cuda_backend_test, BlockingPolicyCompletesWaits) { exercise_runtime(completion_policy::blocking, "event"); }
TEST_F(cuda_backend_test, AutoMarkersCompleteWaits) { exercise_runtime(completion_policy::hybrid, "auto"); }

// The default markers (auto): one thread awaiting its launches records counters; four threads
// doing it at once record events. A stream that had counters goes on with events.
TEST_F(cuda_backend_test, AutoMarkersAreCountersForOneThreadAndEventsForSeveral) {
  ::unsetenv("CORA_CUDA_MARKER");
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cuda;
  o.completion = completion_policy::spin;
  runtime rt(o);
  EXPECT_TRUE(contains(rt.backends()[0].detail, "markers: auto")) << rt.backends()[0].detail;
  auto& dev = rt.device(0);
  const auto& gpu = dynamic_cast<const cora::backend::cuda::cuda_device&>(*dev.state()->backend);
  auto bin = dev.load_binary(kernel_file("cuda_test_kernels.corabin")).wait();
  auto fill = bin.kernel("fill_u32");
  constexpr int rounds = 2000;
  constexpr std::uint32_t n = 64;
  auto first = dev.make_stream();
  // Awaits `rounds` launches one by one on `s`, then checks what the last one wrote.
  auto run = [&](cora::stream& s, std::uint32_t id) {
    auto d = dev.alloc<std::uint32_t>(n);
    auto h = dev.alloc_host<std::uint32_t>(n);
    for (int i = 0; i < rounds; ++i) s.launch(fill, {.grid = 1, .block = n}, d.data(), id + i, std::uint64_t{n}).wait();
    s.copy(h, d).wait();
    EXPECT_EQ(h[0], id + rounds - 1);
    EXPECT_EQ(h[n - 1], id + rounds - 1);
  };
  auto counts = [&] { return std::pair{dev.state()->backend->markers_recorded(), gpu.event_markers_recorded()}; };

  // On one thread: a warm-up, then a pause longer than the two windows the count looks back
  // on, so that markers other threads recorded before (the load's) are forgotten; then counted.
  std::pair<std::uint64_t, std::uint64_t> before, alone;
  with_watchdog(std::chrono::seconds(60), [&] {
    run(first, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    before = counts();
    run(first, 1);
    alone = counts();
  });
  const std::uint64_t alone_markers = alone.first - before.first;
  const std::uint64_t alone_events = alone.second - before.second;
  EXPECT_GE(alone_markers, static_cast<std::uint64_t>(rounds));
  EXPECT_LE(alone_events * 5, alone_markers) << alone_events << " of " << alone_markers << " were events";

  std::latch start(4);
  with_watchdog(std::chrono::seconds(60), [&] {
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        auto own = t == 0 ? cora::stream() : dev.make_stream();
        start.arrive_and_wait();
        run(t == 0 ? first : own, 100000 * (t + 1));
      });
    for (auto& th : threads) th.join();
  });
  const auto together = counts();
  const std::uint64_t together_markers = together.first - alone.first;
  const std::uint64_t together_events = together.second - alone.second;
  EXPECT_GE(together_markers, 4u * rounds);
  EXPECT_GE(together_events * 4, together_markers * 3) << together_events << " of " << together_markers << " were events";
  first.synchronize().wait();
}

// Event markers under the hybrid policy: a poll group's pass does not ask the driver about the
// oldest op before it is due (shortly before its learnt end, at most 1 ms after it began); each
// query is a driver call that the driver serializes with every thread's submissions. Asked
// directly, the stream still answers at once.
TEST_F(cuda_backend_test, HybridPollsAskAboutAnEventMarkerOnlyOnceItsOpIsDue) {
  ::setenv("CORA_CUDA_MARKER", "event", 1);
  runtime_options o;
  o.use_environment = false;
  o.backend = backend_selection::cuda;
  o.completion = completion_policy::hybrid;
  runtime rt(o);
  ::unsetenv("CORA_CUDA_MARKER");
  auto& dev = rt.device(0);
  auto s = dev.make_stream();
  detail::stream_state* st = s.state();
  using clk = std::chrono::steady_clock;
  std::vector<detail::wait_node*> nodes;
  // Host functions of 20 ms: the stream learns how long its ops take.
  auto op = [&] { return s.host_func([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }); };
  with_watchdog(std::chrono::seconds(60), [&] {
    for (int i = 0; i < 3; ++i) {
      auto p = op();
      const std::uint64_t at = st->last_position();
      st->mark(at);
      while (st->completed_position() < at) {
        st->poll_when_due(nodes, clk::now());
        std::this_thread::yield();
      }
    }
    auto p = op();
    const std::uint64_t at = st->last_position();
    st->mark(at);
    const auto due = st->query_due();
    ASSERT_GT(due, clk::now()) << "the op is due as soon as it began";
    const std::uint64_t before = st->locked_polls();
    int early = 0;
    for (; early < 1000 && clk::now() + std::chrono::microseconds(200) < due; ++early)
      EXPECT_FALSE(st->poll_when_due(nodes, clk::now()));
    EXPECT_GT(early, 0);
    EXPECT_EQ(st->locked_polls() - before, 0u) << "of " << early << " polls before the op was due";
    EXPECT_FALSE(st->poll(nodes));  // asked directly: the op is still running
    EXPECT_EQ(st->locked_polls() - before, 1u);
    while (st->completed_position() < at) {
      st->poll_when_due(nodes, clk::now());
      std::this_thread::yield();
    }
    EXPECT_GE(clk::now(), due);
    EXPECT_TRUE(nodes.empty());
    p.wait();
  });
}

// --- a faulting kernel (in a child process: the fault ruins the process's CUDA context) ------

[[noreturn]] void fault_scenario(const char* marker_mode) {
  ::setenv("CORA_CUDA_MARKER", marker_mode, 1);
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    }
  };
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(90));
    std::fprintf(stderr, "watchdog: the fault scenario hangs\n");
    std::_Exit(3);
  }).detach();
  {
    runtime_options o;
    o.use_environment = false;
    runtime rt(o);
    cora::device& gpu = rt.device(0);
    cora::device& cpu = rt.device(rt.device_count() - 1);
    check(gpu.backend() == backend_kind::cuda && cpu.backend() == backend_kind::cpu, "a GPU and the CPU device");
    auto bin = gpu.load_binary(kernel_file("cuda_test_kernels.corabin")).wait();
    auto oob = bin.kernel("oob_write");
    auto fill = bin.kernel("fill_u32");
    auto s = gpu.make_stream();
    auto s2 = gpu.make_stream();
    auto buf = gpu.alloc<std::uint32_t>(16);
    auto host = gpu.alloc_host<std::uint32_t>(16);
    // An index that takes the write from the buffer to address 8, which is never mapped.
    const std::uint64_t index = (0 - reinterpret_cast<std::uintptr_t>(buf.data()) + 8) / 4;
    auto p_fault = s.launch(oob, {}, buf.data(), index);
    auto p_copy = s.copy(host, buf);
    auto p_fill = s.launch(fill, {.grid = 1, .block = 16}, buf.data(), 7u, std::uint64_t{16});
    // A coroutine waiting on the same stream, on its own thread.
    std::pair<std::error_code, std::string> coroutine;
    std::thread waiter([&, p = s.fill(buf, 0)]() mutable {
      try {
        cora::sync_wait([](pending<void> op) -> task<void> { co_await std::move(op); }(std::move(p)));
      } catch (const error& e) {
        coroutine = {e.code(), e.what()};
      }
    });
    const auto fault = outcome(p_fault);
    waiter.join();
    const auto copy = outcome(p_copy);
    const auto filled = outcome(p_fill);
    std::fprintf(stderr, "fault: %s\n", fault.second.c_str());
    check(fault.first == errc::kernel_fault, "the faulting launch fails with kernel_fault");
    check(contains(fault.second, "CUDA_ERROR_ILLEGAL_ADDRESS"), "CUDA's error name in the message");
    using result = std::pair<std::error_code, std::string>;
    for (const result* r : {&copy, &filled, static_cast<const result*>(&coroutine)}) {
      check(static_cast<bool>(r->first), "every waiter behind the fault fails");
      check(contains(r->second, "CUDA_ERROR_ILLEGAL_ADDRESS"), "with CUDA's message: " + r->second);
    }
    // Other streams of the device fail too, and new work fails at once with device_lost.
    const auto other = outcome(s2.launch(fill, {.grid = 1}, buf.data(), 1u, std::uint64_t{1}));
    check(static_cast<bool>(other.first), "another stream of the lost device fails: " + other.second);
    const auto later = outcome(s.launch(fill, {.grid = 1}, buf.data(), 1u, std::uint64_t{1}));
    check(later.first == errc::device_lost, "a new launch fails with device_lost: " + later.second);
    check(static_cast<bool>(outcome(gpu.synchronize()).first), "device synchronize reports the fault");
    try {
      gpu.make_stream();
      check(false, "a new stream on the lost device");
    } catch (const error& e) {
      check(e.code() == errc::device_lost, std::string("new stream: ") + e.what());
    }
    // The CPU device is unaffected.
    auto cs = cpu.make_stream();
    auto a = cpu.alloc<std::uint32_t>(4);
    auto ha = cpu.alloc_host<std::uint32_t>(4);
    std::iota(ha.begin(), ha.end(), 1u);
    check(!outcome(cs.copy(a, ha)).first, "a copy to the CPU device");
    std::fill(ha.begin(), ha.end(), 0u);
    check(!outcome(cs.copy(ha, a)).first && ha[3] == 4u, "the CPU device still works");
  }  // the runtime and everything it made go away without hanging
  std::fprintf(stderr, "fault scenario: %d failures\n", failures);
  std::fflush(stderr);
  std::_Exit(failures ? 1 : 0);
}

TEST(cuda_fault, OutOfBoundsWriteFailsEveryWaiterAndNothingHangs) {
  if (!shared_runtime(backend::cuda)) CORA_NO_DEVICE(backend::cuda, shared_runtime_failures()[backend::cuda]);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_scenario("counter"), ::testing::ExitedWithCode(0), "fault: .*CUDA_ERROR_ILLEGAL_ADDRESS");
}

TEST(cuda_fault, OutOfBoundsWriteFailsEveryWaiterWithEventMarkers) {
  if (!shared_runtime(backend::cuda)) CORA_NO_DEVICE(backend::cuda, shared_runtime_failures()[backend::cuda]);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_scenario("event"), ::testing::ExitedWithCode(0), "fault: .*CUDA_ERROR_ILLEGAL_ADDRESS");
}

TEST(cuda_fault, OutOfBoundsWriteFailsEveryWaiterWithAutoMarkers) {
  if (!shared_runtime(backend::cuda)) CORA_NO_DEVICE(backend::cuda, shared_runtime_failures()[backend::cuda]);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_scenario("auto"), ::testing::ExitedWithCode(0), "fault: .*CUDA_ERROR_ILLEGAL_ADDRESS");
}

// --- process exit -----------------------------------------------------------------------------

// What happens to a runtime that outlives main (a static, or one that a static's destructor
// drops): cora's exit handler runs first, and after it no cora call reaches the driver, which
// the driver's and compute-sanitizer's own exit handlers are tearing down. Calling the handler's
// body directly stands for the exit here; under compute-sanitizer, scripts/gpu-reliability's
// suites (whose shared runtimes are statics) check the real exit.
[[noreturn]] void exit_scenario() {
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    }
  };
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(90));
    std::fprintf(stderr, "watchdog: the exit scenario hangs\n");
    std::_Exit(3);
  }).detach();
  {
    runtime_options o;
    o.use_environment = false;
    o.backend = backend_selection::cuda;
    auto rt = std::make_unique<runtime>(o);
    cora::device& gpu = rt->device(0);
    auto bin = gpu.load_binary(kernel_file("cuda_test_kernels.corabin")).wait();
    auto fill = bin.kernel("fill_u32");
    auto s = gpu.make_stream();
    auto buf = gpu.alloc<std::uint32_t>(16);
    auto host = gpu.alloc_host<std::uint32_t>(16);
    check(!outcome(s.launch(fill, {.grid = 1, .block = 16}, buf.data(), 7u, std::uint64_t{16})).first,
          "a launch before the exit");
    auto dropped = gpu.make_stream();  // its release is left to cora's threads
    dropped = {};
    check(cora::detail::begin_process_exit(), "cora's threads finished their driver calls");
    std::string reason;
    const cuda::driver_api* api = cuda::driver(reason);
    CUcontext current = nullptr;
    check(api && api->cuCtxGetCurrent(&current) == CUDA_ERROR_DEINITIALIZED,
          "no entry point calls the driver once the exit began");
    // What a static's destructor does then: new work fails (at once or when awaited), and
    // nothing waits for ever.
    std::pair<std::error_code, std::string> copy;
    try {
      copy = outcome(s.copy(host, buf));
    } catch (const error& e) {
      copy = {e.code(), e.what()};
    }
    check(static_cast<bool>(copy.first), "a copy after the exit began fails");
    std::fprintf(stderr, "copy after the exit began: %s\n", copy.second.c_str());
    try {
      (void)outcome(gpu.synchronize());  // whatever it says, it returns
    } catch (const error&) {
    }
  }  // the runtime, its binary, stream and buffers go away without a driver call or a hang
  std::fprintf(stderr, "exit scenario: %d failures\n", failures);
  std::fflush(stderr);
  std::_Exit(failures ? 1 : 0);
}

TEST(cuda_exit, OnceTheExitBeganNoCallReachesTheDriverAndNothingHangs) {
  if (!shared_runtime(backend::cuda)) CORA_NO_DEVICE(backend::cuda, shared_runtime_failures()[backend::cuda]);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exit_scenario(), ::testing::ExitedWithCode(0), "exit scenario: 0 failures");
}

}  // namespace
}  // namespace cora::test
