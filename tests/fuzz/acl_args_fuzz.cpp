// libFuzzer target: the C API's argument-list builder (aclrtKernelArgs*) fed random call
// sequences. Each input is a program of one-byte opcodes with their operands; every call must
// return a code (never crash, leak or touch memory it does not own). Launches reach every
// kernel: before a launch, the list's parameters are set from the kernel's declared layout
// (pointer parameters to device buffers of a bounded size or to a wild address, the others to
// 16), and a launch with a wild address must be refused when it is called, never queued.
#include <acl/acl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/binary_format.hpp"
#include "cora/detail/arg_layout.hpp"

namespace {

// Reads operands from the input; zeros once it runs out.
struct reader {
  const std::uint8_t* p;
  std::size_t n;
  bool empty() const { return n == 0; }
  std::uint8_t byte() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  std::size_t size(std::size_t max) {
    const std::size_t v = byte() | (std::size_t{byte()} << 8);
    return max ? v % (max + 1) : 0;
  }
};

// Addresses that are neither an allocation nor mapped: every launch passing one must fail.
constexpr std::uintptr_t wild[] = {0x1000, 0xdead00000000, 0x8000000000000000};
constexpr std::size_t buffer_bytes = 64 << 10;

struct fixture {
  aclrtBinHandle bin = nullptr;
  std::vector<aclrtFuncHandle> funcs;
  std::vector<std::vector<cora::backend::param_desc>> layouts;  // of funcs, from the container
  std::vector<void*> buffers;
  aclrtFuncHandle empty = nullptr;  // no parameters: safe to launch whatever was appended
  aclrtStream stream = nullptr;
  fixture() {
    if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) std::abort();
    const char* dir = std::getenv("CORA_TEST_KERNELS_DIR");
    const std::string path =
        std::string(dir && *dir ? dir : CORA_FUZZ_KERNELS_DIR) + "/test_kernels.corabin";
    if (aclrtBinaryLoadFromFile(path.c_str(), nullptr, &bin) != ACL_SUCCESS) std::abort();
    std::ifstream file(path, std::ios::binary);
    const std::vector<char> raw{std::istreambuf_iterator<char>(file), {}};
    std::error_code ec;
    std::string message;
    const auto c = cora::detail::parse_corabin(
        {reinterpret_cast<const std::byte*>(raw.data()), raw.size()}, ec, message);
    if (ec) std::abort();
    for (const char* name : {"empty", "add_f32", "mixed_args", "many_params", "scale_7", "slow",
                             "iota_u32", "trap", "saxpy_rounds"}) {
      aclrtFuncHandle f = nullptr;
      if (aclrtBinaryGetFunction(bin, name, &f) != ACL_SUCCESS) std::abort();
      funcs.push_back(f);
      std::size_t i = 0;
      while (i < c.kernels.size() && c.kernels[i].name != name) ++i;
      if (i == c.kernels.size()) std::abort();
      layouts.push_back(c.kernels[i].params);
    }
    for (int i = 0; i < 4; ++i) {
      void* p = nullptr;
      if (aclrtMalloc(&p, buffer_bytes, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) std::abort();
      buffers.push_back(p);
    }
    empty = funcs[0];
    if (aclrtCreateStream(&stream) != ACL_SUCCESS) std::abort();
  }
};

void require(bool ok) {
  if (!ok) std::abort();
}

std::size_t index_of(const fixture& fx, aclrtFuncHandle f) {
  std::size_t i = 0;
  while (i < fx.funcs.size() && fx.funcs[i] != f) ++i;
  return i;
}

// The value of parameter `p` for a launch: a buffer, or (when the input says so) a wild
// address for a pointer; 16 in every integer width otherwise. Sets `wild_used` for a wild one.
void param_value(const fixture& fx, const cora::backend::param_desc& p, reader& in,
                 std::uint8_t* out, bool& wild_used) {
  std::memset(out, 0, p.size);
  if (!p.pointer) {
    out[0] = 16;
    return;
  }
  const std::uint8_t choice = in.byte();
  std::uintptr_t v;
  if (choice < 32) {
    v = wild[choice % std::size(wild)];
    wild_used = true;
  } else {
    v = reinterpret_cast<std::uintptr_t>(fx.buffers[choice % fx.buffers.size()]);
  }
  std::memcpy(out, &v, sizeof(v));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fixture fx;
  reader in{data, size};
  aclrtArgsHandle args = nullptr;
  aclrtFuncHandle func = nullptr;
  std::vector<aclrtParamHandle> params;
  std::uint8_t scratch[1024] = {};
  bool finalized = false;
  while (!in.empty()) {
    const std::uint8_t op = in.byte() % 11;
    aclError r = ACL_SUCCESS;
    switch (op) {
      case 0:  // Init on one of the kernels
        func = fx.funcs[in.byte() % fx.funcs.size()];
        r = aclrtKernelArgsInit(func, &args);
        params.clear();
        finalized = false;
        if (r == ACL_SUCCESS) require(args != nullptr);
        break;
      case 1: {  // InitByUserMem with a user buffer of a chosen size
        // The memory outlives every list built in it, as the API requires of its caller.
        alignas(64) static std::uint8_t user_mem[(64 << 10) + 4096];
        alignas(64) static std::uint8_t handle_mem[256];
        func = fx.funcs[in.byte() % fx.funcs.size()];
        size_t need = 0, handle = 0;
        if (aclrtKernelArgsGetMemSize(func, in.size(512), &need) != ACL_SUCCESS) break;
        if (aclrtKernelArgsGetHandleMemSize(func, &handle) != ACL_SUCCESS) break;
        require(handle <= sizeof(handle_mem));
        const std::size_t n = std::min(in.size(need + 64), sizeof(user_mem));
        r = aclrtKernelArgsInitByUserMem(func, handle_mem, user_mem, n);
        if (r == ACL_SUCCESS) args = handle_mem;
        params.clear();
        finalized = false;
        break;
      }
      case 2: {  // Append a value of a chosen size
        const std::size_t n = in.size(sizeof(scratch));
        for (std::size_t i = 0; i < n && !in.empty(); ++i) scratch[i] = in.byte();
        aclrtParamHandle ph = nullptr;
        r = aclrtKernelArgsAppend(args, in.byte() & 1 ? scratch : nullptr, n, &ph);
        if (r == ACL_SUCCESS) params.push_back(ph);
        break;
      }
      case 3: {
        aclrtParamHandle ph = nullptr;
        r = aclrtKernelArgsAppendPlaceHolder(args, &ph);
        if (r == ACL_SUCCESS) params.push_back(ph);
        break;
      }
      case 4: {  // Fetch a placeholder buffer and write all of it
        void* buf = nullptr;
        aclrtParamHandle ph = params.empty() ? nullptr : params[in.byte() % params.size()];
        const std::size_t n = in.size(4096);
        r = aclrtKernelArgsGetPlaceHolderBuffer(args, ph, n, &buf);
        if (r == ACL_SUCCESS) {
          require(buf != nullptr || n == 0);
          if (buf) std::memset(buf, 0x5a, n);
        }
        break;
      }
      case 5: {  // Update a parameter
        aclrtParamHandle ph = params.empty() ? nullptr : params[in.byte() % params.size()];
        const std::size_t n = in.size(sizeof(scratch));
        r = aclrtKernelArgsParaUpdate(args, ph, scratch, n);
        break;
      }
      case 6:
        r = aclrtKernelArgsFinalize(args);
        if (r == ACL_SUCCESS) finalized = true;
        break;
      case 7: {  // Launch: parameters first set from the kernel's declared layout
        const std::size_t k = index_of(fx, func);
        if (!finalized || k == fx.funcs.size()) break;
        const auto& layout = fx.layouts[k];
        bool wild_used = false;
        if (!layout.empty()) {
          // Only a list of exactly the kernel's parameters: placeholders stage data of the
          // list's own size, which the kernels (they take an element count) may overrun.
          if (params.size() != layout.size()) break;
          bool updated = true;
          for (std::size_t i = 0; i < layout.size() && updated; ++i) {
            std::uint8_t value[64];
            if (layout[i].size > sizeof(value)) break;
            param_value(fx, layout[i], in, value, wild_used);
            updated = aclrtKernelArgsParaUpdate(args, params[i], value, layout[i].size) ==
                      ACL_SUCCESS;
          }
          if (!updated || aclrtKernelArgsFinalize(args) != ACL_SUCCESS) {
            finalized = false;
            break;
          }
        }
        const std::uint32_t blocks = 1 + in.byte() % 4;
        r = aclrtLaunchKernelWithConfig(func, blocks, fx.stream, nullptr, args, nullptr);
        if (wild_used) require(r != ACL_SUCCESS);
        require(aclrtSynchronizeStream(fx.stream) == ACL_SUCCESS || r != ACL_SUCCESS ||
                func == fx.funcs[7] /* trap */);
        break;
      }
      case 10: {  // A raw host block built from the layout (aclrtLaunchKernelWithHostArgs)
        const std::size_t k = in.byte() % fx.funcs.size();
        std::uint8_t block[2048] = {};
        std::size_t end = 0;
        bool wild_used = false;
        for (const auto& p : fx.layouts[k]) {
          const std::size_t off = cora::detail::next_param_offset(end, p.align);
          param_value(fx, p, in, block + off, wild_used);
          end = off + p.size;
        }
        const std::size_t bytes = (end + 7) / 8 * 8;
        r = aclrtLaunchKernelWithHostArgs(fx.funcs[k], 1 + in.byte() % 4, fx.stream, nullptr,
                                          bytes ? block : nullptr, bytes, nullptr, 0);
        if (wild_used) require(r != ACL_SUCCESS);
        require(aclrtSynchronizeStream(fx.stream) == ACL_SUCCESS || r != ACL_SUCCESS || k == 7);
        break;
      }
      case 8:  // A stale or foreign handle
        r = aclrtKernelArgsFinalize(in.byte() & 1 ? static_cast<aclrtArgsHandle>(scratch)
                                                  : nullptr);
        require(r != ACL_SUCCESS);
        break;
      case 9: {
        size_t count = 0;
        if (func) require(aclrtFunctionGetParamCount(func, &count) == ACL_SUCCESS);
        break;
      }
    }
    (void)r;
  }
  // Leave the stream clean for the next input (a failed launch is reported here).
  (void)aclrtSynchronizeStream(fx.stream);
  return 0;
}
