// Fuzz target: segment-header validation. The input is a header image; the
// first 8 bytes (if present) pick the claimed file size. A header that
// validates must describe regions that lie inside the file, are aligned and
// do not overlap — the guarantees attach() relies on before mapping.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ipc/segment.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem::ipc;
  std::uint64_t file_size = size;
  if (size >= 8) {
    std::memcpy(&file_size, data, 8);
    data += 8;
    size -= 8;
    file_size %= (1ull << 32);
  }
  auto bytes = std::span(reinterpret_cast<const std::byte*>(data), size);
  auto layout = validate_header(bytes, file_size);
  if (!layout) {
    if (layout.error().context().empty()) __builtin_trap();
    return 0;
  }
  std::vector<Region> regions = layout->regions;
  std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) { return a.offset < b.offset; });
  std::uint64_t end = sizeof(SegmentHeader);
  for (const Region& r : regions) {
    if (r.offset < end || r.offset % kIndexAlign != 0) __builtin_trap();
    if (r.size > file_size || r.offset > file_size - r.size) __builtin_trap();
    auto expected = region_size(RegionSpec{r.kind, r.param});
    if (!expected || *expected != r.size) __builtin_trap();
    end = r.offset + r.size;
  }
  return 0;
}
