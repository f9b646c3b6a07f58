// ShmSegment: creation, sealing, validation and attach.
#include "ipc/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include <fmt/format.h>

namespace tandem::ipc {
namespace {

constexpr unsigned kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
constexpr std::uint32_t kMaxStatusPayload = 4096;

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

const char* kind_name(std::uint32_t kind) {
  switch (static_cast<RegionKind>(kind)) {
    case RegionKind::kEventRing:
      return "event ring";
    case RegionKind::kDirectiveRing:
      return "directive ring";
    case RegionKind::kStatusPage:
      return "status page";
  }
  return "unknown";
}

}  // namespace

const Region* SegmentLayout::find(RegionKind kind) const {
  for (const Region& r : regions) {
    if (r.kind == kind) return &r;
  }
  return nullptr;
}

base::Result<std::uint64_t> region_size(const RegionSpec& spec) {
  switch (spec.kind) {
    case RegionKind::kEventRing:
    case RegionKind::kDirectiveRing:
      if (spec.param < kMinRingSlots || spec.param > kMaxRingSlots || !std::has_single_bit(spec.param)) {
        return base::make_error(EINVAL, fmt::format("{}: {} slots is not a power of two in [{}, {}]",
                                                    kind_name(static_cast<std::uint32_t>(spec.kind)), spec.param,
                                                    kMinRingSlots, kMaxRingSlots));
      }
      return ring_region_size(spec.param);
    case RegionKind::kStatusPage:
      if (spec.param == 0 || spec.param % 8 != 0 || spec.param > kMaxStatusPayload) {
        return base::make_error(EINVAL, fmt::format("status page: payload of {} bytes is not a multiple "
                                                    "of 8 in [8, {}]",
                                                    spec.param, kMaxStatusPayload));
      }
      return status_region_size(spec.param);
  }
  return base::make_error(EINVAL, fmt::format("unknown region kind {}", static_cast<std::uint32_t>(spec.kind)));
}

base::Result<SegmentLayout> plan_layout(std::span<const RegionSpec> specs) {
  if (specs.empty() || specs.size() > kMaxRegions) {
    return base::make_error(EINVAL, fmt::format("segment needs 1 to {} regions, got {}", kMaxRegions, specs.size()));
  }
  SegmentLayout layout;
  std::uint64_t offset = align_up(sizeof(SegmentHeader), kIndexAlign);
  for (const RegionSpec& spec : specs) {
    auto size = region_size(spec);
    if (!size) return base::propagate(std::move(size.error()), "plan segment");
    layout.regions.push_back(Region{spec.kind, spec.param, offset, *size});
    offset = align_up(offset + *size, kIndexAlign);
  }
  layout.total_size = offset;
  return layout;
}

base::Result<SegmentLayout> validate_header(std::span<const std::byte> bytes, std::uint64_t file_size) {
  if (bytes.size() < sizeof(SegmentHeader) || file_size < sizeof(SegmentHeader)) {
    return base::make_error(EINVAL,
                            fmt::format("segment of {} bytes is smaller than its {}-byte header",
                                        std::min<std::uint64_t>(bytes.size(), file_size), sizeof(SegmentHeader)));
  }
  SegmentHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kSegmentMagic) {
    return base::make_error(EINVAL, fmt::format("bad magic {:#018x} (expected {:#018x})", h.magic, kSegmentMagic));
  }
  if (h.abi_version != kAbiVersion) {
    return base::make_error(EPROTO, fmt::format("ABI version {} (this build speaks {})", h.abi_version, kAbiVersion));
  }
  if (h.header_size != sizeof(SegmentHeader)) {
    return base::make_error(EINVAL, fmt::format("header_size {} (expected {})", h.header_size, sizeof(SegmentHeader)));
  }
  if (h.total_size != file_size) {
    return base::make_error(EINVAL,
                            fmt::format("header says {} bytes but the segment has {}", h.total_size, file_size));
  }
  if (h.region_count == 0 || h.region_count > kMaxRegions) {
    return base::make_error(EINVAL, fmt::format("region_count {} not in [1, {}]", h.region_count, kMaxRegions));
  }
  if (h.reserved0 != 0) return base::make_error(EINVAL, "reserved header field is not zero");

