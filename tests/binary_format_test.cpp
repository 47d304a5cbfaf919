#include "core/binary_format.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "cora/detail/cpu_kernel_abi.h"
#include "cora/error.hpp"
#include "support/device_fixture.hpp"

namespace cora::detail {
namespace {

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

std::vector<std::byte> read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

TEST(binary_format, SniffsEveryFormatByItsMagic) {
  EXPECT_EQ(sniff_binary(bytes_of("CORABIN1 and more")), binary_kind::corabin);
  EXPECT_EQ(sniff_binary(bytes_of("//\n// comment\n.version 8.0\n.target sm_90\n")), binary_kind::cuda_ptx);
  std::vector<std::byte> fat(32);
  const std::uint32_t magic = 0xBA55ED50u;
  std::memcpy(fat.data(), &magic, 4);
  EXPECT_EQ(sniff_binary(fat), binary_kind::cuda_fatbin);
  // An ELF of another machine (e_machine = 40, ARM).
  auto arm = read_file("/proc/self/exe");
  arm.resize(64);
  const std::uint16_t em_arm = 40;
  std::memcpy(arm.data() + 18, &em_arm, 2);
  EXPECT_EQ(sniff_binary(arm), binary_kind::foreign_elf);
  EXPECT_EQ(sniff_binary(bytes_of("hello")), binary_kind::unknown);
  EXPECT_EQ(sniff_binary({}), binary_kind::unknown);
}

TEST(binary_format, ReadsTheKernelRecordsOfACpuImage) {
  auto image = read_file(cora::test::kernel_file("test_kernels.cora/test_kernels.cpu.so").string());
  ASSERT_FALSE(image.empty());
  EXPECT_EQ(sniff_binary(image), binary_kind::cpu_elf);
  std::error_code ec;
  std::string message;
  auto kernels = read_cpu_kernel_records(image, ec, message);
  ASSERT_FALSE(ec) << message;
  auto it = std::find_if(kernels.begin(), kernels.end(), [](auto& k) { return k.name == "scale_7"; });
  ASSERT_NE(it, kernels.end());
  EXPECT_EQ(it->entry_key, std::optional<std::uint64_t>(7));
  EXPECT_EQ(it->params.size(), 3u);
}

TEST(binary_format, AnX86ElfWithoutKernelRecordsIsRejected) {
  // A PIE executable is an ET_DYN object of this machine, so it sniffs as a CPU image; its
  // missing kernel records reject it.
  auto exe = read_file("/proc/self/exe");
  std::error_code ec;
  std::string message;
  read_cpu_kernel_records(exe, ec, message);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
  EXPECT_NE(message.find("no cora kernel records"), std::string::npos) << message;
}

TEST(binary_format, ContainerRoundTrips) {
  std::vector<backend::kernel_desc> kernels{{"k_3", 3, {{8, 8}, {4, 4}}, true, 0}};
  std::vector<corabin_input> images{{binary_kind::cuda_ptx, 0, bytes_of(".version 8.0\n.target sm_90\n")}};
  auto c = write_corabin(images, kernels);
  std::error_code ec;
  std::string message;
  auto parsed = parse_corabin(c, ec, message);
  ASSERT_FALSE(ec) << message;
  ASSERT_EQ(parsed.images.size(), 1u);
  EXPECT_EQ(parsed.images[0].kind, binary_kind::cuda_ptx);
  ASSERT_EQ(parsed.kernels.size(), 1u);
  EXPECT_EQ(parsed.kernels[0].name, "k_3");
  EXPECT_EQ(parsed.kernels[0].entry_key, std::optional<std::uint64_t>(3));
  EXPECT_EQ(parsed.kernels[0].params.size(), 2u);
}

// Version 4: a CPU image's entry names the part a loader reads (headers and loadable segments,
// without debug sections) with a checksum of its own, and where its kernel records lie in it.
TEST(binary_format, ACpuImageEntryGivesTheLoadedPartAndItsRecords) {
  auto image = read_file(cora::test::kernel_file("test_kernels.cora/test_kernels.cpu.so").string());
  ASSERT_FALSE(image.empty());
  std::error_code ec;
  std::string message;
  const auto kernels = read_cpu_kernel_records(image, ec, message);
  ASSERT_FALSE(ec) << message;
  const auto c = write_corabin({{binary_kind::cpu_elf, 0, image}}, kernels);
  const auto parsed = parse_corabin(c, ec, message);
  ASSERT_FALSE(ec) << message;
  const auto& img = parsed.images[0];
  EXPECT_EQ(img.load_size, loadable_size(image));
  EXPECT_LT(img.load_size, img.size) << "the test image has debug sections";
  const auto part = img.bytes.first(img.load_size);
  EXPECT_TRUE(verify_corabin_load_part(img, part, ec, message)) << message;
  const auto records = read_corabin_image_records(img, part, ec, message);
  ASSERT_FALSE(ec) << message;
  ASSERT_EQ(records.size(), kernels.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].name, kernels[i].name);
    EXPECT_EQ(records[i].params.size(), kernels[i].params.size());
  }
  // Any changed byte of the loaded part fails its check (sampled: each check hashes the part).
  const auto offset = static_cast<std::size_t>(img.offset);
  for (std::size_t i = 0; i < img.load_size; i += 101) {
    auto bad = c;
    bad[offset + i] ^= std::byte{0x01};
    EXPECT_FALSE(verify_corabin_load_part(img, std::span<const std::byte>(bad).subspan(offset, img.load_size), ec, message))
        << "byte " << i;
  }
  // A part of another size is refused whatever its bytes.
  EXPECT_FALSE(verify_corabin_load_part(img, img.bytes, ec, message));
  EXPECT_FALSE(verify_corabin_load_part(img, part.first(part.size() - 1), ec, message));
}

