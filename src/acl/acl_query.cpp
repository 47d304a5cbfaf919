// Device and system queries, data types, and the base API's small helpers. The answers describe
// the real device (a CPU device or a GPU) in CANN's types.
#include <cora/half.hpp>

#include <cstdarg>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <strings.h>
#include <cctype>
#include <string>

#include "acl/acl_state.hpp"

#ifndef CORA_VERSION
#define CORA_VERSION "0.0.0"
#endif

/// CANN's data buffer: an address and a size (aclCreateDataBuffer).
struct aclDataBuffer {
  void* data;
  size_t size;
};

using namespace cora::acl;

namespace {

aclError device_of(const char* api, std::int64_t deviceId, cora::device*& out) {
  auto& st = state::get();
  std::lock_guard lock(st.mutex);
  if (aclError e = check_device_locked(st, api, deviceId)) return e;
  out = &st.runtime->device(static_cast<std::size_t>(deviceId));
  return ACL_SUCCESS;
}

// cora's version as CANN's packages report theirs: "major.minor.patch", and the number
// major * 10000000 + minor * 100000 + patch * 1000 (CANN's encoding).
constexpr const char* version_string = CORA_VERSION;

aclError check_pkg(const char* api, const char* pkgName) {
  CORA_ACL_REQUIRE(pkgName, "pkgName is NULL");
  // Every package name of a CANN toolkit stands for cora itself: runtime, compiler, toolkit...
  static const char* const known[] = {"cann", "runtime", "compiler", "hccl", "toolkit", "opp", "opp_kernel", "driver"};
  for (const char* k : known)
    if (std::strcmp(pkgName, k) == 0) return ACL_SUCCESS;
  return fail(ACL_ERROR_INVALID_PARAM, api, std::string("unknown package name '") + pkgName + "'");
}

std::int32_t version_number() {
  int major = 0, minor = 0, patch = 0;
  std::sscanf(version_string, "%d.%d.%d", &major, &minor, &patch);
  return major * 10000000 + minor * 100000 + patch * 1000;
}

const aclCannAttr supported_attrs[] = {ACL_CANN_ATTR_INF_NAN, ACL_CANN_ATTR_BF16};

}  // namespace

extern "C" {

aclError aclFinalizeReference(uint64_t* refCount) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    {
      auto& st = state::get();
      std::lock_guard lock(st.mutex);
      if (!st.runtime) return fail(ACL_ERROR_REPEAT_FINALIZE, api, "not initialized, or already finalized");
      if (st.init_count > 1) {
        // One aclInit reference fewer; resources stay until the last one.
        --st.init_count;
        if (refCount) *refCount = st.init_count;
        return ACL_SUCCESS;
      }
    }
    if (refCount) *refCount = 0;
    return aclFinalize();
  });
}

aclError aclsysGetVersionStr(char* pkgName, char* versionStr) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_pkg(api, pkgName)) return e;
    CORA_ACL_REQUIRE(versionStr, "versionStr is NULL");
    // CANN's buffer is ACL_PKG_VERSION_MAX_SIZE bytes.
    std::snprintf(versionStr, ACL_PKG_VERSION_MAX_SIZE, "%s", version_string);
    return ACL_SUCCESS;
  });
}

aclError aclsysGetVersionNum(char* pkgName, int32_t* versionNum) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    if (aclError e = check_pkg(api, pkgName)) return e;
    CORA_ACL_REQUIRE(versionNum, "versionNum is NULL");
    *versionNum = version_number();
    return ACL_SUCCESS;
  });
}

