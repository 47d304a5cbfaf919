// The C API: binaries, functions, and symbols of mixed-mode launchers.
#include <dlfcn.h>

#include "core/state.hpp"
#include "cora/detail/cpu_kernel_abi.h"
#include "support/acl_c_api.h"
#include "support/acl_fixture.hpp"
#include "test_mixed_kernels.hpp"

namespace cora::test {
namespace {

class acl_binary_test : public acl_test {
 protected:
  // Whether the core has put the binary on the device yet (lazy loads defer it).
  static bool on_device(aclrtBinHandle bin) {
    auto& st = cora::acl::state::get();
    std::lock_guard lock(st.mutex);
    auto& b = st.binaries.at(bin)->bin;
    std::lock_guard block(b.state()->mutex);
    return b.state()->module != nullptr;
  }
};
CORA_ACL_SUITE(acl_binary_test);

TEST_P(acl_binary_test, LoadFromFileAndUnload) {
  aclrtBinHandle bin = nullptr;
  ASSERT_EQ(aclrtBinaryLoadFromFile(kernel_file("test_kernels.corabin").c_str(), nullptr, &bin), ACL_SUCCESS);
  EXPECT_TRUE(on_device(bin));  // not lazy: loaded at once
  EXPECT_EQ(aclrtBinaryUnLoad(bin), ACL_SUCCESS);
  EXPECT_EQ(aclrtBinaryUnLoad(bin), ACL_ERROR_RT_INVALID_HANDLE);  // double unload
  aclrtFuncHandle f = nullptr;
  EXPECT_EQ(aclrtBinaryGetFunction(bin, "add_f32", &f), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtBinaryUnLoad(nullptr), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_binary_test, LoadFromFileMisuse) {
  aclrtBinHandle bin = nullptr;
  EXPECT_EQ(aclrtBinaryLoadFromFile(nullptr, nullptr, &bin), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryLoadFromFile("x.corabin", nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryLoadFromFile("/nonexistent/k.corabin", nullptr, &bin), ACL_ERROR_RT_FILE_OPEN);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("/nonexistent/k.corabin"), std::string::npos);
  // A file that is no kernel binary.
  const auto path = std::filesystem::temp_directory_path() / "cora_acl_not_a_binary.bin";
  {
    std::ofstream f(path, std::ios::binary);
    f << "definitely not a kernel binary";
  }
  EXPECT_EQ(aclrtBinaryLoadFromFile(path.c_str(), nullptr, &bin), ACL_ERROR_RT_PARAM_INVALID);
  std::filesystem::remove(path);
}

TEST_P(acl_binary_test, LoadFromData) {
  const auto bytes = kernel_bytes("test_kernels.corabin");
  ASSERT_FALSE(bytes.empty());
  aclrtBinHandle bin = nullptr;
  EXPECT_EQ(aclrtBinaryLoadFromData(nullptr, bytes.size(), nullptr, &bin), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), 0, nullptr, &bin), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), nullptr, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryLoadFromData("garbage!", 8, nullptr, &bin), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size() / 2, nullptr, &bin), ACL_ERROR_RT_PARAM_INVALID);
  ASSERT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), nullptr, &bin), ACL_SUCCESS);
  // The bytes were copied: the caller's buffer may go.
  auto b = make_add(100);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(function(bin, "add_f32"), 1, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  EXPECT_EQ(aclrtBinaryUnLoad(bin), ACL_SUCCESS);
}

