// Checks that a pageable host range is mapped before an op that touches it is queued, so that a
// wild address given to a copy, fill or raw argument block fails with invalid_pointer instead of
// faulting a device worker later. Only ranges that are no allocation of cora's are probed.
#pragma once

#include <cstddef>

namespace cora::detail {

/// Whether every page of [p, p + bytes) is mapped in this process (true for an empty range,
/// false for a range that wraps the address space). mincore() finds unmapped pages without
/// faulting anything in. With `accessible`, the range must also be readable at its ends:
/// process_vm_readv() of one byte of the first and the last page finds inaccessible
/// (PROT_NONE) pages there. Without it, a reserved range passes: a GPU's unified addresses
/// (memory the driver allocated outside cora) are mapped PROT_NONE on the host.
///
/// Each thread remembers the last 8 ranges that passed, so that copies from the same buffer
/// cost no system call: memory unmapped after it passed a check is not seen until it drops out
/// of that memory, as with memory unmapped under a native memcpy. Writability is not checked: a
/// copy into read-only memory faults like a native write to it.
bool host_range_mapped(const void* p, std::size_t bytes, bool accessible = true) noexcept;

/// Forgets the calling thread's remembered ranges (tests, and callers that unmap memory).
void forget_host_ranges() noexcept;

}  // namespace cora::detail
