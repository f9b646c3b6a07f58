// Mapping: sole owner of an mmap()ed range; munmap() on destruction.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <utility>

#include "base/result.h"

namespace tandem::base {

// Thread-safety: the object is not synchronised; the memory it maps is shared
// by design and synchronised by whoever uses it.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping() { reset(); }

  // mmap(NULL, length, prot, flags, fd, offset).
  static Result<Mapping> map(int fd, std::size_t length, int prot, int flags, off_t offset = 0);

  Mapping(Mapping&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      reset();
      addr_ = std::exchange(other.addr_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  void* data() const noexcept { return addr_; }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() const noexcept { return {static_cast<std::byte*>(addr_), size_}; }
  bool valid() const noexcept { return addr_ != nullptr; }

  void reset() noexcept;

 private:
  Mapping(void* addr, std::size_t size) : addr_(addr), size_(size) {}

  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tandem::base
