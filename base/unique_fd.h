// UniqueFd: sole owner of a file descriptor.
//
// Move-only. Moving over a live UniqueFd closes the fd it held; self-move is a
// no-op. -1 means "no fd". Every fd tandem creates is O_CLOEXEC.
#pragma once

#include <utility>

#include "base/result.h"

namespace tandem::base {

// Thread-safety: like an int; not synchronised.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    // release() empties `other` before reset() closes our old fd, which makes
    // self-move safe: reset() then sees -1 as the old value.
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Gives up ownership without closing.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  // Closes the current fd (unless it is `fd` itself) and takes `fd`.
  void reset(int fd = -1) noexcept;

  // A new O_CLOEXEC descriptor for the same open file.
  Result<UniqueFd> duplicate() const;

 private:
  int fd_ = -1;
};

}  // namespace tandem::base
