#include "cora/binary.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <sys/stat.h>

#include <asio/post.hpp>
#include <atomic>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <span>
#include <thread>
#include <vector>

#include "core/binary_format.hpp"
#include "core/host_pool.hpp"
#include "core/state.hpp"
#include "support/device_fixture.hpp"

namespace cora::test {
namespace {

std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

std::filesystem::path temp_file(const std::string& name, const std::vector<std::byte>& bytes) {
  auto p = std::filesystem::temp_directory_path() / ("cora_binary_test_" + name);
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return p;
}

class binary_test : public device_test {};

// z = x + x through `b`'s add_f32 over 64 floats of `value`: each element of z, read back.
std::vector<float> add_to_itself(device& d, const binary& b, float value) {
  auto s = d.make_stream();
  const std::size_t n = 64;
  auto x = d.alloc<float>(n), z = d.alloc<float>(n);
  std::vector<float> hx(n, value), hz(n);
  s.copy(x.data(), hx.data(), n * 4).wait();
  (void)s.launch(b.kernel("add_f32"), {.grid = 2}, x.data(), x.data(), z.data(), std::uint64_t{n});
  s.copy(hz.data(), z.data(), n * 4).wait();
  return hz;
}
CORA_DEVICE_SUITE(binary_test);

TEST_P(binary_test, LoadsAContainerFromFileAndFindsKernelsByName) {
  auto b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  EXPECT_TRUE(b.loaded());
  auto k = b.kernel("add_f32");
  EXPECT_EQ(k.name(), "add_f32");
  ASSERT_EQ(k.params().size(), 4u);
  EXPECT_EQ(k.params()[0].size, sizeof(void*));
  EXPECT_EQ(k.params()[3].size, 8u);
  EXPECT_EQ(k.args_size(), 32u);
  auto names = b.kernel_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "trap"), names.end());
  EXPECT_NE(b.format().find("corabin"), std::string::npos);
}

TEST_P(binary_test, GlobalsOfTheDeviceCodeAreFoundByName) {
  auto b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  const device_global g = b.global("cora_test_counter");
  ASSERT_NE(g.address, nullptr);
  EXPECT_EQ(g.size, sizeof(std::uint32_t));
  auto s = dev().make_stream();
  auto h = dev().alloc_host<std::uint32_t>(1);
  s.copy(h.data(), g.address, 4).wait();
  EXPECT_EQ(h[0], 7u);  // its initializer
  h[0] = 40;
  (void)s.copy(g.address, h.data(), 4);
  (void)s.launch(b.kernel("bump_global"), {}, std::uint32_t{2});
  s.copy(h.data(), g.address, 4).wait();
  EXPECT_EQ(h[0], 42u);
  EXPECT_CORA_ERROR(b.global("no_such_global"), errc::kernel_not_found);
  EXPECT_CORA_ERROR(b.global("bump_global"), errc::kernel_not_found);  // a kernel is no global
  // Refused before the driver is asked (CUDA would answer an empty name as an invalid value).
  EXPECT_CORA_ERROR(b.global(""), errc::invalid_argument);
  EXPECT_CORA_ERROR(b.global(std::string_view("cora_test_counter\0x", 19)), errc::invalid_argument);
  b.unload();
  EXPECT_CORA_ERROR(b.global("cora_test_counter"), errc::binary_unloaded);
}

TEST_P(binary_test, LoadsFromMemoryWithoutFiles) {
  auto bytes = read_file(kernel_file("test_kernels.corabin"));
  auto b = dev().load_binary(std::span<const std::byte>(bytes)).wait();
  EXPECT_EQ(b.kernel("empty").params().size(), 0u);
}

TEST_P(binary_test, FindsKernelsByEntryKey) {
  auto k = kernels().kernel_by_entry(7);
  EXPECT_EQ(k.name(), "scale_7");
  EXPECT_EQ(k.entry_key(), std::optional<std::uint64_t>(7));
  EXPECT_CORA_ERROR(kernels().kernel_by_entry(8), errc::kernel_not_found);
}

