#include "io/file_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "core/host_pool.hpp"

namespace cora::detail {

namespace {

std::string describe(const std::filesystem::path& path, int err) {
  return "cannot read '" + path.string() + "': " + std::strerror(err);
}

}  // namespace

std::vector<std::byte> read_whole_file_sync(const std::filesystem::path& path, std::error_code& ec,
                                            std::string& message) {
  ec.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ec = std::error_code(errno, std::system_category());
    message = describe(path, errno);
    return {};
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
    ::close(fd);
    ec = std::error_code(err, std::system_category());
    message = describe(path, err);
    return {};
  }
  std::vector<std::byte> out(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ec = std::error_code(err, std::system_category());
      message = describe(path, err);
      return {};
    }
    if (n == 0) break;  // the file shrank while being read
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (done != out.size()) {
    ec = std::make_error_code(std::errc::io_error);
    message = "short read of '" + path.string() + "': " + std::to_string(done) + " of " +
              std::to_string(out.size()) + " bytes";
    return {};
  }
  return out;
}

void read_whole_file(const std::filesystem::path& path, file_callback done) {
  asio::post(host_pool(), [path, done = std::move(done)] {
    std::error_code ec;
    std::string message;
    auto bytes = read_whole_file_sync(path, ec, message);
    done(ec, std::move(message), std::move(bytes));
  });
}

}  // namespace cora::detail
