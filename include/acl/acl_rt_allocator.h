/* cora's CANN-compatible C API: external allocators (acl_rt_allocator.h).
 * The declarations, types, enum values and error codes are those of CANN's public header of the
 * same name (CANN runtime 1.17), so that host code written for CANN builds unchanged. What each
 * function does on cora (implemented, partial, or refused with ACL_ERROR_RT_FEATURE_NOT_SUPPORT
 * and a message from aclGetRecentErrMsg) is listed in docs/acl-compat.md. */

#ifndef INC_EXTERNAL_ACL_ACL_RT_ALLOCATOR_H_
#define INC_EXTERNAL_ACL_ACL_RT_ALLOCATOR_H_

#include "acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void* (*aclrtAllocatorAllocFunc)(aclrtAllocator allocator, size_t size);
typedef void (*aclrtAllocatorFreeFunc)(aclrtAllocator allocator, aclrtAllocatorBlock block);
typedef void* (*aclrtAllocatorAllocAdviseFunc)(aclrtAllocator allocator, size_t size, aclrtAllocatorAddr addr);
typedef void* (*aclrtAllocatorGetAddrFromBlockFunc)(aclrtAllocatorBlock block);

ACL_FUNC_VISIBILITY aclrtAllocatorDesc aclrtAllocatorCreateDesc();

ACL_FUNC_VISIBILITY aclError aclrtAllocatorDestroyDesc(aclrtAllocatorDesc allocatorDesc);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorSetObjToDesc(aclrtAllocatorDesc allocatorDesc, aclrtAllocator allocator);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorSetAllocFuncToDesc(
    aclrtAllocatorDesc allocatorDesc, aclrtAllocatorAllocFunc func);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorSetFreeFuncToDesc(
    aclrtAllocatorDesc allocatorDesc, aclrtAllocatorFreeFunc func);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorSetAllocAdviseFuncToDesc(
    aclrtAllocatorDesc allocatorDesc, aclrtAllocatorAllocAdviseFunc func);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorSetGetAddrFromBlockFuncToDesc(
    aclrtAllocatorDesc allocatorDesc, aclrtAllocatorGetAddrFromBlockFunc func);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorRegister(aclrtStream stream, aclrtAllocatorDesc allocatorDesc);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorGetByStream(
    aclrtStream stream, aclrtAllocatorDesc* allocatorDesc, aclrtAllocator* allocator,
    aclrtAllocatorAllocFunc* allocFunc, aclrtAllocatorFreeFunc* freeFunc,
    aclrtAllocatorAllocAdviseFunc* allocAdviseFunc, aclrtAllocatorGetAddrFromBlockFunc* getAddrFromBlockFunc);

ACL_FUNC_VISIBILITY aclError aclrtAllocatorUnregister(aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