TEST_P(binary_test, UnknownKernelNameIsKernelNotFound) {
  EXPECT_CORA_ERROR(kernels().kernel("no_such_kernel"), errc::kernel_not_found);
  std::error_code ec;
  auto k = kernels().kernel("no_such_kernel", ec);
  EXPECT_EQ(ec, make_error_code(errc::kernel_not_found));
  EXPECT_FALSE(k);
  EXPECT_NE(last_error_message().find("no_such_kernel"), std::string::npos);
}

TEST_P(binary_test, ReportsParameterLayoutOfMixedSizes) {
  auto k = kernels().kernel("mixed_args");
  ASSERT_EQ(k.params().size(), 5u);
  // u8, u16, 16-byte struct, u32, pointer: each slot aligned to max(8, alignment).
  EXPECT_EQ(k.params()[0].offset, 0u);
  EXPECT_EQ(k.params()[1].offset, 8u);
  EXPECT_EQ(k.params()[2].offset, 16u);
  EXPECT_EQ(k.params()[2].size, 16u);
  EXPECT_EQ(k.params()[3].offset, 32u);
  EXPECT_EQ(k.params()[4].offset, 40u);
  EXPECT_EQ(k.args_size(), 48u);
}

TEST_P(binary_test, MissingFileReportsTheSystemErrorWithThePath) {
  try {
    dev().load_binary(std::filesystem::path("/nonexistent/dir/k.corabin")).wait();
    FAIL() << "no error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::error_code(ENOENT, std::system_category()));
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/k.corabin"), std::string::npos);
  }
}

TEST_P(binary_test, DirectoryIsAnError) {
  try {
    dev().load_binary(std::filesystem::temp_directory_path()).wait();
    FAIL() << "no error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), std::error_code(EISDIR, std::system_category()));
  }
}

TEST_P(binary_test, EmptyFileIsAnInvalidBinary) {
  auto p = temp_file("empty", {});
  try {
    dev().load_binary(p).wait();
    FAIL() << "no error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_binary));
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos);
  }
  std::filesystem::remove(p);
}

TEST_P(binary_test, TruncatedContainerIsAnInvalidBinary) {
  auto bytes = read_file(kernel_file("test_kernels.corabin"));
  bytes.resize(bytes.size() / 2);
  std::error_code ec;
  dev().load_binary(std::span<const std::byte>(bytes)).wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
}

TEST_P(binary_test, CorruptedImageFailsItsChecksum) {
  auto bytes = read_file(kernel_file("test_kernels.corabin"));
  // A byte in the middle of the part of every image that a load reads (a CPU image's loadable
  // segments, any other image whole): a load checks the image its device runs, from memory and
  // from a file alike.
  std::error_code pe;
  std::string pm;
  const auto parsed = detail::parse_corabin(bytes, pe, pm);
  ASSERT_FALSE(pe) << pm;
  std::vector<std::size_t> middles;
  for (const auto& img : parsed.images)
    middles.push_back(static_cast<std::size_t>(img.offset + img.load_size / 2));
  for (std::size_t m : middles) bytes[m] ^= std::byte{0xff};
  const auto p = temp_file("corrupted.corabin", bytes);
  for (bool from_file : {false, true}) {
    try {
      if (from_file)
        dev().load_binary(p).wait();
      else
        dev().load_binary(std::span<const std::byte>(bytes)).wait();
      ADD_FAILURE() << "no error " << (from_file ? "from a file" : "from memory");
    } catch (const error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::invalid_binary));
      EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(p);
}