aclError aclsysGetCANNVersion(aclCANNPackageName name, aclCANNPackageVersion* version) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    const auto n = enum_value(name);
    CORA_ACL_REQUIRE(n >= ACL_PKG_NAME_CANN && n <= ACL_PKG_NAME_DRIVER, "name is not an aclCANNPackageName");
    CORA_ACL_REQUIRE(version, "version is NULL");
    *version = aclCANNPackageVersion{};
    int major = 0, minor = 0, patch = 0;
    std::sscanf(version_string, "%d.%d.%d", &major, &minor, &patch);
    std::snprintf(version->version, sizeof version->version, "%s", version_string);
    std::snprintf(version->majorVersion, sizeof version->majorVersion, "%d", major);
    std::snprintf(version->minorVersion, sizeof version->minorVersion, "%d", minor);
    std::snprintf(version->releaseVersion, sizeof version->releaseVersion, "%d", patch);
    std::snprintf(version->patchVersion, sizeof version->patchVersion, "0");
    return ACL_SUCCESS;
  });
}

aclError aclrtGetVersion(int32_t* majorVersion, int32_t* minorVersion, int32_t* patchVersion) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(majorVersion && minorVersion && patchVersion, "a version pointer is NULL");
  // The version of the acl API cora implements.
  *majorVersion = ACL_MAJOR_VERSION;
  *minorVersion = ACL_MINOR_VERSION;
  *patchVersion = ACL_PATCH_VERSION;
  return ACL_SUCCESS;
}

aclError aclrtGetRunMode(aclrtRunMode* runMode) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(runMode, "runMode is NULL");
  *runMode = ACL_HOST;  // the program runs on the host, beside its devices
  return ACL_SUCCESS;
}

const char* aclrtGetSocName() {
  // The name of the calling thread's device (the first device without one): "CPU device (...)",
  // or the GPU's name.
  static thread_local std::string name;
  try {
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (!st.runtime || st.runtime->device_count() == 0) {
      (void)fail(ACL_ERROR_UNINITIALIZE, __func__, "aclInit has not been called");
      return nullptr;
    }
    std::size_t index = 0;
    if (!peek_current_device_locked(st, index)) index = 0;
    name = st.runtime->device(index).name();
    return name.c_str();
  } catch (...) {
    return nullptr;
  }
}

aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(value, "value is NULL");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    const auto& p = dev->properties();
    const bool cpu = p.backend == cora::backend_kind::cpu;
    switch (enum_value(attr)) {
      case ACL_DEV_ATTR_AICPU_CORE_NUM: *value = 0; break;  // no separate AI CPU
      case ACL_DEV_ATTR_AICORE_CORE_NUM:
      case ACL_DEV_ATTR_VECTOR_CORE_NUM: *value = p.compute_units; break;  // SMs, or worker threads
      case ACL_DEV_ATTR_CUBE_CORE_NUM: *value = 0; break;
      case ACL_DEV_ATTR_WARP_SIZE: *value = cpu ? 1 : 32; break;
      case ACL_DEV_ATTR_MAX_THREAD_PER_VECTOR_CORE:
      case ACL_DEV_ATTR_MAX_THREADS_PER_BLOCK: *value = p.max_threads_per_block; break;
      case ACL_DEV_ATTR_UBUF_PER_VECTOR_CORE: *value = p.max_shared_bytes; break;
      case ACL_DEV_ATTR_MAX_GRID_DIM_X: *value = p.max_grid.x; break;
      case ACL_DEV_ATTR_MAX_GRID_DIM_Y: *value = p.max_grid.y; break;
      case ACL_DEV_ATTR_MAX_GRID_DIM_Z: *value = p.max_grid.z; break;
      case ACL_DEV_ATTR_MAX_BLOCK_PER_GRID:
        *value = static_cast<int64_t>(p.max_grid.x) * p.max_grid.y * p.max_grid.z;
        break;
      case ACL_DEV_ATTR_MAX_BLOCK_DIM_X: *value = p.max_block.x; break;
      case ACL_DEV_ATTR_MAX_BLOCK_DIM_Y: *value = p.max_block.y; break;
      case ACL_DEV_ATTR_MAX_BLOCK_DIM_Z: *value = p.max_block.z; break;
      case ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE: *value = static_cast<int64_t>(p.total_memory); break;
      case ACL_DEV_ATTR_IS_VIRTUAL: *value = 0; break;
      case ACL_DEV_ATTR_L2_CACHE_SIZE:
      case ACL_DEV_ATTR_SMP_ID:
      case ACL_DEV_ATTR_PHY_CHIP_ID:
      case ACL_DEV_ATTR_SUPER_POD_DEVICE_ID:
      case ACL_DEV_ATTR_SUPER_POD_SERVER_ID:
      case ACL_DEV_ATTR_SUPER_POD_ID:
      case ACL_DEV_ATTR_CUST_OP_PRIVILEGE:
      case ACL_DEV_ATTR_MAINBOARD_ID:
      case ACL_DEV_ATTR_HD_CONNECT_TYPE:
      case ACL_DEV_ATTR_DEVICE_FORM_FACTOR:
      case ACL_DEV_ATTR_NPU_ARCH:
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                    "attribute " + std::to_string(enum_value(attr)) + " describes Ascend hardware cora does not model");
      default:
        return fail(ACL_ERROR_INVALID_PARAM, api, "attr " + std::to_string(enum_value(attr)) + " is not an aclrtDevAttr");
    }
    return ACL_SUCCESS;
  });
}

