// The C ABI between the CPU device and a CPU kernel image (a shared object built by
// cora_add_kernel_binary). Kept in plain C types so the image and the runtime never share C++
// objects or exceptions across the dlopen boundary.
#ifndef CORA_DETAIL_CPU_KERNEL_ABI_H
#define CORA_DETAIL_CPU_KERNEL_ABI_H

#include <stdint.h>

#define CORA_KERNEL_RECORD_MAGIC "CORAKRN1"
#define CORA_KERNEL_RECORD_SECTION ".cora_kernels"
#define CORA_KERNEL_MAX_PARAMS 128
#define CORA_KERNEL_MAX_NAME 128
#define CORA_KERNEL_ENTRY_PREFIX "cora_cpu_entry_"

// One per kernel, placed in section CORA_KERNEL_RECORD_SECTION of the image, so kernels can be
// listed from the file's bytes without loading it.
struct cora_kernel_record {
  char magic[8];              // CORA_KERNEL_RECORD_MAGIC, not NUL-terminated
  uint32_t record_size;       // sizeof(struct cora_kernel_record)
  uint32_t param_count;       // <= CORA_KERNEL_MAX_PARAMS
  uint64_t entry_key;         // numeric suffix of the name ("add_3" -> 3), else 0
  uint32_t flags;             // CORA_KERNEL_FLAG_*
  uint32_t reserved;
  char name[CORA_KERNEL_MAX_NAME];  // NUL-terminated
  uint32_t param_size[CORA_KERNEL_MAX_PARAMS];
  uint32_t param_align[CORA_KERNEL_MAX_PARAMS];
};

#define CORA_KERNEL_FLAG_HAS_ENTRY_KEY 1u
// The CPU-device path the kernel's source reads as (docs/kernels.md), for tools: it calls
// cora::block_threads (the phased form), or cora::sync_block outside it (the fiber fallback).
#define CORA_KERNEL_FLAG_PHASED 2u
#define CORA_KERNEL_FLAG_RAW_BARRIER 4u
// Set in param_align[i] (above the alignment itself) when parameter i is a pointer, so that
// the runtime can check the addresses a raw argument block passes in its pointer slots.
#define CORA_KERNEL_PARAM_POINTER 0x80000000u

// What a block sees of its launch. The image copies it into the state of the blocks it runs;
// cora::block_idx() and friends read that copy.
struct cora_cpu_launch {
  uint32_t grid[3];
  uint32_t block_index;       // linear block index of the block being run
  uint32_t block_count;       // grid[0] * grid[1] * grid[2]
  uint64_t deadline_ns;       // CLOCK_MONOTONIC deadline for cora::checkpoint(); 0 = none
  const volatile uint32_t* abort_flag;  // set by the device to stop a launch early; may be null
  uint32_t block[3];          // threads per block in each dimension
  uint32_t block_threads;     // block[0] * block[1] * block[2] (cora::block_dim())
};

// Bytes of block shared memory (CORA_SHARED) a CPU-device block may use, as CUDA's static limit.
#define CORA_CPU_SHARED_BYTES (48 * 1024)
// Most threads a CPU-device block may have.
#define CORA_CPU_MAX_BLOCK_THREADS 1024

// Status a kernel entry returns.
enum cora_cpu_status {
  CORA_CPU_OK = 0,
  CORA_CPU_TRAP = 1,          // cora::trap() or a failed cora::check()
  CORA_CPU_TIMEOUT = 2,       // the launch passed its deadline (seen at a cora::checkpoint())
  CORA_CPU_EXCEPTION = 3,     // a C++ exception escaped the kernel
  CORA_CPU_ABORTED = 4        // the device asked the launch to stop
};

// Runs blocks [first, last) of a launch. `args` is the argument block in cora's canonical
// layout (each parameter at an offset aligned to max(8, its alignment)). On failure writes a
// NUL-terminated message of at most `message_size` bytes.
typedef int (*cora_cpu_entry_fn)(const struct cora_cpu_launch* launch, uint32_t first,
                                 uint32_t last, const void* args, char* message,
                                 uint32_t message_size);

#endif