// Found by fuzzing: in the loaded part of a CPU image, the top bit of two words flipped (here
// the 8th byte of two 64-byte-aligned words, in different lanes of the word hash). With plain
// FNV-1a lanes the flips cancelled, the load passed its checksum, and the dynamic loader
// crashed on the damaged relocations.
TEST_P(binary_test, TwoTopBitFlipsInTheLoadedPartFailTheChecksum) {
  auto bytes = read_file(kernel_file("test_kernels.corabin"));
  std::error_code pe;
  std::string pm;
  const auto parsed = detail::parse_corabin(bytes, pe, pm);
  ASSERT_FALSE(pe) << pm;
  for (const auto& img : parsed.images) {
    ASSERT_GE(img.load_size, std::size_t{256});
    const auto base = static_cast<std::size_t>(img.offset);
    bytes[base + 64 + 7] ^= std::byte{0x80};
    bytes[base + 128 + 8 + 7] ^= std::byte{0x80};
  }
  try {
    dev().load_binary(std::span<const std::byte>(bytes)).wait();
    ADD_FAILURE() << "the damaged container loaded";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_binary));
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
}

// A load reads only the container's metadata and the part of the image its device runs: damage
// anywhere else (another device's image; a CPU image's debug sections, which are never mapped)
// leaves the load working, while a full check of the container (cora-inspect) finds it.
TEST_P(binary_test, DamageOutsideWhatALoadReadsLeavesTheLoadWorking) {
  auto bytes = read_file(kernel_file("test_kernels.corabin"));
  std::error_code pe;
  std::string pm;
  const auto parsed = detail::parse_corabin(bytes, pe, pm);
  ASSERT_FALSE(pe) << pm;
  const bool cpu = dev().properties().backend == backend_kind::cpu;
  int damaged = 0;
  for (const auto& img : parsed.images) {
    const bool runs_here = (img.kind == detail::binary_kind::cpu_elf) == cpu;
    if (!runs_here) {
      bytes[img.offset + img.size / 2] ^= std::byte{0xff};
      ++damaged;
    } else if (img.load_size < img.size) {
      bytes[img.offset + img.load_size + (img.size - img.load_size) / 2] ^= std::byte{0xff};
      ++damaged;
    }
  }
  ASSERT_GT(damaged, 0);
  detail::parse_corabin(bytes, pe, pm);
  EXPECT_EQ(pe, make_error_code(errc::invalid_binary)) << "a full check misses the damage";
  const auto p = temp_file("damaged_elsewhere.corabin", bytes);
  for (bool from_file : {false, true}) {
    auto b = from_file ? dev().load_binary(p).wait() : dev().load_binary(std::span<const std::byte>(bytes)).wait();
    EXPECT_EQ(add_to_itself(dev(), b, 1.5f), std::vector<float>(64, 3.0f)) << (from_file ? "from a file" : "from memory");
  }
  std::filesystem::remove(p);
}

// A container file unchanged since a load of it is read again only for its image (its plan is
// known): loads of it, eager and lazy, after a first one give kernels that run correctly.
TEST_P(binary_test, AFileLoadedAgainUnchangedGivesWorkingKernels) {
  const auto p = temp_file("known.corabin", read_file(kernel_file("test_kernels.corabin")));
  // Older than the file system's timestamp granularity, so that a load may trust it unchanged.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto first = dev().load_binary(p).wait();
  for (bool lazy : {false, true, false}) {
    SCOPED_TRACE(lazy ? "lazy" : "eager");
    load_options o;
    o.lazy = lazy;
    auto b = dev().load_binary(p, o).wait();
    EXPECT_EQ(b.kernel_names(), first.kernel_names());
    EXPECT_EQ(add_to_itself(dev(), b, 1.25f), std::vector<float>(64, 2.5f));
    first.unload();  // later loads of the CPU image may map the file it leaves
    first = b;
  }
  std::filesystem::remove(p);
}

// The caller's bytes need to live only for the call: a load that continues on another thread
// (a GPU's) has copied what it needs, and an in-memory CPU load has completed.
TEST_P(binary_test, BytesMayBeOverwrittenAsSoonAsLoadBinaryReturns) {
  auto bytes = read_file(kernel_file("test_kernels.corabin"));
  auto pending = dev().load_binary(std::span<const std::byte>(bytes));
  if (dev().properties().backend == backend_kind::cpu) {
    EXPECT_TRUE(pending.ready()) << "an in-memory CPU load hopped threads";
  }
  std::fill(bytes.begin(), bytes.end(), std::byte{0xa5});
  bytes.clear();
  bytes.shrink_to_fit();
  auto b = pending.wait();
  EXPECT_TRUE(b.kernel("add_f32"));
}

