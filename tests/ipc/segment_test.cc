// ShmSegment: layout planning, sealing, and attach's refusal of bad headers.
#include "ipc/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

namespace tandem::ipc {
namespace {

const RegionSpec kSpecs[] = {
    {RegionKind::kEventRing, 64},
    {RegionKind::kDirectiveRing, 16},
    {RegionKind::kStatusPage, 64},
};

// Number of live mappings of this process (/proc/self/maps lines).
int mapping_count() {
  FILE* f = std::fopen("/proc/self/maps", "r");
  int n = 0;
  for (int c; (c = std::fgetc(f)) != EOF;) n += c == '\n';
  std::fclose(f);
  return n;
}

// A memfd holding `bytes`, sealed like a real segment unless `seal` is false.
base::UniqueFd memfd_with(const std::vector<std::byte>& bytes, bool seal = true) {
  base::UniqueFd fd(::memfd_create("segment-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::write(fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  if (seal) {
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  }
  return fd;
}

// The bytes of a valid segment, to corrupt.
std::vector<std::byte> valid_image() {
  auto seg = ShmSegment::create("image", kSpecs);
  EXPECT_TRUE(seg.has_value());
  auto b = seg->bytes();
  return std::vector<std::byte>(b.begin(), b.end());
}

SegmentHeader* header_of(std::vector<std::byte>& image) { return reinterpret_cast<SegmentHeader*>(image.data()); }

TEST(Segment, PlanPlacesAlignedNonOverlappingRegions) {
  auto layout = plan_layout(kSpecs);
  ASSERT_TRUE(layout) << layout.error().message();
  ASSERT_EQ(layout->regions.size(), 3u);
  EXPECT_EQ(layout->regions[0].offset, 384u);  // right after the 384-byte header
  EXPECT_EQ(layout->regions[0].size, ring_region_size(64));
  for (const Region& r : layout->regions) EXPECT_EQ(r.offset % kIndexAlign, 0u);
  EXPECT_LE(layout->regions[2].offset + layout->regions[2].size, layout->total_size);
}

TEST(Segment, PlanRejectsBadSpecs) {
  const RegionSpec not_pow2[] = {{RegionKind::kEventRing, 100}};
  EXPECT_EQ(plan_layout(not_pow2).error().code(), EINVAL);
  const RegionSpec too_big[] = {{RegionKind::kEventRing, kMaxRingSlots * 2}};
  EXPECT_EQ(plan_layout(too_big).error().code(), EINVAL);
  const RegionSpec odd_status[] = {{RegionKind::kStatusPage, 12}};
  EXPECT_EQ(plan_layout(odd_status).error().code(), EINVAL);
  const RegionSpec unknown[] = {{static_cast<RegionKind>(9), 64}};
  EXPECT_EQ(plan_layout(unknown).error().code(), EINVAL);
  EXPECT_EQ(plan_layout({}).error().code(), EINVAL);
}

TEST(Segment, CreateSealsAndAttachSeesSameMemory) {
  auto seg = ShmSegment::create("test", kSpecs);
  ASSERT_TRUE(seg) << seg.error().message();
  int seals = ::fcntl(seg->fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(::ftruncate(seg->fd(), 1 << 20), 0);  // the peer cannot resize it
  EXPECT_TRUE(::fcntl(seg->fd(), F_GETFD) & FD_CLOEXEC);

  auto dup = base::UniqueFd(::fcntl(seg->fd(), F_DUPFD_CLOEXEC, 0));
  auto peer = ShmSegment::attach(std::move(dup));
  ASSERT_TRUE(peer) << peer.error().message();
  EXPECT_EQ(peer->layout().total_size, seg->layout().total_size);
  ASSERT_EQ(peer->layout().regions.size(), 3u);
  EXPECT_EQ(peer->layout().find(RegionKind::kStatusPage)->offset, seg->layout().regions[2].offset);
  seg->bytes()[1000] = std::byte{0x5a};
  EXPECT_EQ(peer->bytes()[1000], std::byte{0x5a});
}

TEST(Segment, FlagsAreSharedAndTakenAtomically) {
  auto seg = ShmSegment::create("flags", kSpecs);
  ASSERT_TRUE(seg);
  auto peer = ShmSegment::attach(base::UniqueFd(::fcntl(seg->fd(), F_DUPFD_CLOEXEC, 0)));
  ASSERT_TRUE(peer);
  peer->set_flags(kFlagResyncNeeded);
  EXPECT_EQ(seg->take_flags(kFlagResyncNeeded), kFlagResyncNeeded);
  EXPECT_EQ(seg->take_flags(kFlagResyncNeeded), 0u);
}

struct BadHeaderCase {
  const char* name;
  void (*corrupt)(std::vector<std::byte>&);
  int code;
  const char* says;
};

class AttachRejects : public ::testing::TestWithParam<BadHeaderCase> {};

TEST_P(AttachRejects, WithClearErrorAndNoMapping) {
  std::vector<std::byte> image = valid_image();
  GetParam().corrupt(image);
  base::UniqueFd fd = memfd_with(image);
  int before = mapping_count();
  auto seg = ShmSegment::attach(std::move(fd));
  int after = mapping_count();
  ASSERT_FALSE(seg.has_value());
  EXPECT_EQ(seg.error().code(), GetParam().code) << seg.error().message();
  EXPECT_NE(seg.error().message().find(GetParam().says), std::string::npos) << seg.error().message();
  EXPECT_EQ(after, before) << "a rejected segment must map nothing";
}

INSTANTIATE_TEST_SUITE_P(
    Segment, AttachRejects,
    ::testing::Values(
        BadHeaderCase{"BadMagic", [](auto& i) { header_of(i)->magic ^= 1; }, EINVAL, "bad magic"},
        BadHeaderCase{"WrongVersion", [](auto& i) { header_of(i)->abi_version = kAbiVersion + 1; }, EPROTO,
                      "ABI version 2"},
        BadHeaderCase{"WrongHeaderSize", [](auto& i) { header_of(i)->header_size = 128; }, EINVAL, "header_size"},
        BadHeaderCase{"SizeMismatch", [](auto& i) { header_of(i)->total_size += 128; }, EINVAL, "header says"},
        BadHeaderCase{"Truncated", [](auto& i) { i.resize(200); }, EINVAL, "smaller than"},
        BadHeaderCase{"TooManyRegions", [](auto& i) { header_of(i)->region_count = 9; }, EINVAL, "region_count"},
        BadHeaderCase{"NoRegions", [](auto& i) { header_of(i)->region_count = 0; }, EINVAL, "region_count"},
        BadHeaderCase{"RegionPastEnd", [](auto& i) { header_of(i)->regions[2].offset = header_of(i)->total_size; },
                      EINVAL, "outside"},
        BadHeaderCase{"RegionOverflowsOffset", [](auto& i) { header_of(i)->regions[0].offset = ~0ull - 127; }, EINVAL,
                      "outside"},
        BadHeaderCase{"RegionInsideHeader", [](auto& i) { header_of(i)->regions[0].offset = 128; }, EINVAL, "outside"},
        BadHeaderCase{"MisalignedRegion", [](auto& i) { header_of(i)->regions[1].offset += 64; }, EINVAL, "misaligned"},
        BadHeaderCase{"OverlappingRegions",
                      [](auto& i) { header_of(i)->regions[1].offset = header_of(i)->regions[0].offset + 128; }, EINVAL,
                      "overlap"},
        BadHeaderCase{"SlotsNotPowerOfTwo", [](auto& i) { header_of(i)->regions[0].param = 48; }, EINVAL,
                      "not a power of two"},
        BadHeaderCase{"SizeDisagreesWithSlots", [](auto& i) { header_of(i)->regions[0].size += 64; }, EINVAL, "size"},
        BadHeaderCase{"UnknownRegionKind", [](auto& i) { header_of(i)->regions[2].kind = 77; }, EINVAL,
                      "unknown region kind"},
        BadHeaderCase{"ReservedNotZero", [](auto& i) { header_of(i)->reserved0 = 1; }, EINVAL, "reserved"}),
    [](const auto& test_info) { return std::string(test_info.param.name); });

TEST(Segment, AttachRefusesUnsealedMemfd) {
  base::UniqueFd fd = memfd_with(valid_image(), /*seal=*/false);
  auto seg = ShmSegment::attach(std::move(fd));
  ASSERT_FALSE(seg);
  EXPECT_EQ(seg.error().code(), EPERM);
  EXPECT_NE(seg.error().message().find("seals"), std::string::npos);
}

TEST(Segment, AttachRefusesNonMemfd) {
  base::UniqueFd fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  auto seg = ShmSegment::attach(std::move(fd));
  ASSERT_FALSE(seg);
  EXPECT_NE(seg.error().message().find("not a sealable memfd"), std::string::npos);
}

TEST(Segment, ValidateHeaderIsPure) {
  std::vector<std::byte> image = valid_image();
  auto ok = validate_header(image, image.size());
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_EQ(ok->regions.size(), 3u);
  EXPECT_FALSE(validate_header(std::span(image).first(10), image.size()));
}

}  // namespace
}  // namespace tandem::ipc