  SegmentLayout layout;
  layout.total_size = h.total_size;
  for (std::uint32_t i = 0; i < h.region_count; ++i) {
    const RegionDesc& d = h.regions[i];
    auto expected = region_size(RegionSpec{static_cast<RegionKind>(d.kind), d.param});
    if (!expected) return base::propagate(std::move(expected.error()), fmt::format("region {}", i));
    if (d.size != *expected) {
      return base::make_error(
          EINVAL, fmt::format("region {} ({}): size {} (expected {})", i, kind_name(d.kind), d.size, *expected));
    }
    if (d.offset % kIndexAlign != 0 || d.offset < sizeof(SegmentHeader) || d.offset > h.total_size ||
        d.size > h.total_size - d.offset) {
      return base::make_error(EINVAL, fmt::format("region {} ({}): [{}, +{}) is misaligned or outside the "
                                                  "{}-byte segment",
                                                  i, kind_name(d.kind), d.offset, d.size, h.total_size));
    }
    layout.regions.push_back(Region{static_cast<RegionKind>(d.kind), d.param, d.offset, d.size});
  }
  std::vector<Region> sorted = layout.regions;
  std::sort(sorted.begin(), sorted.end(), [](const Region& a, const Region& b) { return a.offset < b.offset; });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1].offset + sorted[i - 1].size > sorted[i].offset) {
      return base::make_error(
          EINVAL, fmt::format("regions at offsets {} and {} overlap", sorted[i - 1].offset, sorted[i].offset));
    }
  }
  return layout;
}

base::Result<ShmSegment> ShmSegment::create(const std::string& name, std::span<const RegionSpec> regions) {
  auto layout = plan_layout(regions);
  if (!layout) return base::propagate(std::move(layout.error()), "create segment");

  base::UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return base::errno_error("create segment: memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(layout->total_size)) != 0) {
    return base::errno_error(fmt::format("create segment: size to {} bytes", layout->total_size));
  }
  auto mapping = base::Mapping::map(fd.get(), layout->total_size, PROT_READ | PROT_WRITE, MAP_SHARED);
  if (!mapping) return base::propagate(std::move(mapping.error()), "create segment");

  // ftruncate zero-filled the file: indices, sequences and flags start at 0.
  SegmentHeader h{};
  h.magic = kSegmentMagic;
  h.abi_version = kAbiVersion;
  h.header_size = sizeof(SegmentHeader);
  h.total_size = layout->total_size;
  h.region_count = static_cast<std::uint32_t>(layout->regions.size());
  for (std::size_t i = 0; i < layout->regions.size(); ++i) {
    const Region& r = layout->regions[i];
    h.regions[i] = RegionDesc{static_cast<std::uint32_t>(r.kind), r.param, r.offset, r.size};
  }
  // No peer has the fd yet, so a plain copy is race-free.
  std::memcpy(mapping->data(), &h, sizeof h);

  if (::fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals) != 0) return base::errno_error("create segment: seal");
  return ShmSegment(std::move(fd), std::move(*mapping), std::move(*layout));
}

base::Result<ShmSegment> ShmSegment::attach(base::UniqueFd fd) {
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) return base::errno_error("attach segment: not a sealable memfd");
  if ((static_cast<unsigned>(seals) & kRequiredSeals) != kRequiredSeals) {
    return base::make_error(EPERM, fmt::format("attach segment: memfd seals {:#x} lack shrink/grow/seal ({:#x}); "
                                               "its owner could resize it under us",
                                               seals, kRequiredSeals));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return base::errno_error("attach segment: fstat");

  std::byte raw[sizeof(SegmentHeader)] = {};
  ssize_t n = ::pread(fd.get(), raw, sizeof raw, 0);
  if (n < 0) return base::errno_error("attach segment: read header");
  auto layout = validate_header(std::span<const std::byte>(raw, static_cast<std::size_t>(n)),
                                static_cast<std::uint64_t>(st.st_size));
  if (!layout) return base::propagate(std::move(layout.error()), "attach segment");

  auto mapping = base::Mapping::map(fd.get(), layout->total_size, PROT_READ | PROT_WRITE, MAP_SHARED);
  if (!mapping) return base::propagate(std::move(mapping.error()), "attach segment");
  return ShmSegment(std::move(fd), std::move(*mapping), std::move(*layout));
}

void ShmSegment::set_flags(std::uint32_t bits) {
  // Relaxed: a flag is a hint that triggers a slow path (resync over the
  // socket), which carries its own ordering.
  std::atomic_ref<std::uint32_t>(header()->flags).fetch_or(bits, std::memory_order_relaxed);
}

std::uint32_t ShmSegment::take_flags(std::uint32_t bits) {
  return std::atomic_ref<std::uint32_t>(header()->flags).fetch_and(~bits, std::memory_order_relaxed);
}

}  // namespace tandem::ipc