TEST_P(binary_test, TextFileIsAnInvalidBinary) {
  const std::string text = "this is not a kernel binary\n";
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  std::error_code ec;
  dev().load_binary(std::span<const std::byte>(bytes)).wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
}

TEST_P(binary_test, ForeignElfIsAnInvalidBinary) {
  // An executable of this machine: an ELF, but no kernel image.
  auto bytes = read_file("/proc/self/exe");
  ASSERT_GT(bytes.size(), 64u);
  std::error_code ec;
  dev().load_binary(std::span<const std::byte>(bytes)).wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
}

TEST_P(binary_test, SharedObjectWithoutKernelRecordsIsAnInvalidBinary) {
  // A real shared library of the system: loadable, but it carries no cora kernel records.
  for (const char* lib : {"/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1",
                          "/lib/x86_64-linux-gnu/libm.so.6"}) {
    if (!std::filesystem::exists(lib)) continue;
    std::error_code ec;
    dev().load_binary(std::filesystem::path(lib)).wait(ec);
    EXPECT_EQ(ec, make_error_code(errc::invalid_binary)) << lib;
    return;
  }
  GTEST_SKIP() << "no system shared library found to try";
}

TEST_P(binary_test, DoubleUnloadIsAlreadyUnloaded) {
  auto b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  b.unload();
  EXPECT_FALSE(b.loaded());
  EXPECT_CORA_ERROR(b.unload(), errc::already_unloaded);
  EXPECT_CORA_ERROR(b.kernel("empty"), errc::binary_unloaded);
}

TEST_P(binary_test, KernelOfAnUnloadedBinaryCannotLaunch) {
  auto b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  auto k = b.kernel("empty");
  b.unload();
  auto s = dev().make_stream();
  EXPECT_CORA_ERROR(s.launch(k, {}).wait(), errc::binary_unloaded);
}

TEST_P(binary_test, UnloadWhileLaunchesAreInFlightLetsThemFinish) {
  auto b = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  auto slow = b.kernel("slow");
  auto s = dev().make_stream();
  auto flag = dev().alloc<std::uint32_t>(1);
  (void)s.fill(flag, 0);
  auto done = s.launch(slow, {}, std::uint64_t{50000}, flag);
  b.unload();  // the launch holds the code until it completes
  slow = {};
  done.wait();
  std::uint32_t v = 0;
  s.copy(&v, flag.data(), sizeof(v)).wait();
  EXPECT_EQ(v, 1u);
}

TEST_P(binary_test, LazyLoadDefersTheDeviceLoadToTheFirstLookup) {
  auto b = dev().load_binary(kernel_file("test_kernels.corabin"), {.lazy = true}).wait();
  EXPECT_FALSE(b.kernel_names().empty());
  auto k = b.kernel("add_f32");
  EXPECT_EQ(k.params().size(), 4u);
}

TEST_P(binary_test, ImagesLoadedOneAfterAnotherStayDistinct) {
  // Earlier images stay loaded while others come and go: each load must get its own image (on
  // the CPU device, a reused memory-file name once handed back an older image).
  auto keep = dev().load_binary(kernel_file("test_kernels.corabin")).wait();
  for (int round = 0; round < 4; ++round) {
    auto simple = dev().load_binary(kernel_file("add_custom.corabin")).wait();
    EXPECT_EQ(simple.kernel("add_custom").params().size(), 3u) << round;
    auto tiling = dev().load_binary(kernel_file("add_custom_tiling.corabin")).wait();
    EXPECT_EQ(tiling.kernel("add_custom").params().size(), 5u) << round;
    simple = binary();  // freed: its slot may be reused by the next load
  }
  EXPECT_EQ(keep.kernel("add_f32").params().size(), 4u);
}

