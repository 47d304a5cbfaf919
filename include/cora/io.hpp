// Which mechanism cora reads files with (for diagnostics such as cora-info).
#pragma once

#include <string>
#include <string_view>

namespace cora {

/// The mechanism behind file reads (device::load_binary, stream::read_file): "io_uring", or
/// "blocking" (a thread doing pread) where io_uring is unavailable (old kernel, seccomp) or the
/// environment variable CORA_IO_BACKEND=blocking asks for it. Starts the I/O queue if needed.
std::string_view io_backend_name();

/// One line on why that mechanism is in use and what it offers, e.g.
/// "io_uring (256 entries, fixed buffers)" or
/// "blocking (io_uring_queue_init failed: Operation not permitted)".
std::string io_backend_detail();

}  // namespace cora