aclError aclGetDeviceCapability(uint32_t deviceId, aclDeviceInfo deviceInfo, int64_t* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(value, "value is NULL");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    switch (enum_value(deviceInfo)) {
      case ACL_DEVICE_INFO_AI_CORE_NUM:
      case ACL_DEVICE_INFO_VECTOR_CORE_NUM: *value = dev->properties().compute_units; return ACL_SUCCESS;
      case ACL_DEVICE_INFO_L2_SIZE:
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "the L2 size is not known to cora");
      default: return fail(ACL_ERROR_INVALID_PARAM, api, "deviceInfo is not an aclDeviceInfo");
    }
  });
}

aclError aclrtGetDeviceCapability(int32_t deviceId, aclrtDevFeatureType devFeatureType, int32_t* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(value, "value is NULL");
    const auto f = enum_value(devFeatureType);
    CORA_ACL_REQUIRE(f == ACL_FEATURE_TSCPU_TASK_UPDATE_SUPPORT_AIC_AIV || f == ACL_FEATURE_SYSTEM_MEMQ_EVENT_CROSS_DEV,
                     "devFeatureType is not an aclrtDevFeatureType");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    *value = ACL_DEV_FEATURE_NOT_SUPPORT;  // both are Ascend task-scheduler features
    return ACL_SUCCESS;
  });
}

aclError aclrtQueryDeviceStatus(int32_t deviceId, aclrtDeviceStatus* deviceStatus) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(deviceStatus, "deviceStatus is NULL");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    // A device that lost its context (a GPU after a fault) fails new work with device_lost.
    auto s = dev->make_stream();
    std::error_code ec;
    s.synchronize().wait(ec);
    *deviceStatus = ec == cora::errc::device_lost ? ACL_RT_DEVICE_STATUS_ABNORMAL : ACL_RT_DEVICE_STATUS_NORMAL;
    return ACL_SUCCESS;
  });
}

aclError aclrtGetDeviceUtilizationRate(int32_t deviceId, aclrtUtilizationInfo* utilizationInfo) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(utilizationInfo, "utilizationInfo is NULL");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    // Memory use is known; the compute units' load is not measured: -1, as CANN reports a
    // figure it cannot obtain.
    const auto total = dev->properties().total_memory;
    utilizationInfo->cubeUtilization = -1;
    utilizationInfo->vectorUtilization = -1;
    utilizationInfo->aicpuUtilization = -1;
    utilizationInfo->memoryUtilization =
        total ? static_cast<int32_t>(100.0 * static_cast<double>(dev->memory_in_use()) / static_cast<double>(total))
              : 0;
    utilizationInfo->utilizationExtend = nullptr;
    return ACL_SUCCESS;
  });
}

