#include "cora/kernel_args.hpp"

#include <vector>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

class kernel_args_test : public device_test {};
CORA_DEVICE_SUITE(kernel_args_test);

TEST_P(kernel_args_test, PlaceholdersDeliverTheirPayloadToTheKernel) {
  // The seed's placeholder mode: tiling data arrives through two placeholder pointers.
  auto b = dev().load_binary(kernel_file("add_custom_tiling.corabin")).wait();
  auto k = b.kernel("add_custom");
  const std::size_t n = 8 * 2048;
  auto x = dev().alloc<half>(n), y = dev().alloc<half>(n), z = dev().alloc<half>(n);
  std::vector<half> hx(n), hy(n), hz(n);
  for (std::size_t i = 0; i < n; ++i) {
    hx[i] = half(static_cast<float>(i % 100));
    hy[i] = half(1.0f);
  }
  auto s = dev().make_stream();
  (void)s.copy(x.data(), hx.data(), n * 2);
  (void)s.copy(y.data(), hy.data(), n * 2);
  kernel_args args(k);
  args.append(x.data());
  args.append(y.data());
  args.append(z.data());
  auto len = args.append_placeholder();
  auto num = args.append_placeholder();
  *static_cast<std::int32_t*>(args.placeholder_buffer(len, 4)) = static_cast<std::int32_t>(n);
  *static_cast<std::int32_t*>(args.placeholder_buffer(num, 4)) = 8;
  args.finalize();
  (void)s.launch(k, {.grid = 8}, args);
  s.copy(hz.data(), z.data(), n * 2).wait();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(float(hz[i]), float(hx[i]) + 1.0f) << i;
}

TEST_P(kernel_args_test, UpdateAfterFinalizeNeedsFinalizeAgain) {
  auto k = kernels().kernel("scale_7");
  auto s = dev().make_stream();
  auto x = dev().alloc<float>(4);
  float ones[4] = {1, 1, 1, 1};
  (void)s.copy(x.data(), ones, sizeof(ones));
  kernel_args args(k);
  args.append(x.data());
  const float two = 2.0f;
  auto factor = args.append(two);
  args.append(std::uint64_t{4});
  args.finalize();
  (void)s.launch(k, {}, args);
  const float three = 3.0f;
  args.update(factor, &three, sizeof(three));
  EXPECT_FALSE(args.finalized());
  EXPECT_CORA_ERROR(s.launch(k, {}, args).wait(), errc::args_not_finalized);
  args.finalize();
  (void)s.launch(k, {}, args);
  float h[4];
  s.copy(h, x.data(), sizeof(h)).wait();
  EXPECT_EQ(h[0], 6.0f);
}

TEST_P(kernel_args_test, LaunchBeforeFinalizeIsRejected) {
  auto k = kernels().kernel("empty");
  kernel_args args(k);
  auto s = dev().make_stream();
  EXPECT_CORA_ERROR(s.launch(k, {}, args).wait(), errc::args_not_finalized);
}

TEST_P(kernel_args_test, AppendAfterFetchingABufferIsPlaceholderMisuse) {
  auto b = dev().load_binary(kernel_file("add_custom_tiling.corabin")).wait();
  kernel_args args(b.kernel("add_custom"));
  int p = 0;
  void* ptr = &p;
  args.append(&ptr, sizeof(ptr));
  args.append(&ptr, sizeof(ptr));
  args.append(&ptr, sizeof(ptr));
  auto ph = args.append_placeholder();
  args.placeholder_buffer(ph, 4);
  EXPECT_CORA_ERROR(args.append_placeholder(), errc::placeholder_misuse);
  EXPECT_CORA_ERROR(args.append(&ptr, sizeof(ptr)), errc::placeholder_misuse);
}

TEST_P(kernel_args_test, BufferOfANormalParameterIsPlaceholderMisuse) {
  kernel_args args(kernels().kernel("scale_7"));
  void* p = nullptr;
  auto h = args.append(&p, sizeof(p));
  EXPECT_CORA_ERROR(args.placeholder_buffer(h, 8), errc::placeholder_misuse);
}

