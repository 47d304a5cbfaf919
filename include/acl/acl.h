/* The CANN-compatible C API: initialization and the runtime subset (CANN's acl.h). */
#ifndef CORA_ACL_ACL_H_
#define CORA_ACL_ACL_H_

#include "acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Initializes the API. configPath may be NULL. A repeated call returns
 * ACL_ERROR_REPEAT_INITIALIZE and counts a reference; aclFinalize releases everything. */
ACL_FUNC_VISIBILITY aclError aclInit(const char* configPath);
/* Releases every resource of the API; a repeated call returns ACL_ERROR_REPEAT_FINALIZE. */
ACL_FUNC_VISIBILITY aclError aclFinalize(void);
/* The message of the most recent failed call on this thread, or NULL if none failed. */
ACL_FUNC_VISIBILITY const char* aclGetRecentErrMsg(void);

#ifdef __cplusplus
}
#endif

#endif /* CORA_ACL_ACL_H_ */
