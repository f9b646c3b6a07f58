// Wire records: the 64-byte messages on the event and directive rings.
//
// Every record is a POD of exactly one slot: a 24-byte RecordHeader (type,
// version, flags, session id, monotonic timestamp) and a 40-byte payload.
// static_asserts pin sizes and offsets. The table is the one in docs/architecture.md "Wire records".
//
// Decoding is copy-then-validate: the slot was already copied out of shared
// memory by the ring; decode() checks the type, the direction it travelled,
// the version and every field, and hands back a Record only if all pass.
//   - unknown type        → DecodeStatus::kUnknownType (count, skip)
//   - wrong direction     → kWrongDirection (a client sent a directive, or v.v.)
//   - version 0           → kBadVersion
//   - a bad field         → kBadField, with a static string naming it
// Evolution: a sender may use a newer version of a record only by appending
// fields in what is reserved now; a receiver accepts a newer version, reads
// the fields it knows and skips the reserved-must-be-zero checks.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "ipc/abi.h"

namespace tandem::ipc {

inline constexpr std::uint8_t kRecordVersion = 1;

enum class RecordType : std::uint16_t {
  // engine → daemon
  kRoundSubmit = 1,
  kRoundFirstToken = 2,
  kRoundEnd = 3,
  kKvStats = 4,
  kKvEvent = 5,
  kGpuPartitions = 6,  // the engine's green-context pool (libtandem GreenContextPool)
  kStageProfile = 7,   // one row of a stage's latency/throughput profile
  kWeightModule = 8,   // a weight module the daemon may plan to offload
  kKvBlocks = 9,       // block hashes stored in or removed from a KV medium (published for routers)
  // runner → daemon
  kSessionOpen = 16,
  kSessionClose = 17,
  kToolStart = 18,
  kToolEnd = 19,
  // daemon → client
  kAdmit = 32,
  kPause = 33,
  kRestore = 34,
  kPriority = 35,
  kPin = 36,
  kUnpin = 37,
  kDrop = 38,
  kOffload = 39,
  kPrefetch = 40,
  kClose = 41,  // the session is over (its runner closed it, an operator killed it): forget it
};

enum class Direction : std::uint8_t { kToDaemon, kToClient };

// "ROUND_SUBMIT", …; "UNKNOWN" for anything else.
std::string_view record_type_name(RecordType t);

struct RecordHeader {
  std::uint16_t type;
  std::uint8_t version;
  std::uint8_t flags;  // per-type bits, below
  std::uint32_t reserved;
  std::uint64_t session;      // base::session_id(); 0 only for KV_STATS
  std::int64_t timestamp_ns;  // sender's CLOCK_MONOTONIC (base::to_ns)
};
static_assert(sizeof(RecordHeader) == 24);
static_assert(offsetof(RecordHeader, session) == 8);
static_assert(offsetof(RecordHeader, timestamp_ns) == 16);

constexpr RecordHeader make_header(RecordType t) {
  return RecordHeader{static_cast<std::uint16_t>(t), kRecordVersion, 0, 0, 0, 0};
}

// ROUND_END flags.
inline constexpr std::uint8_t kRoundEndToolFollows = 1u << 0;

// ---- engine → daemon -------------------------------------------------------

struct RoundSubmit {
  static constexpr RecordType kType = RecordType::kRoundSubmit;
  RecordHeader header = make_header(kType);
  std::uint32_t round = 0;              // 0-based round index within the session
  std::uint32_t prompt_tokens = 0;      // whole context of this call
  std::uint32_t cached_tokens = 0;      // prefix already in the KV cache (≤ prompt_tokens)
  std::uint32_t projected_blocks = 0;   // KV blocks the round will hold at its end
  std::uint32_t max_output_tokens = 0;  // 0 = engine default
  std::uint32_t reserved[5] = {};
};

struct RoundFirstToken {
  static constexpr RecordType kType = RecordType::kRoundFirstToken;
  RecordHeader header = make_header(kType);
  std::uint32_t round = 0;
  std::uint32_t reserved0 = 0;
  std::uint64_t queue_delay_ns = 0;  // submit → first scheduled
  std::uint64_t prefill_ns = 0;      // first scheduled → first token
  std::uint64_t reserved[2] = {};
};

struct RoundEnd {  // flags: kRoundEndToolFollows
  static constexpr RecordType kType = RecordType::kRoundEnd;
  RecordHeader header = make_header(kType);
  std::uint32_t round = 0;
  std::uint32_t output_tokens = 0;
  std::uint32_t blocks_held = 0;  // KV blocks the session holds now
  std::uint32_t reserved[7] = {};
};

struct KvStats {  // session = 0: the engine's whole pool
  static constexpr RecordType kType = RecordType::kKvStats;
  RecordHeader header = make_header(kType);
  std::uint32_t blocks_total = 0;
  std::uint32_t blocks_free = 0;
  std::uint32_t blocks_pinned = 0;     // allocated and held against eviction
  std::uint32_t blocks_offloaded = 0;  // in host memory (not part of blocks_total)
  std::uint32_t running_seqs = 0;
  std::uint32_t waiting_seqs = 0;
  std::uint32_t step_tokens = 0;   // tokens in the last step
  std::uint32_t step_time_us = 0;  // duration of the last step
  std::uint64_t block_bytes = 0;   // device bytes of one KV block (all layers); 0 = unknown
};

enum class KvEventKind : std::uint8_t { kEvicted = 1, kRestored = 2, kOffloaded = 3, kDropped = 4 };

struct KvEvent {
  static constexpr RecordType kType = RecordType::kKvEvent;
  RecordHeader header = make_header(kType);
  std::uint8_t kind = 0;  // KvEventKind
  std::uint8_t reserved0[3] = {};
  std::uint32_t blocks = 0;
  std::uint32_t round = 0;
  std::uint32_t reserved1 = 0;
  std::uint64_t reserved[3] = {};
};

// Block hashes of the engine's prefix cache, stored in or removed from a
// medium (the device, or host memory after an offload). tandemd publishes
// them as vLLM-format KV events for routers (docs/daemon.md "KV events for
// routers"); the session is a label (records of one session and op are
// batched into one event), not a state the daemon checks. A run of more
// than kKvBlocksPerRecord blocks takes several records, each naming the
// block before its first as parent (flag kKvBlocksHasParent). Token ids do
// not travel (the event's token_ids list is empty).
inline constexpr std::uint32_t kKvBlocksPerRecord = 3;
inline constexpr std::uint32_t kMaxKvBlockSize = 1u << 20;   // tokens per block
inline constexpr std::uint8_t kKvBlocksHasParent = 1u << 0;  // KV_BLOCKS flags: `parent` is set

enum class KvBlocksOp : std::uint8_t { kStored = 1, kRemoved = 2 };
enum class KvMedium : std::uint8_t { kGpu = 0, kCpu = 1 };

struct KvBlocks {  // flags: kKvBlocksHasParent
  static constexpr RecordType kType = RecordType::kKvBlocks;
  RecordHeader header = make_header(kType);
  std::uint8_t op = 0;      // KvBlocksOp
  std::uint8_t medium = 0;  // KvMedium
  std::uint8_t count = 0;   // hashes, 1..kKvBlocksPerRecord
  std::uint8_t reserved0 = 0;
  std::uint32_t block_size = 0;                   // tokens per block: stored 1..kMaxKvBlockSize, removed 0
  std::uint64_t parent = 0;                       // the block before hashes[0] (kKvBlocksHasParent), else 0
  std::uint64_t hashes[kKvBlocksPerRecord] = {};  // 0 past count
};

// The partitions of an engine's green-context pool, sent once it is built (and
// again on every resync). The daemon publishes an index into them on the
// status page (EngineStatus::sm_partition). Session 0.
inline constexpr std::uint32_t kMaxGpuPartitions = 16;

struct GpuPartitions {
  static constexpr RecordType kType = RecordType::kGpuPartitions;
  RecordHeader header = make_header(kType);
  std::uint8_t count = 0;  // partitions, 1..kMaxGpuPartitions
  std::uint8_t reserved0 = 0;
  std::uint16_t device_sms = 0;  // SMs on the device
  std::uint32_t pool_id = 0;     // non-zero, new for every pool the engine opens (EngineStatus::sm_partition_pool)
  std::uint16_t decode_sms[kMaxGpuPartitions] = {};  // decode SMs of partition i, strictly increasing; 0 past count
};

// Stages a profile may describe.
enum class GpuStage : std::uint8_t { kDecode = 0, kPrefill = 1 };

// One row of a stage's profile (Nova: latency and throughput against SM
// count). Rows of one profile are sent in order 0..row_count-1; the daemon
// takes the profile when the last row arrives. Session 0.
inline constexpr std::uint32_t kMaxProfileRows = 64;

struct StageProfileRow {
  static constexpr RecordType kType = RecordType::kStageProfile;
  RecordHeader header = make_header(kType);
  std::uint8_t stage = 0;      // GpuStage
  std::uint8_t row = 0;        // 0-based, < row_count
  std::uint8_t row_count = 0;  // 1..kMaxProfileRows
  std::uint8_t reserved0 = 0;
  std::uint32_t sm_count = 0;  // > 0
  double latency_s = 0.0;      // one step, finite and > 0
  double throughput = 0.0;     // work per second, finite and >= 0
  std::uint64_t reserved[2] = {};
};

// A weight module the engine can stream from host memory with a LayerStreamer
// (Nova): L layers of `bytes / layers` each, K device slots when offloaded,
// T microseconds of compute per layer. The daemon sets bit `index` of
// EngineStatus::offload_plan to ask for it to be offloaded. Session 0.
inline constexpr std::uint32_t kMaxWeightModules = 64;

struct WeightModule {
  static constexpr RecordType kType = RecordType::kWeightModule;
  RecordHeader header = make_header(kType);
  std::uint8_t index = 0;              // < kMaxWeightModules
  std::uint8_t slots = 0;              // K when offloaded, 2 <= K < layers
  std::uint16_t layers = 0;            // L, >= 3
  std::uint32_t layer_compute_us = 0;  // T, > 0
  std::uint64_t bytes = 0;             // the whole module on the device, > 0
  char name[24] = {};                  // NUL-padded, printable ASCII
};

// ---- runner → daemon -------------------------------------------------------

inline constexpr std::uint8_t kPriorityClasses = 4;  // 0 = default … 3 = background

struct SessionOpen {
  static constexpr RecordType kType = RecordType::kSessionOpen;
  RecordHeader header = make_header(kType);
  std::uint8_t priority_class = 0;  // < kPriorityClasses
  std::uint8_t reserved0[3] = {};
  std::uint32_t expected_rounds = 0;  // 0 = unknown
  std::uint64_t reserved[4] = {};
};

enum class CloseReason : std::uint8_t { kNormal = 0, kError = 1, kCancelled = 2 };

struct SessionClose {
  static constexpr RecordType kType = RecordType::kSessionClose;
  RecordHeader header = make_header(kType);
  std::uint8_t reason = 0;  // CloseReason
  std::uint8_t reserved0[7] = {};
  std::uint64_t reserved[4] = {};
};

struct ToolStart {
  static constexpr RecordType kType = RecordType::kToolStart;
  RecordHeader header = make_header(kType);
  std::uint64_t tool_kind = 0;  // base::tool_kind_id(name), non-zero
  std::uint32_t tool_call = 0;  // runner-chosen id, unique within the session
  std::uint32_t pid = 0;        // 0 if not (yet) known
  std::uint64_t cgroup_id = 0;  // 0 if not in a tandem cgroup
  std::uint64_t reserved[2] = {};
};

struct ToolEnd {
  static constexpr RecordType kType = RecordType::kToolEnd;
  RecordHeader header = make_header(kType);
  std::uint64_t tool_kind = 0;
  std::uint32_t tool_call = 0;
  std::int32_t exit_code = 0;  // as from waitpid: ≥ 0 exit status, < 0 −signal
  std::uint64_t wall_ns = 0;
  std::uint64_t cpu_ns = 0;
  std::uint64_t peak_memory_bytes = 0;
};

// ---- daemon → client -------------------------------------------------------

template <RecordType T>
struct Directive {  // ADMIT, PAUSE, UNPIN, DROP, OFFLOAD, PREFETCH, CLOSE: no payload
  static constexpr RecordType kType = T;
  RecordHeader header = make_header(kType);
  std::uint64_t reserved[5] = {};
};
using Admit = Directive<RecordType::kAdmit>;
using Pause = Directive<RecordType::kPause>;
using Unpin = Directive<RecordType::kUnpin>;
using Drop = Directive<RecordType::kDrop>;
using Offload = Directive<RecordType::kOffload>;
using Prefetch = Directive<RecordType::kPrefetch>;
using Close = Directive<RecordType::kClose>;

struct Restore {
  static constexpr RecordType kType = RecordType::kRestore;
  RecordHeader header = make_header(kType);
  std::uint32_t engine = 0;  // client id of the engine that should run the session
  std::uint32_t reserved0 = 0;
  std::uint64_t reserved[4] = {};
};

inline constexpr std::uint8_t kPriorityLevels = 8;  // MLFQ levels, 0 = highest

struct Priority {
  static constexpr RecordType kType = RecordType::kPriority;
  RecordHeader header = make_header(kType);
  std::uint8_t level = 0;  // < kPriorityLevels
  std::uint8_t reserved0[7] = {};
  std::uint64_t reserved[4] = {};
};

struct Pin {
  static constexpr RecordType kType = RecordType::kPin;
  RecordHeader header = make_header(kType);
  std::int64_t until_ns = 0;  // CLOCK_MONOTONIC deadline of the pin, > 0
  std::uint64_t reserved[4] = {};
};

#define TANDEM_RECORD_LAYOUT(T)            \
  static_assert(sizeof(T) == kSlotSize);   \
  static_assert(offsetof(T, header) == 0); \
  static_assert(std::is_trivially_copyable_v<T>)
TANDEM_RECORD_LAYOUT(RoundSubmit);
TANDEM_RECORD_LAYOUT(RoundFirstToken);
TANDEM_RECORD_LAYOUT(RoundEnd);
TANDEM_RECORD_LAYOUT(KvStats);
TANDEM_RECORD_LAYOUT(KvEvent);
TANDEM_RECORD_LAYOUT(GpuPartitions);
TANDEM_RECORD_LAYOUT(StageProfileRow);
TANDEM_RECORD_LAYOUT(WeightModule);
TANDEM_RECORD_LAYOUT(KvBlocks);
TANDEM_RECORD_LAYOUT(SessionOpen);
TANDEM_RECORD_LAYOUT(SessionClose);
TANDEM_RECORD_LAYOUT(ToolStart);
TANDEM_RECORD_LAYOUT(ToolEnd);
TANDEM_RECORD_LAYOUT(Admit);
TANDEM_RECORD_LAYOUT(Restore);
TANDEM_RECORD_LAYOUT(Priority);
TANDEM_RECORD_LAYOUT(Pin);
#undef TANDEM_RECORD_LAYOUT
static_assert(offsetof(RoundSubmit, round) == 24 && offsetof(RoundSubmit, max_output_tokens) == 40);
static_assert(offsetof(RoundFirstToken, queue_delay_ns) == 32 && offsetof(RoundFirstToken, prefill_ns) == 40);
static_assert(offsetof(RoundEnd, blocks_held) == 32);
static_assert(offsetof(KvStats, step_time_us) == 52);
static_assert(offsetof(KvEvent, blocks) == 28);
static_assert(offsetof(GpuPartitions, pool_id) == 28 && offsetof(GpuPartitions, decode_sms) == 32);
static_assert(offsetof(StageProfileRow, latency_s) == 32 && offsetof(StageProfileRow, throughput) == 40);
static_assert(offsetof(WeightModule, bytes) == 32 && offsetof(WeightModule, name) == 40);
static_assert(offsetof(KvBlocks, block_size) == 28 && offsetof(KvBlocks, parent) == 32 &&
              offsetof(KvBlocks, hashes) == 40);
static_assert(offsetof(ToolStart, cgroup_id) == 40);
static_assert(offsetof(ToolEnd, exit_code) == 36 && offsetof(ToolEnd, peak_memory_bytes) == 56);
static_assert(offsetof(Restore, engine) == 24 && offsetof(Pin, until_ns) == 24);

// A record as a slot, ready for RingProducer::try_push().
template <class T>
Slot encode(const T& record) {
  return std::bit_cast<Slot>(record);
}

// The same, with the header's session and sender's CLOCK_MONOTONIC time
// (base::to_ns) filled in.
template <class T>
Slot encode(T record, std::uint64_t session, std::int64_t timestamp_ns) {
  record.header.session = session;
  record.header.timestamp_ns = timestamp_ns;
  return std::bit_cast<Slot>(record);
}

// A validated record. Thread-safety: a value type.
class Record {
 public:
  Record() = default;

