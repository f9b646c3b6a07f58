// UniqueFd out-of-line members.
#include "base/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

namespace tandem::base {

void UniqueFd::reset(int fd) noexcept {
  int old = std::exchange(fd_, fd);
  if (old >= 0 && old != fd) {
    // close() may fail with EINTR or EIO; the fd is gone either way on Linux,
    // and retrying could close an fd another thread just opened.
    ::close(old);
  }
}

Result<UniqueFd> UniqueFd::duplicate() const {
  int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return errno_error("dup fd");
  return UniqueFd(fd);
}

}  // namespace tandem::base