TEST(binary_format, TheMetadataParsesFromTheFirstBytesAlone) {
  const auto c = read_file(cora::test::kernel_file("test_kernels.corabin").string());
  std::error_code ec;
  std::string message;
  const auto whole = parse_corabin(c, ec, message);
  ASSERT_FALSE(ec) << message;
  const std::uint64_t meta = corabin_meta_size(c);
  ASSERT_GT(meta, 64u);
  ASSERT_LT(meta, c.size());
  const auto head = parse_corabin_meta(std::span(c).first(meta), c.size(), ec, message);
  ASSERT_FALSE(ec) << message;
  ASSERT_EQ(head.images.size(), whole.images.size());
  for (std::size_t i = 0; i < head.images.size(); ++i) {
    EXPECT_TRUE(head.images[i].bytes.empty());
    EXPECT_EQ(head.images[i].offset, whole.images[i].offset);
    EXPECT_EQ(head.images[i].size, whole.images[i].size);
    EXPECT_EQ(head.images[i].load_checksum, whole.images[i].load_checksum);
  }
  EXPECT_EQ(head.kernels.size(), whole.kernels.size());
  parse_corabin_meta(std::span(c).first(meta - 1), c.size(), ec, message);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary)) << "metadata cut short";
  parse_corabin_meta(std::span(c).first(meta), c.size() + 1, ec, message);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary)) << "another file size";
  EXPECT_EQ(corabin_meta_size(bytes_of("CORABIN")), 0u);
}

TEST(binary_format, EveryTruncationOfAContainerIsRejected) {
  auto c = read_file(cora::test::kernel_file("test_kernels.corabin").string());
  ASSERT_GT(c.size(), 1000u);
  for (std::size_t n : {std::size_t{0}, std::size_t{8}, std::size_t{39}, std::size_t{40}, std::size_t{100},
                        c.size() / 2, c.size() - 1}) {
    std::error_code ec;
    std::string message;
    parse_corabin(std::span(c).first(n), ec, message);
    EXPECT_EQ(ec, make_error_code(errc::invalid_binary)) << "size " << n;
  }
}

TEST(binary_format, EveryChangedByteOfAnImageFailsItsChecksum) {
  // 100 bytes: whole words in every lane and a tail of bytes after them.
  std::string ptx = ".version 8.0\n.target sm_90\n// ";
  while (ptx.size() < 100) ptx += static_cast<char>('a' + ptx.size() % 26);
  std::vector<corabin_input> images{{binary_kind::cuda_ptx, 0, bytes_of(ptx)}};
  const auto c = write_corabin(images, {});
  std::error_code ec;
  std::string message;
  const auto parsed = parse_corabin(c, ec, message);
  ASSERT_FALSE(ec) << message;
  const auto offset = static_cast<std::size_t>(parsed.images[0].bytes.data() - c.data());
  for (std::size_t i = 0; i < ptx.size(); ++i)
    for (unsigned flip : {0x01u, 0x80u, 0xffu}) {
      auto bad = c;
      bad[offset + i] ^= static_cast<std::byte>(flip);
      parse_corabin(bad, ec, message);
      ASSERT_EQ(ec, make_error_code(errc::invalid_binary)) << "byte " << i << " ^ " << flip;
      EXPECT_NE(message.find("checksum"), std::string::npos) << message;
    }
}

