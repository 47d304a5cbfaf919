// libFuzzer target: a mutated kernel binary (.corabin container or CPU image) loaded on the CPU
// device (eagerly or lazily), then each of its kernels launched through a raw host argument block built from the
// kernel's declared layout: pointer parameters get device buffers of a bounded size, the others
// a small value (16 in every integer width) so that the build's kernels stay inside those
// buffers. Every load and launch must complete, with success or an error: a crash, a hang or a
// sanitizer report is a finding. With the metadata checked against the image, a mutation that
// survives loading cannot make a kernel read its arguments other than as declared.
#include <cora/cora.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr std::size_t buffer_bytes = 64 << 10;  // every pointer parameter's buffer
constexpr std::size_t buffers = 4;

void require(bool ok) {
  if (!ok) std::abort();
}

struct fixture {
  std::unique_ptr<cora::runtime> rt;
  cora::device* dev = nullptr;
  cora::stream stream;
  std::vector<cora::device_buffer<std::byte>> bufs;
  fixture() {
    cora::runtime_options o;
    o.use_environment = false;
    o.backend = cora::backend_selection::cpu;
    o.cpu_compute_units = 2;
    o.cpu_memory = 256 << 20;
    rt = std::make_unique<cora::runtime>(o);
    dev = &rt->device(0);
    stream = dev->make_stream();
    for (std::size_t i = 0; i < buffers; ++i) bufs.push_back(dev->alloc<std::byte>(buffer_bytes));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fixture fx;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  std::error_code ec;
  // Eager and lazy loads (which check the image when a kernel is first looked up), by the
  // input's length.
  cora::load_options options;
  options.lazy = size % 2 == 1;
  cora::binary bin = fx.dev->load_binary(bytes, options).wait(ec);
  if (ec) {
    require(!bin);
    return 0;
  }
  const auto names = bin.kernel_names();
  // The grid size (1 to 3 blocks) follows the input's length: stable for a given input.
  const std::uint32_t blocks = 1 + static_cast<std::uint32_t>(size % 3);
  for (const auto& name : names) {
    cora::kernel k = bin.kernel(name, ec);
    if (ec) continue;  // a lazily checked kernel that fails its checks
    std::vector<std::byte> block(k.args_size());
    std::size_t next_buffer = 0;
    for (const auto& p : k.params()) {
      require(p.offset + p.size <= block.size());
      if (p.pointer) {
        void* addr = fx.bufs[next_buffer++ % fx.bufs.size()].data();
        std::memcpy(block.data() + p.offset, &addr, sizeof(addr));
      } else {
        block[p.offset] = std::byte{16};
      }
    }
    cora::launch_config cfg;
    cfg.grid = {blocks, 1, 1};
    cfg.block = {1, 1, 1};
    cfg.timeout = std::chrono::seconds(5);
    (void)fx.stream.launch_host_block(k, cfg, block).wait(ec);
    // A failed launch (a kernel that traps) is reported once more here, then cleared.
    (void)fx.stream.synchronize().wait(ec);
  }
  bin.unload(ec);
  require(!ec);
  return 0;
}
