// libFuzzer target: every kernel binary parser on arbitrary bytes. Sniffing never fails;
// the CPU image's kernel records and the .corabin container (with its kernel metadata table)
// either parse into something self-consistent or fail with invalid_binary and a message.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "core/binary_format.hpp"
#include "cora/error.hpp"

namespace {

using namespace cora::detail;

// Aborts (a crash libFuzzer records) when a property of a parse result is broken.
void require(bool ok) {
  if (!ok) std::abort();
}

void check_failure(const std::error_code& ec, const std::string& message) {
  require(ec == cora::make_error_code(cora::errc::invalid_binary));
  require(!message.empty());
}

void check_kernels(const std::vector<cora::backend::kernel_desc>& kernels) {
  for (const auto& k : kernels) {
    require(!k.name.empty() && k.name.size() < 128);
    require(k.params.size() <= 128);
    bool ok = false;
    canonical_block_size(k.params, ok);
    require(ok);
    std::uint64_t key = 0;
    (void)entry_key_of(k.name, key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const binary_kind kind = sniff_binary(bytes);
  require(binary_kind_name(kind) != nullptr);
  (void)to_image_kind(kind);

  // Every parser runs on every input, whatever the sniffing says: each must check for itself.
  std::error_code ec;
  std::string message;
  auto records = read_cpu_kernel_records(bytes, ec, message);
  if (ec) {
    check_failure(ec, message);
    require(records.empty());
  } else {
    require(kind == binary_kind::cpu_elf && !records.empty());
    check_kernels(records);
  }

  // A file load parses the metadata from the first bytes alone: the same answer as the whole.
  message.clear();
  const std::uint64_t meta = corabin_meta_size(bytes);
  corabin head = parse_corabin_meta(bytes.first(std::min<std::uint64_t>(meta, size)), size, ec, message);
  if (ec) check_failure(ec, message);
  const bool head_ok = !ec;

  message.clear();
  corabin c = parse_corabin(bytes, ec, message);
  if (ec) {
    check_failure(ec, message);
    return 0;
  }
  require(kind == binary_kind::corabin && !c.images.empty());
  require(head_ok && head.images.size() == c.images.size());
  check_kernels(c.kernels);
  // The loaded part of each image passes its own check, and a CPU image's records read from
  // it either fail with invalid_binary or are valid.
  for (const auto& img : c.images) {
    require(img.load_size > 0 && img.load_size <= img.size);
    const auto part = img.bytes.first(img.load_size);
    require(verify_corabin_load_part(img, part, ec, message));
    if (img.kind != binary_kind::cpu_elf) continue;
    auto own = read_corabin_image_records(img, part, ec, message);
    if (ec)
      check_failure(ec, message);
    else
      check_kernels(own);
  }
  // A container that parses survives a round trip through the writer.
  std::vector<corabin_input> inputs;
  for (const auto& img : c.images) {
    require(img.bytes.data() >= bytes.data() &&
            img.bytes.data() + img.bytes.size() <= bytes.data() + bytes.size());
    require(sniff_binary(img.bytes) == img.kind);
    inputs.push_back({img.kind, img.arch, {img.bytes.begin(), img.bytes.end()}});
  }
  const auto written = write_corabin(inputs, c.kernels);
  corabin again = parse_corabin(written, ec, message);
  require(!ec && again.images.size() == c.images.size() &&
          again.kernels.size() == c.kernels.size());
  for (std::size_t i = 0; i < c.kernels.size(); ++i) {
    require(again.kernels[i].name == c.kernels[i].name);
    require(again.kernels[i].entry_key == c.kernels[i].entry_key);
    require(again.kernels[i].params.size() == c.kernels[i].params.size());
  }
  return 0;
}