// A loader checks only the image it picks: a flipped byte in another image leaves the others
// loadable, and the damaged one fails its own check.
TEST(binary_format, EachImageIsCheckedOnItsOwn) {
  std::vector<corabin_input> images{{binary_kind::cuda_ptx, 0, bytes_of(".version 8.0\n.target sm_90\n// a")},
                                    {binary_kind::cuda_ptx, 0, bytes_of(".version 8.0\n.target sm_80\n// b")}};
  auto c = write_corabin(images, {});
  std::error_code ec;
  std::string message;
  const auto good = parse_corabin(c, ec, message);
  ASSERT_FALSE(ec) << message;
  const auto offset = static_cast<std::size_t>(good.images[1].bytes.data() - c.data());
  c[offset + good.images[1].bytes.size() - 1] ^= std::byte{0x01};
  parse_corabin(c, ec, message);  // every image checked: the damage is found
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
  const auto lazy = parse_corabin(c, ec, message, false);
  ASSERT_FALSE(ec) << message;
  ASSERT_EQ(lazy.images.size(), 2u);
  EXPECT_TRUE(verify_corabin_image(lazy.images[0], ec, message)) << message;
  EXPECT_FALSE(verify_corabin_image(lazy.images[1], ec, message));
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
  EXPECT_NE(message.find("image 1 fails its checksum"), std::string::npos) << message;
}

TEST(binary_format, EveryChangedByteOfTheMetadataIsRejected) {
  // Header, image table and kernel records are covered too: an edited parameter size or
  // alignment must not pass for the image's own (issue 18, item 1).
  std::vector<backend::kernel_desc> kernels{{"k_3", 3, {{8, 8}, {4, 4}}, true, 0},
                                            {"other", std::nullopt, {{16, 16}}, true, 0}};
  std::vector<corabin_input> images{{binary_kind::cuda_ptx, 0, bytes_of(".version 8.0\n.target sm_90\n")}};
  const auto c = write_corabin(images, kernels);
  std::error_code ec;
  std::string message;
  const auto parsed = parse_corabin(c, ec, message);
  ASSERT_FALSE(ec) << message;
  // Everything up to the end of the records (the padding before the first image means nothing).
  std::uint64_t records_offset = 0;
  std::memcpy(&records_offset, c.data() + 24, sizeof(records_offset));
  const std::size_t meta_end = records_offset + kernels.size() * sizeof(cora_kernel_record);
  ASSERT_LE(meta_end, static_cast<std::size_t>(parsed.images[0].bytes.data() - c.data()));
  for (std::size_t i = 0; i < meta_end; ++i)
    for (unsigned flip : {0x01u, 0x10u, 0x80u}) {
      auto bad = c;
      bad[i] ^= static_cast<std::byte>(flip);
      parse_corabin(bad, ec, message);
      ASSERT_EQ(ec, make_error_code(errc::invalid_binary)) << "byte " << i << " ^ " << flip;
    }
}

TEST(binary_format, ImageThatIsNotWhatItsEntrySaysIsRejected) {
  std::vector<corabin_input> images{{binary_kind::cuda_fatbin, 0, bytes_of("not a fatbin at all, really")}};
  auto c = write_corabin(images, {});
  std::error_code ec;
  std::string message;
  parse_corabin(c, ec, message);
  EXPECT_EQ(ec, make_error_code(errc::invalid_binary));
}

TEST(binary_format, EntryKeyIsTheNumberAfterTheLastUnderscore) {
  std::uint64_t k = 0;
  EXPECT_TRUE(entry_key_of("add_custom_12", k));
  EXPECT_EQ(k, 12u);
  EXPECT_FALSE(entry_key_of("add_custom", k));
  EXPECT_FALSE(entry_key_of("add_", k));
  EXPECT_FALSE(entry_key_of("_5", k));
  EXPECT_FALSE(entry_key_of("k_99999999999999999999999", k));
}

TEST(binary_format, CanonicalBlockIsLimitedTo64KiB) {
  bool ok = false;
  EXPECT_EQ(canonical_block_size({{1, 1}, {8, 8}}, ok), 16u);
  EXPECT_TRUE(ok);
  canonical_block_size({{65536, 8}, {8, 8}}, ok);
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace cora::detail