// test_kernels.corabin rebuilt with its metadata edited, and a valid checksum: the edits must
// be found against the image, whichever way it is loaded (issue 18, item 1).
std::vector<std::byte> container_with_edited_metadata(const std::string& kernel, std::size_t param,
                                                      std::uint32_t size, std::uint32_t align) {
  const auto original = read_file(kernel_file("test_kernels.corabin"));
  std::error_code ec;
  std::string message;
  auto parsed = detail::parse_corabin(original, ec, message);
  if (ec) throw std::runtime_error(message);
  for (auto& k : parsed.kernels)
    if (k.name == kernel) {
      if (size) k.params.at(param).size = size;
      if (align) k.params.at(param).align = align;
    }
  std::vector<detail::corabin_input> images;
  for (const auto& img : parsed.images)
    images.push_back({img.kind, img.arch, std::vector<std::byte>(img.bytes.begin(), img.bytes.end())});
  return detail::write_corabin(images, parsed.kernels);
}

// Loads `bytes` (lazily or not), then looks up `kernel`: one of the two must refuse it.
void expect_refused(cora::device& dev, const std::vector<std::byte>& bytes, bool lazy, const std::string& kernel) {
  std::error_code ec;
  auto b = dev.load_binary(std::span<const std::byte>(bytes), {.lazy = lazy}).wait(ec);
  if (!ec) b.kernel(kernel, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary)) << kernel << (lazy ? " (lazy)" : " (eager)");
}

TEST_P(binary_test, MetadataWithAnotherAlignmentThanTheImageIsRefused) {
  const auto bytes = container_with_edited_metadata("add_f32", 1, 0, 16);
  expect_refused(dev(), bytes, false, "add_f32");
  expect_refused(dev(), bytes, true, "add_f32");
}

TEST_P(binary_test, MetadataWithAnotherParameterSizeThanTheImageIsRefused) {
  const auto bytes = container_with_edited_metadata("scale_7", 2, 4, 4);
  expect_refused(dev(), bytes, false, "scale_7");
  expect_refused(dev(), bytes, true, "scale_7");
}

TEST_P(binary_test, RawCpuImageOutsideAContainerIsRefused) {
  if (GetParam() != backend::cpu) GTEST_SKIP() << "CPU images run on the CPU device";
  // Issue 18, item 2: ld.so trusts the bytes it maps, and a raw ELF has no checksum to check
  // them against, so it is refused before dlopen, intact or not.
  auto image = read_file(kernel_file("test_kernels.cora/test_kernels.cpu.so"));
  ASSERT_FALSE(image.empty());
  for (int round = 0; round < 2; ++round) {
    if (round == 1)
      for (std::size_t i = 64; i < image.size(); i += 97) image[i] ^= std::byte{0x5a};
    try {
      dev().load_binary(std::span<const std::byte>(image)).wait();
      ADD_FAILURE() << "a raw CPU image loaded, round " << round;
    } catch (const cora::error& e) {
      EXPECT_EQ(e.code(), errc::invalid_binary) << round;
      EXPECT_NE(std::string(e.what()).find("container"), std::string::npos) << e.what();
    }
  }
}

