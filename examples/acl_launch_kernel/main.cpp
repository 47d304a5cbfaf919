// The host program of CANN's sample 0_launch_kernel, written against the CANN-compatible C API
// exactly as a CANN program: an fp16 vector add of 8 blocks x 2048 elements, in "simple" mode
// (three pointer arguments) or "placeholder" mode (two more int32 tiling arguments delivered
// through placeholders). Only the kernels differ: they are cora kernels (kernels/add_custom*.cpp)
// packed as the sample expects them under ./out/fatbin/. Run it through run.sh.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "acl/acl.h"

namespace {

constexpr uint32_t blockDim = 8;
constexpr int32_t deviceId = 0;
constexpr int32_t totalLength = 8 * 2048;
constexpr int32_t tileNum = 8;
constexpr size_t inputSize = totalLength * sizeof(uint16_t);
constexpr size_t outputSize = totalLength * sizeof(uint16_t);

#define CHECK_ERROR(call)                                                                      \
  do {                                                                                         \
    const aclError ret_ = (call);                                                              \
    if (ret_ != ACL_SUCCESS) {                                                                 \
      const char* msg_ = aclGetRecentErrMsg();                                                 \
      std::printf("[ERROR] %s failed, error code %d: %s\n", #call, ret_, msg_ ? msg_ : "");   \
      return -1;                                                                               \
    }                                                                                          \
  } while (0)

bool ReadFile(const std::string& path, void* buffer, size_t size) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) {
    std::printf("[ERROR] cannot open %s\n", path.c_str());
    return false;
  }
  if (static_cast<size_t>(file.tellg()) != size) {
    std::printf("[ERROR] %s holds %lld bytes, expected %zu\n", path.c_str(), static_cast<long long>(file.tellg()),
                size);
    return false;
  }
  file.seekg(0);
  return static_cast<bool>(file.read(static_cast<char*>(buffer), static_cast<std::streamsize>(size)));
}

bool WriteFile(const std::string& path, const void* buffer, size_t size) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  return file && file.write(static_cast<const char*>(buffer), static_cast<std::streamsize>(size));
}

// Everything the sample acquires, released by Cleanup() whatever happened.
struct Resources {
  bool initialized = false;
  bool deviceSet = false;
  aclrtStream stream = nullptr;
  void* xHost = nullptr;
  void* yHost = nullptr;
  void* zHost = nullptr;
  void* xDevice = nullptr;
  void* yDevice = nullptr;
  void* zDevice = nullptr;
  aclrtBinHandle binHandle = nullptr;
};

