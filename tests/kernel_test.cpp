// The portable kernel dialect (include/cora/kernel.hpp) on every device: grid_range, block_range, blocks with
// threads, the phased form and the barrier fallback.
#include <cora/cora.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

struct shape {
  std::uint32_t grid, block;
};

class kernel_test : public device_test {
 protected:
  // Launch shapes: the CPU device's old one (a block a worker, one thread each) first, then
  // grids and blocks of other sizes.
  std::vector<shape> shapes() {
    const std::uint32_t units = dev().properties().compute_units;
    return {{units, 1}, {1, 1}, {7, 1}, {13, 7}, {4, 64}, {3, 256}, {40, 32}};
  }

  template <class T>
  std::vector<T> download(const device_buffer<T>& d, std::size_t n) {
    std::vector<T> out(n);
    auto s = dev().make_stream();
    s.copy(out.data(), d.data(), n * sizeof(T)).wait();
    return out;
  }
  template <class T>
  void upload(device_buffer<T>& d, const std::vector<T>& v) {
    auto s = dev().make_stream();
    s.copy(d.data(), v.data(), v.size() * sizeof(T)).wait();
  }

  // Runs `launch(shape)` for every shape and checks each result bitwise against the first.
  template <class T, class Launch>
  void same_over_shapes(const std::string& name, device_buffer<T>& out, std::size_t n,
                        const std::vector<T>& initial, Launch launch) {
    std::vector<T> first;
    for (const shape& sh : shapes()) {
      upload(out, initial);
      launch(sh);
      auto got = download(out, n);
      if (first.empty()) {
        first = got;
        continue;
      }
      ASSERT_EQ(std::memcmp(got.data(), first.data(), n * sizeof(T)), 0)
          << name << " differs with grid " << sh.grid << ", block " << sh.block;
    }
  }
};
CORA_DEVICE_SUITE(kernel_test);

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// 10007: no multiple of a cache line or a slice, so the last slices are ragged.
constexpr std::size_t n = 10007;

