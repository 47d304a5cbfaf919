/* cora's CANN-compatible C API: base declarations (acl_base.h).
 * The declarations, types, enum values and error codes are those of CANN's public header of the
 * same name (CANN runtime 1.17), so that host code written for CANN builds unchanged. What each
 * function does on cora (implemented, partial, or refused with ACL_ERROR_RT_FEATURE_NOT_SUPPORT
 * and a message from aclGetRecentErrMsg) is listed in docs/acl-compat.md. */

#ifndef INC_EXTERNAL_ACL_ACL_BASE_H_
#define INC_EXTERNAL_ACL_ACL_BASE_H_

#include "acl_base_rt.h"
#include "error_codes/rt_error_codes.h"
#include "error_codes/ge_error_codes.h"

#endif