aclError aclrtDeviceCanAccessPeer(int32_t* canAccessPeer, int32_t deviceId, int32_t peerDeviceId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(canAccessPeer, "canAccessPeer is NULL");
    cora::device *a = nullptr, *b = nullptr;
    if (aclError e = device_of(api, deviceId, a)) return e;
    if (aclError e = device_of(api, peerDeviceId, b)) return e;
    CORA_ACL_REQUIRE(deviceId != peerDeviceId, "deviceId and peerDeviceId are the same device");
    // CPU devices share the host's memory; kernels of one cannot be handed another's pointers
    // by cora's checks, and GPUs need the driver's peer mappings, which cora does not make.
    *canAccessPeer = 0;
    return ACL_SUCCESS;
  });
}

aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(flags == 0, "flags is reserved and must be 0");
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    cora::device* peer = nullptr;
    if (aclError e = device_of(api, peerDeviceId, peer)) return e;
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                "peer access is not supported (aclrtDeviceCanAccessPeer answers 0); copies between devices work");
  });
}

aclError aclrtDeviceDisablePeerAccess(int32_t peerDeviceId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    context ctx;
    if (aclError e = current(api, ctx)) return e;
    cora::device* peer = nullptr;
    if (aclError e = device_of(api, peerDeviceId, peer)) return e;
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "peer access is not supported, so never enabled");
  });
}

aclError aclrtDevicePeerAccessStatus(int32_t deviceId, int32_t peerDeviceId, int32_t* status) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(status, "status is NULL");
    cora::device *a = nullptr, *b = nullptr;
    if (aclError e = device_of(api, deviceId, a)) return e;
    if (aclError e = device_of(api, peerDeviceId, b)) return e;
    *status = 0;  // never enabled
    return ACL_SUCCESS;
  });
}

aclError aclrtGetDeviceResLimit(int32_t deviceId, aclrtDevResLimitType type, uint32_t* value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(value, "value is NULL");
    const auto t = enum_value(type);
    CORA_ACL_REQUIRE(t == ACL_RT_DEV_RES_CUBE_CORE || t == ACL_RT_DEV_RES_VECTOR_CORE,
                     "type is not an aclrtDevResLimitType");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    // All of the device's compute units are available; it has no cube cores.
    *value = t == ACL_RT_DEV_RES_VECTOR_CORE ? dev->properties().compute_units : 0;
    return ACL_SUCCESS;
  });
}

aclError aclrtSetDeviceResLimit(int32_t deviceId, aclrtDevResLimitType type, uint32_t value) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    const auto t = enum_value(type);
    CORA_ACL_REQUIRE(t == ACL_RT_DEV_RES_CUBE_CORE || t == ACL_RT_DEV_RES_VECTOR_CORE,
                     "type is not an aclrtDevResLimitType");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    (void)value;
    return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "limiting the compute units a device uses is not supported");
  });
}

aclError aclrtResetDeviceResLimit(int32_t deviceId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    return ACL_SUCCESS;  // no limit can be set, so the device is at its defaults
  });
}

// --- base API ---------------------------------------------------------------------------------

aclError aclGetCannAttributeList(const aclCannAttr** cannAttrList, size_t* num) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(cannAttrList && num, "cannAttrList or num is NULL");
  *cannAttrList = supported_attrs;
  *num = sizeof(supported_attrs) / sizeof(supported_attrs[0]);
  return ACL_SUCCESS;
}

aclError aclGetCannAttribute(aclCannAttr cannAttr, int32_t* value) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(value, "value is NULL");
  switch (enum_value(cannAttr)) {
    case ACL_CANN_ATTR_INF_NAN: *value = 1; return ACL_SUCCESS;  // IEEE arithmetic: inf and NaN propagate
    case ACL_CANN_ATTR_BF16: *value = 1; return ACL_SUCCESS;     // kernels are C++: bfloat16 is available
    case ACL_CANN_ATTR_JIT_COMPILE: *value = 0; return ACL_SUCCESS;  // kernels are compiled ahead of time
    default: return fail(ACL_ERROR_INVALID_PARAM, api, "cannAttr is not an aclCannAttr");
  }
}