TEST_P(kernel_args_test, UpdateOfAPlaceholderIsMisuse) {
  auto b = dev().load_binary(kernel_file("add_custom_tiling.corabin")).wait();
  kernel_args args(b.kernel("add_custom"));
  void* p = nullptr;
  for (int i = 0; i < 3; ++i) args.append(&p, sizeof(p));
  auto ph = args.append_placeholder();
  EXPECT_CORA_ERROR(args.update(ph, &p, sizeof(p)), errc::placeholder_misuse);
}

TEST_P(kernel_args_test, PlaceholderWithoutBufferFailsFinalize) {
  auto b = dev().load_binary(kernel_file("add_custom_tiling.corabin")).wait();
  kernel_args args(b.kernel("add_custom"));
  void* p = nullptr;
  for (int i = 0; i < 3; ++i) args.append(&p, sizeof(p));
  args.append_placeholder();
  auto num = args.append_placeholder();
  args.placeholder_buffer(num, 4);
  EXPECT_CORA_ERROR(args.finalize(), errc::placeholder_misuse);
}

TEST_P(kernel_args_test, WrongSizeAndTooManyParametersAreMismatches) {
  kernel_args args(kernels().kernel("scale_7"));
  const std::uint32_t small = 1;
  EXPECT_CORA_ERROR(args.append(small), errc::argument_mismatch);  // pointer expected
  void* p = nullptr;
  args.append(p);
  args.append(1.0f);
  args.append(std::uint64_t{1});
  EXPECT_CORA_ERROR(args.append(std::uint64_t{1}), errc::argument_mismatch);
  args.finalize();
  EXPECT_CORA_ERROR(args.append(std::uint64_t{1}), errc::args_finalized);
}

TEST_P(kernel_args_test, MissingParametersFailFinalize) {
  kernel_args args(kernels().kernel("scale_7"));
  void* p = nullptr;
  args.append(p);
  EXPECT_CORA_ERROR(args.finalize(), errc::argument_mismatch);
}

TEST_P(kernel_args_test, AtMost128Parameters) {
  auto k = kernels().kernel("many_params");
  ASSERT_EQ(k.params().size(), 128u);
  kernel_args args(k);
  std::uint64_t expected = 0;
  for (int i = 0; i < 127; ++i) {
    args.append(static_cast<std::uint8_t>(i));
    expected += static_cast<std::uint64_t>(i);
  }
  auto out = dev().alloc<std::uint32_t>(1);
  args.append(out.data());
  EXPECT_CORA_ERROR(args.append(std::uint8_t{0}), errc::too_many_arguments);
  args.finalize();
  auto s = dev().make_stream();
  (void)s.launch(k, {}, args);
  std::uint32_t h = 0;
  s.copy(&h, out.data(), 4).wait();
  EXPECT_EQ(h, expected);
}

TEST_P(kernel_args_test, ArgumentListForAnotherKernelIsAMismatch) {
  kernel_args args(kernels().kernel("empty"));
  args.finalize();
  auto s = dev().make_stream();
  EXPECT_CORA_ERROR(s.launch(kernels().kernel("add_f32"), {}, args).wait(), errc::argument_mismatch);
}

TEST_P(kernel_args_test, NullOrEmptyAppendIsInvalid) {
  kernel_args args(kernels().kernel("scale_7"));
  EXPECT_CORA_ERROR(args.append(nullptr, 8), errc::invalid_argument);
  void* p = nullptr;
  EXPECT_CORA_ERROR(args.append(&p, 0), errc::invalid_argument);
}

TEST(kernel_args, WithoutAKernelEveryCallIsAnInvalidHandle) {
  kernel_args args;
  EXPECT_CORA_ERROR(args.append_placeholder(), errc::invalid_handle);
  EXPECT_CORA_ERROR(args.finalize(), errc::invalid_handle);
}

}  // namespace
}  // namespace cora::test