int Run(const std::string& mode, Resources& r) {
  CHECK_ERROR(aclInit(nullptr));
  r.initialized = true;
  CHECK_ERROR(aclrtSetDevice(deviceId));
  r.deviceSet = true;
  CHECK_ERROR(aclrtCreateStream(&r.stream));

  CHECK_ERROR(aclrtMallocHost(&r.xHost, inputSize));
  CHECK_ERROR(aclrtMallocHost(&r.yHost, inputSize));
  CHECK_ERROR(aclrtMallocHost(&r.zHost, outputSize));
  CHECK_ERROR(aclrtMalloc(&r.xDevice, inputSize, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_ERROR(aclrtMalloc(&r.yDevice, inputSize, ACL_MEM_MALLOC_HUGE_FIRST));
  CHECK_ERROR(aclrtMalloc(&r.zDevice, outputSize, ACL_MEM_MALLOC_HUGE_FIRST));

  if (!ReadFile("./input/input_x.bin", r.xHost, inputSize) || !ReadFile("./input/input_y.bin", r.yHost, inputSize))
    return -1;
  CHECK_ERROR(aclrtMemcpy(r.xDevice, inputSize, r.xHost, inputSize, ACL_MEMCPY_HOST_TO_DEVICE));
  CHECK_ERROR(aclrtMemcpy(r.yDevice, inputSize, r.yHost, inputSize, ACL_MEMCPY_HOST_TO_DEVICE));

  const std::string name = "ascendc_kernels_" + mode;
  const std::string binPath = "./out/fatbin/" + name + "/" + name + ".o";
  CHECK_ERROR(aclrtBinaryLoadFromFile(binPath.c_str(), nullptr, &r.binHandle));
  aclrtFuncHandle funcHandle = nullptr;
  CHECK_ERROR(aclrtBinaryGetFunction(r.binHandle, "add_custom", &funcHandle));

  aclrtArgsHandle argsHandle = nullptr;
  CHECK_ERROR(aclrtKernelArgsInit(funcHandle, &argsHandle));
  aclrtParamHandle paramHandle = nullptr;
  CHECK_ERROR(aclrtKernelArgsAppend(argsHandle, &r.xDevice, sizeof(uintptr_t), &paramHandle));
  CHECK_ERROR(aclrtKernelArgsAppend(argsHandle, &r.yDevice, sizeof(uintptr_t), &paramHandle));
  CHECK_ERROR(aclrtKernelArgsAppend(argsHandle, &r.zDevice, sizeof(uintptr_t), &paramHandle));
  if (mode == "placeholder") {
    // Tiling data travels as placeholders: the runtime copies it to the device at launch.
    aclrtParamHandle lengthHandle = nullptr;
    aclrtParamHandle tileHandle = nullptr;
    CHECK_ERROR(aclrtKernelArgsAppendPlaceHolder(argsHandle, &lengthHandle));
    CHECK_ERROR(aclrtKernelArgsAppendPlaceHolder(argsHandle, &tileHandle));
    void* lengthBuffer = nullptr;
    void* tileBuffer = nullptr;
    CHECK_ERROR(aclrtKernelArgsGetPlaceHolderBuffer(argsHandle, lengthHandle, sizeof(int32_t), &lengthBuffer));
    CHECK_ERROR(aclrtKernelArgsGetPlaceHolderBuffer(argsHandle, tileHandle, sizeof(int32_t), &tileBuffer));
    *static_cast<int32_t*>(lengthBuffer) = totalLength;
    *static_cast<int32_t*>(tileBuffer) = tileNum;
  }
  CHECK_ERROR(aclrtKernelArgsFinalize(argsHandle));

  CHECK_ERROR(aclrtLaunchKernelWithConfig(funcHandle, blockDim, r.stream, nullptr, argsHandle, nullptr));
  CHECK_ERROR(aclrtSynchronizeStream(r.stream));

  CHECK_ERROR(aclrtMemcpy(r.zHost, outputSize, r.zDevice, outputSize, ACL_MEMCPY_DEVICE_TO_HOST));
  if (!WriteFile("./output/output_z.bin", r.zHost, outputSize)) {
    std::printf("[ERROR] cannot write ./output/output_z.bin\n");
    return -1;
  }
  return 0;
}

// Releases in the sample's order; every step runs, and any failure makes the result an error.
int Cleanup(Resources& r) {
  int result = 0;
  auto check = [&result](aclError ret, const char* what) {
    if (ret != ACL_SUCCESS) {
      std::printf("[ERROR] %s failed, error code %d\n", what, ret);
      result = -1;
    }
  };
  if (r.binHandle != nullptr) check(aclrtBinaryUnLoad(r.binHandle), "aclrtBinaryUnLoad");
  for (void* p : {r.zDevice, r.yDevice, r.xDevice})
    if (p != nullptr) check(aclrtFree(p), "aclrtFree");
  for (void* p : {r.zHost, r.yHost, r.xHost})
    if (p != nullptr) check(aclrtFreeHost(p), "aclrtFreeHost");
  if (r.stream != nullptr) check(aclrtDestroyStreamForce(r.stream), "aclrtDestroyStreamForce");
  if (r.deviceSet) check(aclrtResetDeviceForce(deviceId), "aclrtResetDeviceForce");
  if (r.initialized) check(aclFinalize(), "aclFinalize");
  return result;
}

}  // namespace

int main(int argc, char* argv[]) {
  const std::string mode = argc > 1 ? argv[1] : "simple";
  if (mode != "simple" && mode != "placeholder") {
    std::printf("[ERROR] unknown mode '%s': use simple or placeholder\n", mode.c_str());
    return -1;
  }
  std::printf("[INFO] Kernel launch sample runs in %s mode.\n", mode.c_str());
  Resources resources;
  const int ret = Run(mode, resources);
  const int cleanup = Cleanup(resources);
  if (ret != 0 || cleanup != 0) return -1;
  std::printf("[INFO] Run the launch_kernel sample successfully.\n");
  return 0;
}
