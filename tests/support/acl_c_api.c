/* Compiled as C: the C API's headers must be valid C, and C code may pass any int where an
 * enum is expected. */
#include "support/acl_c_api.h"

#include <acl/cora_acl.h>

aclError acl_c_malloc(void** devPtr, size_t size, int policy) {
  return aclrtMalloc(devPtr, size, (aclrtMemMallocPolicy)policy);
}

aclError acl_c_memcpy(void* dst, size_t destMax, const void* src, size_t count, int kind) {
  return aclrtMemcpy(dst, destMax, src, count, (aclrtMemcpyKind)kind);
}

aclError acl_c_memcpy_async(void* dst, size_t destMax, const void* src, size_t count, int kind, aclrtStream stream) {
  return aclrtMemcpyAsync(dst, destMax, src, count, (aclrtMemcpyKind)kind, stream);
}

aclError acl_c_launch_callback(aclrtCallback fn, void* userData, int blockType, aclrtStream stream) {
  return aclrtLaunchCallback(fn, userData, (aclrtCallbackBlockType)blockType, stream);
}

void acl_c_set_load_option_type(aclrtBinaryLoadOption* option, int type) {
  option->type = (aclrtBinaryLoadOptionType)type;
}

void acl_c_set_attr_id(aclrtLaunchKernelAttr* attr, int id) { attr->id = (aclrtLaunchKernelAttrId)id; }

void acl_c_set_engine_type(aclrtLaunchKernelAttr* attr, int engine) {
  attr->value.engineType = (aclrtEngineType)engine;
}

void acl_c_set_location_type(aclrtMemLocation* loc, int type) { loc->type = (aclrtMemLocationType)type; }

aclError acl_c_set_stream_config_opt(aclrtStreamConfigHandle* handle, int attr, const void* value, size_t size) {
  return aclrtSetStreamConfigOpt(handle, (aclrtStreamConfigAttr)attr, value, size);
}

aclError acl_c_set_sys_param_opt(int opt, int64_t value) { return aclrtSetSysParamOpt((aclSysParamOpt)opt, value); }

aclError acl_c_memcpy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                        int kind) {
  return aclrtMemcpy2d(dst, dpitch, src, spitch, width, height, (aclrtMemcpyKind)kind);
}

aclError acl_c_get_device_res_limit(int32_t deviceId, int type, uint32_t* value) {
  return aclrtGetDeviceResLimit(deviceId, (aclrtDevResLimitType)type, value);
}