TEST_P(kernel_test, ElementwiseKernelsAreBitwiseEqualOverLaunchShapes) {
  const auto hx = random_floats(n, 1), hy = random_floats(n, 2);
  auto x = dev().alloc<float>(n), y = dev().alloc<float>(n), z = dev().alloc<float>(n);
  upload(x, hx);
  upload(y, hy);
  auto s = dev().make_stream();
  const std::vector<float> zeros(n, 0.0f);

  for (const char* name : {"add_f32", "add_f32_stride"}) {
    auto k = kernels().kernel(name);
    same_over_shapes<float>(name, z, n, zeros, [&](shape sh) {
      s.launch(k, {.grid = sh.grid, .block = sh.block}, x.data(), y.data(), z.data(), std::uint64_t{n}).wait();
    });
    auto got = download(z, n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], hx[i] + hy[i]) << name << " at " << i;
  }

  auto saxpy = kernels().kernel("saxpy_rounds");
  same_over_shapes<float>("saxpy_rounds", z, n, hy, [&](shape sh) {
    s.launch(saxpy, {.grid = sh.grid, .block = sh.block}, 1.5f, x.data(), z.data(), std::uint64_t{n}, 3u).wait();
  });

  auto scale = kernels().kernel("scale_7");
  same_over_shapes<float>("scale_7", z, n, hx, [&](shape sh) {
    s.launch(scale, {.grid = sh.grid, .block = sh.block}, z.data(), 0.25f, std::uint64_t{n}).wait();
  });
  auto scaled = download(z, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(scaled[i], hx[i] * 0.25f) << i;

  auto iota = kernels().kernel("iota_u32");
  auto u = dev().alloc<std::uint32_t>(n);
  same_over_shapes<std::uint32_t>("iota_u32", u, n, std::vector<std::uint32_t>(n, 0xffffffffu), [&](shape sh) {
    s.launch(iota, {.grid = sh.grid, .block = sh.block}, u.data(), std::uint64_t{n}).wait();
  });
  auto idx = download(u, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(idx[i], i);
}

TEST_P(kernel_test, GridRangeCoversTinyAndEmptyRanges) {
  auto iota = kernels().kernel("iota_u32");
  auto u = dev().alloc<std::uint32_t>(64);
  auto s = dev().make_stream();
  for (std::uint64_t count : {0u, 1u, 3u, 63u, 64u}) {
    upload(u, std::vector<std::uint32_t>(64, 0xffffffffu));
    s.launch(iota, {.grid = 9, .block = 5}, u.data(), count).wait();
    auto got = download(u, 64);
    for (std::uint64_t i = 0; i < 64; ++i)
      ASSERT_EQ(got[i], i < count ? static_cast<std::uint32_t>(i) : 0xffffffffu) << count << " " << i;
  }
}

TEST_P(kernel_test, BlockRangeGivesEveryIndexOfTheBlockToExactlyOneThread) {
  // block_range_mark adds j + 1 to out[j] for every index of every block: an index visited
  // twice shows 2 (j + 1), one never visited shows 0.
  auto mark = kernels().kernel("block_range_mark");
  auto s = dev().make_stream();
  for (const shape& sh : shapes())
    for (std::uint32_t per_block : {0u, 1u, 5u, 64u, 1000u}) {
      const std::size_t total = std::size_t{sh.grid} * per_block;
      auto out = dev().alloc<std::uint32_t>(total + 1);
      upload(out, std::vector<std::uint32_t>(total + 1, 0));
      s.launch(mark, {.grid = sh.grid, .block = sh.block}, out.data(), per_block).wait();
      auto got = download(out, total + 1);
      for (std::size_t j = 0; j < total; ++j)
        ASSERT_EQ(got[j], j + 1) << "grid " << sh.grid << ", block " << sh.block << ", "
                                 << per_block << " per block, index " << j;
      ASSERT_EQ(got[total], 0u) << "written past the last block";
    }
}

// block_sum_*: block b sums in[i] over the indices its threads visit in a grid-stride loop.
std::vector<std::uint64_t> expected_block_sums(const std::vector<std::uint32_t>& in, std::uint32_t grid,
                                               std::uint32_t block) {
  std::vector<std::uint64_t> out(grid, 0);
  for (std::size_t i = 0; i < in.size(); ++i) out[(i / block) % grid] += in[i];
  return out;
}

void check_block_sums(kernel_test& t, const char* name, cora::device& dev, cora::binary& bin) {
  std::vector<std::uint32_t> hin(5000);
  std::mt19937 gen(7);
  for (auto& v : hin) v = gen();
  auto in = dev.alloc<std::uint32_t>(hin.size());
  auto s = dev.make_stream();
  s.copy(in.data(), hin.data(), hin.size() * 4).wait();
  auto k = bin.kernel(name);
  for (std::uint32_t block : {1u, 7u, 64u, 256u})
    for (std::uint32_t grid : {1u, 3u, 5u}) {
      auto out = dev.alloc<std::uint64_t>(grid);
      s.fill(out.data(), 0xab, grid * 8).wait();
      s.launch(k, {.grid = grid, .block = block}, in.data(), std::uint64_t{hin.size()}, out.data()).wait();
      std::vector<std::uint64_t> got(grid);
      s.copy(got.data(), out.data(), grid * 8).wait();
      EXPECT_EQ(got, expected_block_sums(hin, grid, block)) << name << " grid " << grid << " block " << block;
    }
  (void)t;
}

TEST_P(kernel_test, BlockReductionInThePhasedForm) {
  check_block_sums(*this, "block_sum_phased", dev(), kernels());
}

TEST_P(kernel_test, BlockReductionWithRawBarriers) {
  check_block_sums(*this, "block_sum_raw", dev(), kernels());
}

TEST_P(kernel_test, GridRangeInsideAPhaseGivesEachThreadItsPart) {
  // reduce_u32: every thread sums its grid_range part; the blocks' sums add up to the total
  // whatever the shape, and no index is counted twice.
  std::vector<std::uint32_t> hin(10007);
  std::mt19937 gen(11);
  for (auto& v : hin) v = gen() % 1000;
  std::uint64_t total = 0;
  for (auto v : hin) total += v;
  auto in = dev().alloc<std::uint32_t>(hin.size());
  upload(in, hin);
  auto k = kernels().kernel("reduce_u32");
  auto s = dev().make_stream();
  for (const shape& sh : shapes()) {
    auto out = dev().alloc<std::uint64_t>(sh.grid);
    s.launch(k, {.grid = sh.grid, .block = sh.block}, in.data(), std::uint64_t{hin.size()}, out.data()).wait();
    std::uint64_t sum = 0;
    for (auto v : download(out, sh.grid)) sum += v;
    EXPECT_EQ(sum, total) << "grid " << sh.grid << ", block " << sh.block;
  }
}

TEST_P(kernel_test, PhasedAndRawFormsRunAfterEachOtherAndConcurrently) {
  // Both forms on two streams at once: each learns its own path, neither disturbs the other.
  std::vector<std::uint32_t> hin(4096, 1);
  auto in = dev().alloc<std::uint32_t>(hin.size());
  upload(in, hin);
  auto a = dev().alloc<std::uint64_t>(8), b = dev().alloc<std::uint64_t>(8);
  auto s1 = dev().make_stream(), s2 = dev().make_stream();
  auto phased = kernels().kernel("block_sum_phased"), raw = kernels().kernel("block_sum_raw");
  for (int round = 0; round < 5; ++round) {
    auto p1 = s1.launch(phased, {.grid = 8, .block = 32}, in.data(), std::uint64_t{4096}, a.data());
    auto p2 = s2.launch(raw, {.grid = 8, .block = 32}, in.data(), std::uint64_t{4096}, b.data());
    p1.wait();
    p2.wait();
    EXPECT_EQ(download(a, 8), std::vector<std::uint64_t>(8, 512));
    EXPECT_EQ(download(b, 8), std::vector<std::uint64_t>(8, 512));
  }
}

TEST_P(kernel_test, BlocksOfMoreThanTheDeviceLimitAreRejected) {
  const auto limit = dev().properties().max_threads_per_block;
  EXPECT_GE(limit, 256u);
  auto s = dev().make_stream();
  try {
    s.launch(kernels().kernel("empty"), {.block = limit + 1}).wait();
    FAIL() << "a block over the limit launched";
  } catch (const cora::error& e) {
    EXPECT_EQ(e.code(), errc::invalid_launch_config);
  }
}

}  // namespace
}  // namespace cora::test
