// Chooses the process's I/O queue and reports the choice (cora/io.hpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>

#include "cora/io.hpp"
#include "io/blocking_io_queue.hpp"
#include "io/io_queue.hpp"
#include "io/uring_io_queue.hpp"

namespace cora {

namespace detail::io {

int nonblocking_open_flags(int flags) noexcept { return flags | O_NONBLOCK; }

int finish_nonblocking_open(int res) noexcept {
  if (res < 0) return res;
  struct stat st {};
  // A FIFO, socket or device keeps O_NONBLOCK: its opener refuses it after its own fstat.
  if (::fstat(res, &st) != 0 || !S_ISREG(st.st_mode)) return res;
  const int fl = ::fcntl(res, F_GETFL);
  if (fl < 0 || ::fcntl(res, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(res);
    return -err;
  }
  return res;
}

int io_queue::register_buffer(void*, std::size_t) noexcept { return -1; }
void io_queue::unregister_buffer(int) noexcept {}

namespace {

struct selection {
  io_queue* queue = nullptr;
  std::string detail;
};

const selection& selected() {
  // Never destroyed: reads may still be in flight while the process exits.
  static const selection* s = [] {
    auto* sel = new selection;
    const char* env = std::getenv("CORA_IO_BACKEND");
    const std::string want = env ? env : "";
    if (want == "blocking") {
      sel->queue = &fallback_queue();
      sel->detail = "blocking (CORA_IO_BACKEND=blocking)";
      return sel;
    }
    std::string why;
    if (auto q = uring_io_queue::create(why)) {
      sel->detail = "io_uring (" + q->detail() + ")";
      sel->queue = q.release();
    } else {
      sel->queue = &fallback_queue();
      sel->detail = "blocking (" + why + ")";
    }
    if (!want.empty() && want != "io_uring")
      sel->detail += "; CORA_IO_BACKEND='" + want + "' ignored (io_uring or blocking)";
    return sel;
  }();
  return *s;
}

}  // namespace

io_queue& default_queue() { return *selected().queue; }

io_queue& fallback_queue() {
  static auto* q = new blocking_io_queue();  // never destroyed, as default_queue()
  return *q;
}

}  // namespace detail::io

std::string_view io_backend_name() { return detail::io::default_queue().name(); }

std::string io_backend_detail() { return detail::io::selected().detail; }

}  // namespace cora
