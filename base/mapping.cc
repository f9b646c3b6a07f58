// Mapping out-of-line members.
#include "base/mapping.h"

#include <sys/mman.h>

namespace tandem::base {

Result<Mapping> Mapping::map(int fd, std::size_t length, int prot, int flags, off_t offset) {
  if (length == 0) return make_error(EINVAL, "mmap: zero length");
  void* addr = ::mmap(nullptr, length, prot, flags, fd, offset);
  if (addr == MAP_FAILED) return errno_error("mmap");
  return Mapping(addr, length);
}

void Mapping::reset() noexcept {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

}  // namespace tandem::base