  RecordType type() const { return static_cast<RecordType>(header().type); }
  std::uint64_t session() const { return header().session; }
  std::int64_t timestamp_ns() const { return header().timestamp_ns; }
  RecordHeader header() const {
    RecordHeader h;
    std::memcpy(&h, &slot_, sizeof h);
    return h;
  }

  // The record as its type. REQUIRES: type() == T::kType.
  template <class T>
  T as() const {
    return std::bit_cast<T>(slot_);
  }
  const Slot& slot() const { return slot_; }

 private:
  friend struct RecordDecoder;
  Slot slot_{};
};

enum class DecodeStatus : std::uint8_t { kOk, kUnknownType, kWrongDirection, kBadVersion, kBadField };

// Validates slots arriving in one direction and counts what it rejected.
// Thread-safety: one thread.
struct RecordDecoder {
  explicit RecordDecoder(Direction dir) : direction(dir) {}

  // Fills `out` only when the result is kOk. On kBadField, `problem` (if
  // given) names the field: "ROUND_SUBMIT: cached_tokens > prompt_tokens".
  DecodeStatus decode(const Slot& raw, Record& out, std::string_view* problem = nullptr);

  Direction direction;
  std::uint64_t ok = 0;
  std::uint64_t unknown_type = 0;
  std::uint64_t wrong_direction = 0;
  std::uint64_t bad_version = 0;
  std::uint64_t bad_field = 0;
};

}  // namespace tandem::ipc