size_t aclDataTypeSize(aclDataType dataType) {
  switch (enum_value(dataType)) {
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 4;
    case ACL_FLOAT16: case ACL_INT16: case ACL_UINT16: case ACL_BF16: return 2;
    case ACL_INT8: case ACL_UINT8: case ACL_BOOL: case ACL_HIFLOAT8: case ACL_FLOAT8_E5M2:
    case ACL_FLOAT8_E4M3FN: case ACL_FLOAT8_E8M0: return 1;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64: return 8;
    case ACL_COMPLEX128: return 16;
    case ACL_COMPLEX32: return 4;
    // Types narrower than a byte, strings and undefined types have no element size: 0, as CANN.
    default: return 0;
  }
}

float aclFloat16ToFloat(aclFloat16 value) { return cora::detail::half_bits_to_float(value); }

aclFloat16 aclFloatToFloat16(float value) { return cora::detail::float_to_half_bits(value); }

aclDataBuffer* aclCreateDataBuffer(void* data, size_t size) {
  try {
    if (!data && size != 0) {
      (void)fail(ACL_ERROR_INVALID_PARAM, __func__, "data is NULL but size is not 0");
      return nullptr;
    }
    return new aclDataBuffer{data, size};
  } catch (...) {
    (void)fail(ACL_ERROR_BAD_ALLOC, __func__, "out of host memory");
    return nullptr;
  }
}

aclError aclDestroyDataBuffer(const aclDataBuffer* dataBuffer) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(dataBuffer, "dataBuffer is NULL");
  delete dataBuffer;
  return ACL_SUCCESS;
}

aclError aclUpdateDataBuffer(aclDataBuffer* dataBuffer, void* data, size_t size) {
  const char* const api = __func__;
  CORA_ACL_REQUIRE(dataBuffer, "dataBuffer is NULL");
  CORA_ACL_REQUIRE(data || size == 0, "data is NULL but size is not 0");
  dataBuffer->data = data;
  dataBuffer->size = size;
  return ACL_SUCCESS;
}

void* aclGetDataBufferAddr(const aclDataBuffer* dataBuffer) { return dataBuffer ? dataBuffer->data : nullptr; }

uint32_t aclGetDataBufferSize(const aclDataBuffer* dataBuffer) {
  return dataBuffer ? static_cast<uint32_t>(dataBuffer->size) : 0;
}

size_t aclGetDataBufferSizeV2(const aclDataBuffer* dataBuffer) { return dataBuffer ? dataBuffer->size : 0; }

void aclAppLog(aclLogLevel logLevel, const char* func, const char* file, uint32_t line, const char* fmt, ...) {
  // Messages at ASCEND_GLOBAL_LOG_LEVEL or above (CANN's variable; default ERROR) go to stderr.
  static const int threshold = [] {
    const char* v = std::getenv("ASCEND_GLOBAL_LOG_LEVEL");
    return v ? std::atoi(v) : ACL_ERROR;
  }();
  if (static_cast<int>(enum_value(logLevel)) < threshold || !fmt) return;
  static const char* const names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  const auto l = enum_value(logLevel);
  std::fprintf(stderr, "[%s] %s:%u %s: ", l >= 0 && l <= 3 ? names[l] : "LOG", file ? file : "?", line,
               func ? func : "?");
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

// --- device identifiers -------------------------------------------------------------------------

aclError aclrtDeviceGetUuid(int32_t deviceId, aclrtUuid* uuid) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(uuid, "uuid is NULL");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    // The driver's UUID, as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": its 32 hex digits.
    std::string hex;
    for (char c : dev->properties().uuid)
      if (std::isxdigit(static_cast<unsigned char>(c)) && c != '\0') hex += c;
    if (dev->properties().uuid.rfind("GPU-", 0) != 0 || hex.size() != 32)
      return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "the device has no UUID (the CPU device has none)");
    for (int i = 0; i < 16; ++i)
      uuid->bytes[i] = static_cast<char>(std::stoi(hex.substr(static_cast<std::size_t>(2 * i), 2), nullptr, 16));
    return ACL_SUCCESS;
  });
}

