/* Calls of the C API made from C (tests/support/acl_c_api.c), where an enum parameter may
 * carry any int: the C++ tests reach out-of-range enum values only through these. */
#ifndef CORA_TESTS_SUPPORT_ACL_C_API_H_
#define CORA_TESTS_SUPPORT_ACL_C_API_H_

#include <acl/acl.h>

#ifdef __cplusplus
extern "C" {
#endif

aclError acl_c_malloc(void** devPtr, size_t size, int policy);
aclError acl_c_memcpy(void* dst, size_t destMax, const void* src, size_t count, int kind);
aclError acl_c_memcpy_async(void* dst, size_t destMax, const void* src, size_t count, int kind, aclrtStream stream);
aclError acl_c_launch_callback(aclrtCallback fn, void* userData, int blockType, aclrtStream stream);
void acl_c_set_load_option_type(aclrtBinaryLoadOption* option, int type);
void acl_c_set_attr_id(aclrtLaunchKernelAttr* attr, int id);
void acl_c_set_engine_type(aclrtLaunchKernelAttr* attr, int engine);
void acl_c_set_location_type(aclrtMemLocation* loc, int type);
aclError acl_c_set_stream_config_opt(aclrtStreamConfigHandle* handle, int attr, const void* value, size_t size);
aclError acl_c_set_sys_param_opt(int opt, int64_t value);
aclError acl_c_memcpy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                        int kind);
aclError acl_c_get_device_res_limit(int32_t deviceId, int type, uint32_t* value);

#ifdef __cplusplus
}
#endif

#endif