TEST_P(binary_test, SixteenThreadsLookUpOneKernelAtOnce) {
  // The first lookup resolves the kernel (function, layout); concurrent first lookups must all
  // get it, whole, once.
  for (bool lazy : {false, true}) {
    auto b = dev().load_binary(kernel_file("test_kernels.corabin"), {.lazy = lazy}).wait();
    constexpr int threads = 16;
    std::atomic<int> arrived{0};
    std::vector<cora::kernel> got(threads);
    std::vector<std::string> errors(threads);
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i)
      ts.emplace_back([&, i] {
        arrived.fetch_add(1);
        while (arrived.load() < threads) std::this_thread::yield();
        try {
          got[i] = b.kernel("add_f32");
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (auto& t : ts) t.join();
    for (int i = 0; i < threads; ++i) {
      ASSERT_TRUE(errors[i].empty()) << errors[i];
      ASSERT_TRUE(got[i]) << i;
      ASSERT_EQ(got[i].params().size(), 4u) << i;
      EXPECT_EQ(got[i].args_size(), 32u) << i;
      EXPECT_EQ(got[i].state()->function, got[0].state()->function) << i;
    }
    // Each handle launches.
    auto s = dev().make_stream();
    const std::size_t n = 1000;
    auto x = dev().alloc<float>(n), z = dev().alloc<float>(n);
    std::vector<float> hx(n, 1.5f), hz(n);
    s.copy(x.data(), hx.data(), n * 4).wait();
    for (int i = 0; i < threads; ++i) (void)s.launch(got[i], {.grid = 4}, x.data(), x.data(), z.data(), std::uint64_t{n});
    s.copy(hz.data(), z.data(), n * 4).wait();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hz[i], 3.0f) << i;
  }
}

TEST_P(binary_test, MissingKernelAfterALazyLoadIsTheSameErrorAsAfterAnEagerOne) {
  std::string what[2];
  for (bool lazy : {false, true}) {
    auto b = dev().load_binary(kernel_file("test_kernels.corabin"), {.lazy = lazy}).wait();
    try {
      b.kernel("no_such_kernel");
      ADD_FAILURE() << "found a kernel that is not there";
    } catch (const cora::error& e) {
      EXPECT_EQ(e.code(), errc::kernel_not_found);
      what[lazy] = e.what();
    }
    std::error_code ec;
    b.kernel_by_entry(123456, ec);
    EXPECT_EQ(ec, make_error_code(errc::kernel_not_found));
  }
  EXPECT_EQ(what[0], what[1]);
  EXPECT_NE(what[0].find("no_such_kernel"), std::string::npos) << what[0];
}

TEST_P(binary_test, LoadFromAnEmptySpanIsInvalid) {
  std::error_code ec;
  dev().load_binary(std::span<const std::byte>()).wait(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
}

// A binary unloaded while the device is idle is unloaded on the calling thread: the image is gone
// when unload() returns, with every cora thread that unloads otherwise (the device-wait pool)
// held busy meanwhile. (Dropping the last handle does the same; unload() is used here because the
// last handle is not always the test's: a pending's shared state keeps a copy of its value until
// the state goes, on whichever thread lets it go last.) On the CPU device the kernel's entry
// function lies in the loaded image, so the dynamic loader tells whether it is still mapped.
TEST(binary_unload, AnUnloadOnAnIdleDeviceUnloadsOnTheCallingThread) {
  runtime* rt = shared_runtime(backend::cpu);
  ASSERT_NE(rt, nullptr);
  auto& d = rt->device(0);
  auto b = d.load_binary(read_file(kernel_file("test_kernels.corabin"))).wait();
  void* code = b.kernel("empty").code_address();
  ASSERT_NE(code, nullptr);
  Dl_info info{};
  ASSERT_NE(::dladdr(code, &info), 0) << "the loaded kernel's code is not in a loaded object";

  // Both threads of the device-wait pool held until the end of the test.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> holding{0};
  for (int i = 0; i < 2; ++i)
    asio::post(detail::device_wait_pool(), [released, &holding] {
      holding.fetch_add(1);
      released.wait();
    });
  while (holding.load() < 2) std::this_thread::yield();

  b.unload();
  const bool still_mapped = ::dladdr(code, &info) != 0;
  release.set_value();
  EXPECT_FALSE(still_mapped) << "the unloaded binary's image was still loaded after unload() returned";
}

// The GNU unique symbols among an ELF image's dynamic symbols (-1: not a readable ELF image).
int gnu_unique_symbols(std::span<const std::byte> f) {
  if (f.size() < sizeof(Elf64_Ehdr)) return -1;
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  if (eh.e_shoff == 0 || eh.e_shoff + std::size_t{eh.e_shnum} * sizeof(Elf64_Shdr) > f.size()) return -1;
  int unique = 0;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, f.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof sh);
    if (sh.sh_type != SHT_DYNSYM) continue;
    if (sh.sh_offset + sh.sh_size > f.size()) return -1;
    for (std::size_t off = 0; off + sizeof(Elf64_Sym) <= sh.sh_size; off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      std::memcpy(&sym, f.data() + sh.sh_offset + off, sizeof sym);
      if (ELF64_ST_BIND(sym.st_info) == STB_GNU_UNIQUE) ++unique;
    }
  }
  return unique;
}