aclError aclrtDeviceGetPCIBusId(int32_t deviceId, char* pciBusId, int32_t len) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(pciBusId && len > 0, "pciBusId is NULL or len is not positive");
    cora::device* dev = nullptr;
    if (aclError e = device_of(api, deviceId, dev)) return e;
    const std::string& id = dev->properties().pci_bus_id;
    if (id.empty()) return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "the device is on no PCI bus (the CPU device)");
    CORA_ACL_REQUIRE(id.size() < static_cast<std::size_t>(len),
                     "len (" + std::to_string(len) + ") cannot hold the bus id and its terminator");
    std::memcpy(pciBusId, id.c_str(), id.size() + 1);
    return ACL_SUCCESS;
  });
}

aclError aclrtDeviceGetByPCIBusId(const char* pciBusId, int32_t* deviceId) {
  const char* const api = __func__;
  return guarded(api, [&]() -> aclError {
    CORA_ACL_REQUIRE(pciBusId && deviceId, "pciBusId or deviceId is NULL");
    auto& st = state::get();
    std::lock_guard lock(st.mutex);
    if (aclError e = require_init_locked(st, api)) return e;
    for (std::size_t i = 0; i < st.runtime->device_count(); ++i) {
      const std::string& id = st.runtime->device(i).properties().pci_bus_id;
      if (!id.empty() && strcasecmp(id.c_str(), pciBusId) == 0) {
        *deviceId = static_cast<int32_t>(i);
        return ACL_SUCCESS;
      }
    }
    return fail(ACL_ERROR_RT_INVALID_DEVICEID, api, std::string("no device on PCI bus '") + pciBusId + "'");
  });
}

}  // extern "C"

// Logical, user and physical device ids are one id on cora: no device is hidden or remapped.
namespace {
aclError same_id(const char* api, int32_t in, int32_t* out) {
  CORA_ACL_REQUIRE(out, "the output id is NULL");
  cora::device* dev = nullptr;
  if (aclError e = device_of(api, in, dev)) return e;
  *out = in;
  return ACL_SUCCESS;
}
}  // namespace

extern "C" {

aclError aclrtGetLogicDevIdByUserDevId(const int32_t userDevid, int32_t* const logicDevId) {
  return guarded(__func__, [&] { return same_id(__func__, userDevid, logicDevId); });
}
aclError aclrtGetUserDevIdByLogicDevId(const int32_t logicDevId, int32_t* const userDevid) {
  return guarded(__func__, [&] { return same_id(__func__, logicDevId, userDevid); });
}
aclError aclrtGetLogicDevIdByPhyDevId(const int32_t phyDevId, int32_t* const logicDevId) {
  return guarded(__func__, [&] { return same_id(__func__, phyDevId, logicDevId); });
}
aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logicDevId, int32_t* const phyDevId) {
  return guarded(__func__, [&] { return same_id(__func__, logicDevId, phyDevId); });
}
aclError aclrtGetUserDevIdByPhyDevId(const int32_t phyDevId, int32_t* const userDevId) {
  return guarded(__func__, [&] { return same_id(__func__, phyDevId, userDevId); });
}
aclError aclrtGetPhyDevIdByUserDevId(const int32_t userDevId, int32_t* const phyDevId) {
  return guarded(__func__, [&] { return same_id(__func__, userDevId, phyDevId); });
}

}  // extern "C"
