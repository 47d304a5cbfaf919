/* cora's CANN-compatible C API (CANN's acl.h). CANN's acl.h also includes the operator and model
 * headers (acl_op.h, acl_mdl.h), which cora does not provide: its runtime subset, including
 * aclInit, aclFinalize and aclGetRecentErrMsg, is declared in acl_rt.h. */
#ifndef INC_EXTERNAL_ACL_ACL_H_
#define INC_EXTERNAL_ACL_ACL_H_

#include "acl_rt.h"

#endif
