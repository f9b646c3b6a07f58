// The shared-memory ABI: every struct that lives in a segment both sides map.
//
// Rules (docs/architecture.md "Wire records", docs/contributing.md "Shared memory"):
//   - offsets, never pointers; fixed-width fields, explicit padding;
//   - static_asserts pin every size and offset, so a layout change is a
//     compile error until kAbiVersion is bumped;
//   - everything a peer can write is hostile input: readers copy, clamp and
//     validate, and never re-read a value they have already checked.
//
// Segment layout (offsets are recorded in the header, not assumed):
//
//   0      SegmentHeader   magic, ABI version, sizes, region table, runtime flags
//   ...    region 0..n-1   each 128-byte aligned:
//            ring:        RingControl (tail | head | consumer_waiting, one 128-byte
//                         block each) followed by `slots` × 64-byte Slot
//            status page: StatusControl (seq) followed by the payload words
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::ipc {

inline constexpr std::uint64_t kSegmentMagic = 0x31474553444e4154ull;  // "TANDSEG1", little-endian
inline constexpr std::uint32_t kAbiVersion = 1;

// x86's adjacent-line prefetcher pulls cache lines in pairs, so indices owned by
// different cores sit 128 bytes apart, not 64 ([gpu_and_ipc] B.3).
inline constexpr std::size_t kIndexAlign = 128;
inline constexpr std::size_t kSlotSize = 64;
inline constexpr std::uint32_t kMinRingSlots = 2;
inline constexpr std::uint32_t kMaxRingSlots = 1u << 20;  // 64 MiB of slots
inline constexpr std::uint32_t kMaxRegions = 8;

enum class RegionKind : std::uint32_t {
  kEventRing = 1,      // client → daemon records
  kDirectiveRing = 2,  // daemon → client records
  kStatusPage = 3,     // daemon → client seqlock snapshot
};

struct RegionDesc {
  std::uint32_t kind;    // RegionKind
  std::uint32_t param;   // ring: slot count; status page: payload bytes
  std::uint64_t offset;  // from the start of the segment
  std::uint64_t size;    // bytes
};
static_assert(sizeof(RegionDesc) == 24);

// Segment header flag bits (SegmentHeader::flags).
inline constexpr std::uint32_t kFlagResyncNeeded = 1u << 0;  // client → daemon: events were lost

struct SegmentHeader {
  // Immutable after creation.
  std::uint64_t magic;
  std::uint32_t abi_version;
  std::uint32_t header_size;  // sizeof(SegmentHeader)
  std::uint64_t total_size;   // bytes, equal to the memfd's size
  std::uint32_t region_count;
  std::uint32_t reserved0;
  RegionDesc regions[kMaxRegions];
  // Runtime, in its own 128-byte block. Accessed only through std::atomic_ref.
  alignas(kIndexAlign) std::uint32_t flags;
  std::uint32_t reserved1;
};
static_assert(sizeof(SegmentHeader) == 384);
static_assert(offsetof(SegmentHeader, regions) == 32);
static_assert(offsetof(SegmentHeader, flags) == 256);

// One ring slot. Records are 64-byte PODs copied in and out of slots word by
// word (see spsc_ring.h for why words). Bits 32..63 of words[0] belong to the
// ring: the slot's turn, which says whether it holds the record the consumer
// expects next.
struct alignas(kSlotSize) Slot {
  std::uint64_t words[kSlotSize / sizeof(std::uint64_t)];
};
static_assert(sizeof(Slot) == kSlotSize);

// Ring indices are free-running u32 counters; slot = index & (slots - 1).
struct RingControl {
  alignas(kIndexAlign) std::uint32_t tail;  // producer only; a hint for observers
  alignas(kIndexAlign) std::uint32_t head;  // consumer only; slots before it are free
  // Doorbell flag: the consumer sets it before sleeping; the producer clears it
  // when it rings. See doorbell.h.
  alignas(kIndexAlign) std::uint32_t consumer_waiting;
};
static_assert(sizeof(RingControl) == 3 * kIndexAlign);
static_assert(offsetof(RingControl, head) == kIndexAlign);
static_assert(offsetof(RingControl, consumer_waiting) == 2 * kIndexAlign);

constexpr std::uint64_t ring_region_size(std::uint32_t slots) {
  return sizeof(RingControl) + std::uint64_t{slots} * kSlotSize;
}

// Seqlock sequence: odd while the writer is mid-update.
struct StatusControl {
  alignas(kIndexAlign) std::uint32_t seq;
  std::uint32_t reserved;
};
static_assert(sizeof(StatusControl) == kIndexAlign);

constexpr std::uint64_t status_region_size(std::uint32_t payload_bytes) {
  return sizeof(StatusControl) + payload_bytes;
}

}  // namespace tandem::ipc