TEST_P(acl_binary_test, LazyLoadIsHonoured) {
  const auto bytes = kernel_bytes("test_kernels.corabin");
  aclrtBinaryLoadOption opt{};
  opt.type = ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD;
  opt.value.isLazyLoad = 1;
  aclrtBinaryLoadOptions opts{&opt, 1};
  aclrtBinHandle bin = nullptr;
  ASSERT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &opts, &bin), ACL_SUCCESS);
  EXPECT_FALSE(on_device(bin));  // deferred...
  aclrtFuncHandle f = function(bin, "add_f32");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(on_device(bin));  // ...to the first lookup, as CANN does
  aclrtBinHandle file_bin = nullptr;
  ASSERT_EQ(aclrtBinaryLoadFromFile(kernel_file("test_kernels.corabin").c_str(), &opts, &file_bin), ACL_SUCCESS);
  EXPECT_FALSE(on_device(file_bin));
  EXPECT_EQ(aclrtBinaryUnLoad(file_bin), ACL_SUCCESS);  // never needed on the device
  opt.value.isLazyLoad = 0;
  ASSERT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &opts, &file_bin), ACL_SUCCESS);
  EXPECT_TRUE(on_device(file_bin));
}

TEST_P(acl_binary_test, LoadOptionsAreChecked) {
  const auto bytes = kernel_bytes("test_kernels.corabin");
  aclrtBinHandle bin = nullptr;
  aclrtBinaryLoadOption opt{};
  aclrtBinaryLoadOptions opts{&opt, 1};
  opt.type = ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD;
  opt.value.isLazyLoad = 2;
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &opts, &bin), ACL_ERROR_INVALID_PARAM);
  opt.type = ACL_RT_BINARY_LOAD_OPT_MAGIC;
  opt.value.magic = 0x12345678;
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &opts, &bin), ACL_ERROR_INVALID_PARAM);
  opt.type = ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE;
  opt.value.cpuKernelMode = 1;
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &opts, &bin), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  acl_c_set_load_option_type(&opt, 42);
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &opts, &bin), ACL_ERROR_INVALID_PARAM);
  aclrtBinaryLoadOptions none{nullptr, 1};
  EXPECT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &none, &bin), ACL_ERROR_INVALID_PARAM);
  // The three ELF magics of Ascend C's generated registration code are accepted.
  opt.type = ACL_RT_BINARY_LOAD_OPT_MAGIC;
  for (uint32_t magic : {ACL_RT_BINARY_MAGIC_ELF_AICORE, ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE,
                         ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE}) {
    opt.value.magic = magic;
    ASSERT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &opts, &bin), ACL_SUCCESS);
    EXPECT_EQ(aclrtBinaryUnLoad(bin), ACL_SUCCESS);
  }
  aclrtBinaryLoadOptions empty{nullptr, 0};
  ASSERT_EQ(aclrtBinaryLoadFromData(bytes.data(), bytes.size(), &empty, &bin), ACL_SUCCESS);
  EXPECT_EQ(aclrtBinaryUnLoad(bin), ACL_SUCCESS);
}