// A CPU image with a GNU unique symbol can never be unloaded (the dynamic loader keeps it for
// the process's life). Images are compiled without them, and export nothing from static
// archives, so that a toolchain that links the standard library statically (its archive
// compiled with them) adds none either.
TEST(binary_unload, CpuImagesHaveNoGnuUniqueSymbols) {
  for (const char* file : {"test_kernels.corabin", "add_custom.corabin", "add_custom_tiling.corabin"}) {
    SCOPED_TRACE(file);
    const auto bytes = read_file(kernel_file(file));
    std::error_code ec;
    std::string message;
    const detail::corabin c = detail::parse_corabin(bytes, ec, message);
    ASSERT_FALSE(ec) << message;
    int cpu_images = 0;
    for (const auto& image : c.images) {
      if (image.kind != detail::binary_kind::cpu_elf) continue;
      ++cpu_images;
      EXPECT_EQ(gnu_unique_symbols(image.bytes), 0);
    }
    EXPECT_EQ(cpu_images, 1);
  }
}

// The memory file (its inode) a CPU image of `b` is mapped from.
ino_t image_file_of(const binary& b, const char* kernel) {
  Dl_info info{};
  if (::dladdr(b.kernel(kernel).code_address(), &info) == 0 || !info.dli_fname) return 0;
  struct stat st {};
  if (::stat(info.dli_fname, &st) != 0) return 0;
  return st.st_ino;
}

// A CPU image loaded again, after its module unloaded, maps the memory file the first load wrote
// (no second copy): from memory, and from a file unchanged since. Loaded twice at once, the two
// stay two files, so that their globals stay apart.
TEST(binary_unload, ACpuImageLoadedAgainMapsTheFileItsUnloadLeft) {
  runtime* rt = shared_runtime(backend::cpu);
  ASSERT_NE(rt, nullptr);
  auto& d = rt->device(0);
  const auto bytes = read_file(kernel_file("test_kernels.corabin"));
  const auto path = temp_file("kept.corabin", bytes);
  // Older than the file system's timestamp granularity, so that a load may trust it unchanged.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  for (bool from_file : {false, true}) {
    SCOPED_TRACE(from_file ? "from a file" : "from memory");
    auto load = [&] { return from_file ? d.load_binary(path).wait() : d.load_binary(bytes).wait(); };
    auto first = load();
    const ino_t file = image_file_of(first, "empty");
    ASSERT_NE(file, 0u);
    auto second = load();
    EXPECT_NE(image_file_of(second, "empty"), file) << "two loads at once share one image";
    first.unload();  // its file kept
    second.unload();  // one file a key is enough: this one goes
    auto again = load();
    EXPECT_EQ(image_file_of(again, "empty"), file) << "the image was written to a new file";
  }
  std::filesystem::remove(path);
}

// A file loaded once, then damaged in place (its CPU image's loaded part, same size): the next
// load reads the image again and fails its checksum; what the first load left is not used for a
// file that changed.
TEST(binary_unload, AFileChangedAfterALoadIsReadAgain) {
  runtime* rt = shared_runtime(backend::cpu);
  ASSERT_NE(rt, nullptr);
  auto& d = rt->device(0);
  auto bytes = read_file(kernel_file("test_kernels.corabin"));
  const auto path = temp_file("changed.corabin", bytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  d.load_binary(path).wait() = {};  // remembered with its image's key; the image file kept
  std::error_code pe;
  std::string pm;
  const auto parsed = detail::parse_corabin(bytes, pe, pm);
  ASSERT_FALSE(pe) << pm;
  for (const auto& img : parsed.images)
    if (img.kind == detail::binary_kind::cpu_elf) bytes[img.offset + img.load_size / 2] ^= std::byte{0xff};
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);  // in place: same inode
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    d.load_binary(path).wait();
    ADD_FAILURE() << "the damaged file loaded";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_binary));
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cora::test
