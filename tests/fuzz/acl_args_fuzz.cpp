// libFuzzer target: the C API's argument-list builder (aclrtKernelArgs*) fed random call
// sequences. Each input is a program of one-byte opcodes with their operands; every call must
// return a code (never crash, leak or touch memory it does not own), and a list the builder
// accepted launches the kernel that has no pointer parameters.
#include <acl/acl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

struct fixture {
  aclrtBinHandle bin = nullptr;
  std::vector<aclrtFuncHandle> funcs;
  aclrtFuncHandle empty = nullptr;  // no parameters: safe to launch whatever was appended
  aclrtStream stream = nullptr;
  fixture() {
    if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) std::abort();
    const char* dir = std::getenv("CORA_TEST_KERNELS_DIR");
    const std::string path =
        std::string(dir && *dir ? dir : CORA_FUZZ_KERNELS_DIR) + "/test_kernels.corabin";
    if (aclrtBinaryLoadFromFile(path.c_str(), nullptr, &bin) != ACL_SUCCESS) std::abort();
    for (const char* name : {"empty", "add_f32", "mixed_args", "many_params", "scale_7", "slow"}) {
      aclrtFuncHandle f = nullptr;
      if (aclrtBinaryGetFunction(bin, name, &f) != ACL_SUCCESS) std::abort();
      funcs.push_back(f);
    }
    empty = funcs[0];
    if (aclrtCreateStream(&stream) != ACL_SUCCESS) std::abort();
  }
};

void require(bool ok) {
  if (!ok) std::abort();
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
    const std::uint8_t op = in.byte() % 10;
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
      case 7:  // Launch, only the parameterless kernel: the others would use random pointers
        if (func == fx.empty && finalized) {
          const std::uint32_t blocks = 1 + in.byte() % 4;
          r = aclrtLaunchKernelWithConfig(func, blocks, fx.stream, nullptr, args, nullptr);
          require(aclrtSynchronizeStream(fx.stream) == ACL_SUCCESS || r != ACL_SUCCESS);
        }
        break;
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