TEST_P(acl_binary_test, FunctionsByNameAndEntry) {
  aclrtBinHandle bin = load();
  aclrtFuncHandle by_name = nullptr, again = nullptr, by_entry = nullptr;
  ASSERT_EQ(aclrtBinaryGetFunction(bin, "scale_7", &by_name), ACL_SUCCESS);
  ASSERT_EQ(aclrtBinaryGetFunction(bin, "scale_7", &again), ACL_SUCCESS);
  EXPECT_EQ(by_name, again);  // one handle per kernel
  ASSERT_EQ(aclrtBinaryGetFunctionByEntry(bin, 7, &by_entry), ACL_SUCCESS);
  EXPECT_EQ(by_entry, by_name);  // entry 7 is the kernel named "..._7"
  char name[32] = {};
  ASSERT_EQ(aclrtGetFunctionName(by_entry, sizeof(name), name), ACL_SUCCESS);
  EXPECT_STREQ(name, "scale_7");
  // It runs: x *= 2.5.
  std::vector<float> x{1, 2, 3, 4};
  void* dx = upload(x);
  float factor = 2.5f;
  uint64_t n = 4;
  void* args[] = {&dx, &factor, &n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(by_entry, 1, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_EQ(download<float>(dx, 4), (std::vector<float>{2.5f, 5.0f, 7.5f, 10.0f}));
}

TEST_P(acl_binary_test, FunctionLookupMisuse) {
  aclrtBinHandle bin = load();
  aclrtFuncHandle f = nullptr;
  EXPECT_EQ(aclrtBinaryGetFunction(nullptr, "add_f32", &f), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryGetFunction(bin, nullptr, &f), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryGetFunction(bin, "add_f32", nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryGetFunction(bin, "no_such_kernel", &f), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("no_such_kernel"), std::string::npos);
  EXPECT_EQ(aclrtBinaryGetFunctionByEntry(bin, 12345, &f), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtBinaryGetFunctionByEntry(nullptr, 7, &f), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryGetFunctionByEntry(bin, 7, nullptr), ACL_ERROR_INVALID_PARAM);
  int not_a_binary = 0;
  EXPECT_EQ(aclrtBinaryGetFunction(&not_a_binary, "add_f32", &f), ACL_ERROR_RT_INVALID_HANDLE);
  f = function(bin, "add_f32");
  char small[4];
  EXPECT_EQ(aclrtGetFunctionName(f, sizeof(small), small), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetFunctionName(f, 32, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetFunctionName(nullptr, 32, small), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetFunctionName(&not_a_binary, 32, small), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_binary_test, ParameterLayout) {
  aclrtFuncHandle add = kernel("add_f32");
  size_t count = 0;
  ASSERT_EQ(aclrtFunctionGetParamCount(add, &count), ACL_SUCCESS);
  EXPECT_EQ(count, 4u);
  for (size_t i = 0; i < 4; ++i) {
    size_t off = 1, size = 0;
    ASSERT_EQ(aclrtFunctionGetParamInfo(add, i, &off, &size), ACL_SUCCESS);
    EXPECT_EQ(off, 8 * i);  // CANN's 8-byte slots
    EXPECT_EQ(size, 8u);
  }
  // mixed_args(uint8_t, uint16_t, pair16, uint32_t, double*): 8-byte slots, the struct whole.
  aclrtFuncHandle mixed = kernel("mixed_args");
  ASSERT_EQ(aclrtFunctionGetParamCount(mixed, &count), ACL_SUCCESS);
  ASSERT_EQ(count, 5u);
  const size_t want_off[] = {0, 8, 16, 32, 40}, want_size[] = {1, 2, 16, 4, 8};
  for (size_t i = 0; i < 5; ++i) {
    size_t off = 0, size = 0;
    ASSERT_EQ(aclrtFunctionGetParamInfo(mixed, i, &off, &size), ACL_SUCCESS);
    EXPECT_EQ(off, want_off[i]) << i;
    EXPECT_EQ(size, want_size[i]) << i;
  }
  size_t off = 0, size = 0;
  EXPECT_EQ(aclrtFunctionGetParamInfo(add, 4, &off, &size), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFunctionGetParamInfo(add, 0, nullptr, &size), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFunctionGetParamCount(nullptr, &count), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFunctionGetParamCount(add, nullptr), ACL_ERROR_INVALID_PARAM);
  int not_a_function = 0;
  EXPECT_EQ(aclrtFunctionGetParamCount(&not_a_function, &count), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_binary_test, UnloadWithLaunchesInFlight) {
  aclrtBinHandle bin = load();
  aclrtFuncHandle slow = function(bin, "slow");
  void* flag = dmalloc(4);
  ASSERT_EQ(aclrtMemset(flag, 4, 0, 4), ACL_SUCCESS);
  uint64_t us = 100000;
  void* args[] = {&us, &flag};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(slow, 1, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtBinaryUnLoad(bin), ACL_SUCCESS);  // the launch keeps the code loaded
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_EQ(download<uint32_t>(flag, 1)[0], 1u);
  // The function died with its binary.
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(slow, 1, nullptr, nullptr, args), ACL_ERROR_RT_INVALID_HANDLE);
  aclrtArgsHandle a = nullptr;
  EXPECT_EQ(aclrtKernelArgsInit(slow, &a), ACL_ERROR_RT_INVALID_HANDLE);
}

// --- mixed mode: launcher symbols --------------------------------------------------------------

// Stand-ins for launchers registered through the C entry point: their addresses are the symbols.
void add_f32_launcher() {}
void scale_launcher() {}
void unknown_launcher() {}

// The binary behind them: registered symbols keep referring to it, so it lives on.
const std::vector<char>& registered_bytes() {
  static const std::vector<char> bytes = kernel_bytes("test_kernels.corabin");
  return bytes;
}

TEST_P(acl_binary_test, SymbolsRegisteredThroughTheCApi) {
  const auto& bytes = registered_bytes();
  const void* add_sym = reinterpret_cast<const void*>(&add_f32_launcher);
  const void* scale_sym = reinterpret_cast<const void*>(&scale_launcher);
  ASSERT_EQ(cora_acl_register_symbol(add_sym, bytes.data(), bytes.size(), "add_f32"), ACL_SUCCESS);
  ASSERT_EQ(cora_acl_register_symbol(scale_sym, bytes.data(), bytes.size(), "scale_7"), ACL_SUCCESS);
  EXPECT_EQ(cora_acl_register_symbol(add_sym, bytes.data(), bytes.size(), "add_f32"), ACL_SUCCESS);  // same again
  EXPECT_EQ(cora_acl_register_symbol(add_sym, bytes.data(), bytes.size(), "scale_7"),
            ACL_ERROR_KERNEL_ALREADY_REGISTERED);
  EXPECT_EQ(cora_acl_register_symbol(nullptr, bytes.data(), bytes.size(), "add_f32"), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(cora_acl_register_symbol(add_sym, bytes.data(), 0, "add_f32"), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(cora_acl_register_symbol(add_sym, bytes.data(), bytes.size(), ""), ACL_ERROR_INVALID_PARAM);

  aclrtFuncHandle f = nullptr, again = nullptr;
  ASSERT_EQ(aclrtGetFuncBySymbol(add_sym, &f), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtGetFuncBySymbol(add_sym, &again), ACL_SUCCESS);
  EXPECT_EQ(f, again);  // one handle per symbol and device
  char name[16];
  ASSERT_EQ(aclrtGetFunctionName(f, sizeof(name), name), ACL_SUCCESS);
  EXPECT_STREQ(name, "add_f32");
  size_t count = 0;
  ASSERT_EQ(aclrtFunctionGetParamCount(scale_sym, &count), ACL_SUCCESS);  // a symbol stands for its function
  EXPECT_EQ(count, 3u);

  // aclrtLaunchKernelWithArgsArray takes the symbol itself.
  auto b = make_add(3000);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(const_cast<void*>(add_sym), 3, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));

  const void* unknown = reinterpret_cast<const void*>(&unknown_launcher);
  EXPECT_EQ(aclrtGetFuncBySymbol(unknown, &f), ACL_ERROR_RT_SYMBOL_NOT_FOUND);
  EXPECT_EQ(aclrtFunctionGetParamCount(unknown, &count), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtLaunchKernelWithArgsArray(const_cast<void*>(unknown), 1, nullptr, nullptr, args),
            ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtGetFuncBySymbol(nullptr, &f), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetFuncBySymbol(add_sym, nullptr), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_binary_test, GeneratedLaunchersAreSymbols) {
  // test_mixed_kernels is built into this program by cora_add_kernel_library; its launchers
  // registered themselves with the core.
  const void* axpy = reinterpret_cast<const void*>(&test_mixed_kernels::axpy);
  aclrtFuncHandle f = nullptr;
  ASSERT_EQ(aclrtGetFuncBySymbol(axpy, &f), ACL_SUCCESS) << aclGetRecentErrMsg();
  char name[16];
  ASSERT_EQ(aclrtGetFunctionName(f, sizeof(name), name), ACL_SUCCESS);
  EXPECT_STREQ(name, "axpy");
  size_t count = 0;
  ASSERT_EQ(aclrtFunctionGetParamCount(axpy, &count), ACL_SUCCESS);
  EXPECT_EQ(count, 4u);

  const uint64_t n = 1000;
  std::vector<float> x(n), y(n, 1.0f);
  for (uint64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  void* dx = upload(x);
  void* dy = upload(y);
  float a = 2.0f;
  void* args[] = {&a, &dx, &dy, const_cast<uint64_t*>(&n)};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(const_cast<void*>(axpy), 4, nullptr, nullptr, args), ACL_SUCCESS);
  // The handle works with an argument list too: y = 2x + (2x + 1).
  aclrtArgsHandle list = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(f, &list), ACL_SUCCESS);
  aclrtParamHandle ph = nullptr;
  ASSERT_EQ(aclrtKernelArgsAppend(list, &a, sizeof(a), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(list, &dx, sizeof(dx), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(list, &dy, sizeof(dy), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(list, const_cast<uint64_t*>(&n), sizeof(n), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsFinalize(list), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithConfig(f, 4, nullptr, nullptr, list, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  const auto out = download<float>(dy, n);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 4.0f * static_cast<float>(i) + 1.0f) << i;
}

TEST_P(acl_binary_test, SymbolHandlesDieWithTheirDevice) {
  const auto& bytes = registered_bytes();
  const void* sym = reinterpret_cast<const void*>(&add_f32_launcher);
  ASSERT_EQ(cora_acl_register_symbol(sym, bytes.data(), bytes.size(), "add_f32"), ACL_SUCCESS);
  aclrtFuncHandle f = nullptr;
  ASSERT_EQ(aclrtGetFuncBySymbol(sym, &f), ACL_SUCCESS);
  ASSERT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
  size_t count = 0;
  EXPECT_EQ(aclrtFunctionGetParamCount(f, &count), ACL_ERROR_RT_INVALID_HANDLE);  // the old handle died
  auto b = make_add(64);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(const_cast<void*>(sym), 1, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
}

TEST_P(acl_binary_test, BinaryObjectsAndFunctionQueries) {
  const auto bytes = kernel_bytes("test_kernels.corabin");
  EXPECT_EQ(aclrtCreateBinary(nullptr, 10), nullptr);
  EXPECT_EQ(aclrtCreateBinary(bytes.data(), 0), nullptr);
  aclrtBinary blob = aclrtCreateBinary(bytes.data(), bytes.size());
  ASSERT_NE(blob, nullptr);
  aclrtBinHandle bin = nullptr;
  ASSERT_EQ(aclrtBinaryLoad(blob, &bin), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtDestroyBinary(blob), ACL_SUCCESS);  // the loaded binary does not need it
  EXPECT_EQ(aclrtDestroyBinary(blob), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtBinaryLoad(blob, &bin), ACL_ERROR_RT_INVALID_HANDLE);
  aclrtFuncHandle f = function(bin, "add_f32");
  aclrtBinHandle owner = nullptr;
  ASSERT_EQ(aclrtFunctionGetBinary(f, &owner), ACL_SUCCESS);
  EXPECT_EQ(owner, bin);
  int64_t v = -1;
  ASSERT_EQ(aclrtGetFunctionAttribute(f, ACL_FUNC_ATTR_KERNEL_TYPE, &v), ACL_SUCCESS);
  EXPECT_EQ(v, 0);
  EXPECT_EQ(aclrtGetFunctionAttribute(f, static_cast<aclrtFuncAttribute>(0), &v), ACL_ERROR_INVALID_PARAM);
  void *aic = nullptr, *aiv = reinterpret_cast<void*>(1);
  if (cuda()) {
    EXPECT_EQ(aclrtGetFunctionAddr(f, &aic, &aiv), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT_NE(std::string(aclGetRecentErrMsg()).find("code address"), std::string::npos);
  } else {
    // The CPU device: the kernel's entry function in the loaded image.
    ASSERT_EQ(aclrtGetFunctionAddr(f, &aic, &aiv), ACL_SUCCESS) << aclGetRecentErrMsg();
    Dl_info info{};
    ASSERT_NE(dladdr(aic, &info), 0);
    ASSERT_NE(info.dli_sname, nullptr);
    EXPECT_EQ(std::string(info.dli_sname), std::string(CORA_KERNEL_ENTRY_PREFIX) + "add_f32");
    EXPECT_EQ(aiv, nullptr);
  }
  EXPECT_EQ(aclrtGetFunctionAddr(f, nullptr, &aiv), ACL_ERROR_INVALID_PARAM);
  void* addr = nullptr;
  size_t size = 0;
  EXPECT_EQ(aclrtBinaryGetDevAddress(bin, &addr, &size), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_NE(aclGetRecentErrMsg(), nullptr);
  EXPECT_EQ(aclrtBinaryGetGlobal(bin, "x", &addr, &size), ACL_ERROR_RT_PARAM_INVALID);  // no such global
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("'x'"), std::string::npos);
  // The function works: launch it.
  auto b = make_add(256);
  void* args[] = {&b.x, &b.y, &b.z, &b.n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(f, 2, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  ASSERT_EQ(aclrtBinaryUnLoad(bin), ACL_SUCCESS);
  EXPECT_EQ(aclrtFunctionGetBinary(f, &owner), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_binary_test, GlobalsOfTheKernelsCode) {
  aclrtBinHandle bin = nullptr;
  ASSERT_EQ(aclrtBinaryLoadFromFile(kernel_file("test_kernels.corabin").c_str(), nullptr, &bin), ACL_SUCCESS);
  void* counter = nullptr;
  size_t size = 0;
  ASSERT_EQ(aclrtBinaryGetGlobal(bin, "cora_test_counter", &counter, &size), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(size, sizeof(uint32_t));
  uint32_t v = 0;
  ASSERT_EQ(aclrtMemcpy(&v, 4, counter, 4, ACL_MEMCPY_DEFAULT), ACL_SUCCESS) << aclGetRecentErrMsg();
  EXPECT_EQ(v, 7u);  // its initializer
  v = 100;
  ASSERT_EQ(aclrtMemcpy(counter, 4, &v, 4, ACL_MEMCPY_DEFAULT), ACL_SUCCESS) << aclGetRecentErrMsg();
  uint32_t n = 5;
  void* args[] = {&n};
  ASSERT_EQ(aclrtLaunchKernelWithArgsArray(function(bin, "bump_global"), 1, nullptr, nullptr, args), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpy(&v, 4, counter, 4, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
  EXPECT_EQ(v, 105u);  // the kernel saw the host's write, the host sees the kernel's
  EXPECT_EQ(aclrtBinaryGetGlobal(bin, nullptr, &counter, &size), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryGetGlobal(bin, "cora_test_counter", nullptr, &size), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtBinaryGetGlobal(bin, "bump_global", &counter, &size), ACL_ERROR_RT_PARAM_INVALID);  // a kernel, not a global
  ASSERT_EQ(aclrtBinaryUnLoad(bin), ACL_SUCCESS);
  EXPECT_EQ(aclrtBinaryGetGlobal(bin, "cora_test_counter", &counter, &size), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_binary_test, RefusedFunctionsSayWhy) {
  // A function cora cannot offer links, refuses with CANN's "not supported" code, and says why.
  aclrtNotify n = nullptr;
  EXPECT_EQ(aclrtCreateNotify(&n, 0), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  const char* msg = aclGetRecentErrMsg();
  ASSERT_NE(msg, nullptr);
  EXPECT_NE(std::string(msg).find("aclrtCreateNotify"), std::string::npos) << msg;
  EXPECT_NE(std::string(msg).find("not supported"), std::string::npos) << msg;
  EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtAllocatorCreateDesc(), nullptr);
}

}  // namespace
}  // namespace cora::test
