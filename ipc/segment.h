// ShmSegment: a sealed memfd holding a validated header and typed regions.
//
// The daemon creates one segment per client (docs/architecture.md "Wire records"): create() sizes a
// memfd, writes the header, and seals it against grow and shrink, so a peer
// can never make our mapping fault. The client attach()es the fd it received:
// the header is read with pread() and validated *before* anything is mapped,
// so a bad header, a wrong size or a wrong ABI version returns a clear error
// and maps nothing.
//
// Each side keeps its own copy of the layout (SegmentLayout). Nothing reads
// region offsets back from shared memory after attach: the header is writable
// by the peer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/mapping.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/abi.h"

namespace tandem::ipc {

// What a region should hold. The size follows from kind and param.
struct RegionSpec {
  RegionKind kind;
  std::uint32_t param;  // ring: slots (power of two); status page: payload bytes (multiple of 8)
};

struct Region {
  RegionKind kind;
  std::uint32_t param;
  std::uint64_t offset;
  std::uint64_t size;
};

// A private, validated copy of a segment's layout.
struct SegmentLayout {
  std::uint64_t total_size = 0;
  std::vector<Region> regions;

  // The first region of `kind`, or nullptr.
  const Region* find(RegionKind kind) const;
};

// Region size for a spec, or an error naming what is wrong with it.
base::Result<std::uint64_t> region_size(const RegionSpec& spec);

// Places regions after the header, each 128-byte aligned.
base::Result<SegmentLayout> plan_layout(std::span<const RegionSpec> specs);

// Validates a header against the size of the file it came from. Pure: `bytes`
// is a private copy of the file's first bytes. Every failure names the field.
base::Result<SegmentLayout> validate_header(std::span<const std::byte> bytes, std::uint64_t file_size);

// Thread-safety: the object is owned by one thread; the mapped memory is shared
// and accessed only through the ring, doorbell and status-page types.
class ShmSegment {
 public:
  ShmSegment() = default;

  // Creates, sizes, fills and seals a memfd named `name` (shown in /proc/*/fd).
  static base::Result<ShmSegment> create(const std::string& name, std::span<const RegionSpec> regions);

  // Validates the memfd `fd` (seals, size, header) and maps it read-write.
  static base::Result<ShmSegment> attach(base::UniqueFd fd);

  int fd() const { return fd_.get(); }
  const SegmentLayout& layout() const { return layout_; }
  std::span<std::byte> bytes() const { return mapping_.bytes(); }
  std::span<std::byte> region(const Region& r) const { return bytes().subspan(r.offset, r.size); }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(mapping_.data()); }

  // Runtime flags in the header (kFlag*). Any bit pattern is safe to read.
  void set_flags(std::uint32_t bits);
  // Returns the flags and clears `bits` atomically.
  std::uint32_t take_flags(std::uint32_t bits);

 private:
  ShmSegment(base::UniqueFd fd, base::Mapping mapping, SegmentLayout layout)
      : fd_(std::move(fd)), mapping_(std::move(mapping)), layout_(std::move(layout)) {}

  base::UniqueFd fd_;
  base::Mapping mapping_;
  SegmentLayout layout_;
};

}  // namespace tandem::ipc
