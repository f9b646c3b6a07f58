// Record validation: one function per type, all fields checked after the copy.
#include "ipc/records.h"

#include <algorithm>
#include <cmath>

namespace tandem::ipc {
namespace {

// What a validator reports: nullptr for "valid", else the problem.
using Problem = const char*;

template <class T, std::size_t N>
bool all_zero(const T (&a)[N]) {
  return std::all_of(std::begin(a), std::end(a), [](T v) { return v == T{}; });
}

// Fields common to every type: flags, session and timestamp. (ring_seq
// belongs to the ring, which clears it on pop.)
Problem check_header(const RecordHeader& h, std::uint8_t allowed_flags, bool session_required) {
  if ((h.flags & ~allowed_flags) != 0) return "unknown flag bits";
  if (session_required && h.session == 0) return "session id is 0";
  if (!session_required && h.session != 0) return "session id must be 0";
  if (h.timestamp_ns < 0) return "negative timestamp";
  return nullptr;
}

Problem check(const RoundSubmit& r, bool strict) {
  if (r.prompt_tokens == 0) return "prompt_tokens is 0";
  if (r.cached_tokens > r.prompt_tokens) return "cached_tokens > prompt_tokens";
  if (strict && !all_zero(r.reserved)) return "reserved field is not zero";
  return nullptr;
}

Problem check(const RoundFirstToken& r, bool strict) {
  if (strict && (r.reserved0 != 0 || !all_zero(r.reserved))) return "reserved field is not zero";
  return nullptr;
}

Problem check(const RoundEnd& r, bool strict) {
  if (strict && !all_zero(r.reserved)) return "reserved field is not zero";
  return nullptr;
}

Problem check(const KvStats& r, bool /*strict*/) {
  if (r.blocks_total == 0) return "blocks_total is 0";
  if (r.blocks_free > r.blocks_total) return "blocks_free > blocks_total";
  // Pinned blocks are allocated, so they come out of the non-free part.
  if (r.blocks_pinned > r.blocks_total - r.blocks_free) return "blocks_pinned > allocated blocks";
  return nullptr;
}

Problem check(const GpuPartitions& r, bool strict) {
  if (r.count == 0 || r.count > kMaxGpuPartitions) return "count outside 1..16";
  if (r.device_sms == 0) return "device_sms is 0";
  if (r.pool_id == 0) return "pool_id is 0";
  for (std::uint32_t i = 0; i < kMaxGpuPartitions; ++i) {
    if (i >= r.count) {
      if (r.decode_sms[i] != 0) return "decode_sms past count is not zero";
      continue;
    }
    if (r.decode_sms[i] == 0) return "decode_sms is 0";
    if (r.decode_sms[i] > r.device_sms) return "decode_sms > device_sms";
    if (i > 0 && r.decode_sms[i] <= r.decode_sms[i - 1]) return "decode_sms not strictly increasing";
  }
  if (strict && r.reserved0 != 0) return "reserved field is not zero";
  return nullptr;
}

Problem check(const StageProfileRow& r, bool strict) {
  if (r.stage > static_cast<std::uint8_t>(GpuStage::kPrefill)) return "unknown stage";
  if (r.row_count == 0 || r.row_count > kMaxProfileRows) return "row_count outside 1..64";
  if (r.row >= r.row_count) return "row >= row_count";
  if (r.sm_count == 0) return "sm_count is 0";
  if (!std::isfinite(r.latency_s) || r.latency_s <= 0) return "latency_s not finite and > 0";
  if (!std::isfinite(r.throughput) || r.throughput < 0) return "throughput not finite and >= 0";
  if (strict && (r.reserved0 != 0 || !all_zero(r.reserved))) return "reserved field is not zero";
  return nullptr;
}

Problem check(const WeightModule& r, bool /*strict*/) {
  if (r.index >= kMaxWeightModules) return "index >= 64";
  if (r.layers < 3) return "layers < 3";
  if (r.slots < 2 || r.slots >= r.layers) return "slots outside 2..layers-1";
  if (r.layer_compute_us == 0) return "layer_compute_us is 0";
  if (r.bytes == 0) return "bytes is 0";
  bool ended = false;
  for (char c : r.name) {
    if (c == 0) {
      ended = true;
    } else if (ended || c < 0x20 || c > 0x7e) {
      return "name not NUL-padded printable ASCII";
    }
  }
  return nullptr;
}

Problem check(const KvEvent& r, bool strict) {
  if (r.kind < static_cast<std::uint8_t>(KvEventKind::kEvicted) ||
      r.kind > static_cast<std::uint8_t>(KvEventKind::kDropped)) {
    return "unknown kind";
  }
  if (strict && (!all_zero(r.reserved0) || r.reserved1 != 0 || !all_zero(r.reserved))) {
    return "reserved field is not zero";
  }
  return nullptr;
}

Problem check(const KvBlocks& r, bool strict) {
  const bool stored = r.op == static_cast<std::uint8_t>(KvBlocksOp::kStored);
  if (!stored && r.op != static_cast<std::uint8_t>(KvBlocksOp::kRemoved)) return "unknown op";
  if (r.medium > static_cast<std::uint8_t>(KvMedium::kCpu)) return "unknown medium";
  if (r.count == 0 || r.count > kKvBlocksPerRecord) return "count outside 1..3";
  if (stored && (r.block_size == 0 || r.block_size > kMaxKvBlockSize)) return "block_size outside 1..2^20";
  if (!stored && r.block_size != 0) return "block_size of a removal is not 0";
  if (!stored && (r.header.flags & kKvBlocksHasParent) != 0) return "a removal has a parent";
  if ((r.header.flags & kKvBlocksHasParent) == 0 && r.parent != 0) return "parent without kKvBlocksHasParent";
  for (std::uint32_t i = r.count; i < kKvBlocksPerRecord; ++i) {
    if (r.hashes[i] != 0) return "hashes past count are not zero";
  }
  if (strict && r.reserved0 != 0) return "reserved field is not zero";
  return nullptr;
}

Problem check(const SessionOpen& r, bool strict) {
  if (r.priority_class >= kPriorityClasses) return "priority_class out of range";
  if (strict && (!all_zero(r.reserved0) || !all_zero(r.reserved))) return "reserved field is not zero";
  return nullptr;
}

Problem check(const SessionClose& r, bool strict) {
  if (r.reason > static_cast<std::uint8_t>(CloseReason::kCancelled)) return "unknown reason";
  if (strict && (!all_zero(r.reserved0) || !all_zero(r.reserved))) return "reserved field is not zero";
  return nullptr;
}

Problem check(const ToolStart& r, bool strict) {
  if (r.tool_kind == 0) return "tool_kind is 0";
  if (r.pid > 0x3fffffff) return "pid out of range";  // PID_MAX_LIMIT is 2^22
  if (strict && !all_zero(r.reserved)) return "reserved field is not zero";
  return nullptr;
}

Problem check(const ToolEnd& r, bool /*strict*/) {
  if (r.tool_kind == 0) return "tool_kind is 0";
  if (r.exit_code < -64 || r.exit_code > 255) return "exit_code is neither a status nor a signal";
  return nullptr;
}

template <RecordType T>
Problem check(const Directive<T>& r, bool strict) {
  if (strict && !all_zero(r.reserved)) return "reserved field is not zero";
  return nullptr;
}

Problem check(const Restore& r, bool strict) {
  if (strict && (r.reserved0 != 0 || !all_zero(r.reserved))) return "reserved field is not zero";
  return nullptr;
}

Problem check(const Priority& r, bool strict) {
  if (r.level >= kPriorityLevels) return "level out of range";
  if (strict && (!all_zero(r.reserved0) || !all_zero(r.reserved))) return "reserved field is not zero";
  return nullptr;
}

Problem check(const Pin& r, bool strict) {
  if (r.until_ns <= 0) return "until_ns is not a deadline";
  if (strict && !all_zero(r.reserved)) return "reserved field is not zero";
  return nullptr;
}

struct Verdict {
  DecodeStatus status;
  Problem problem;
};

template <class T>
Verdict validate(const Slot& raw, Direction expected, Direction actual, std::uint8_t allowed_flags,
                 bool session_required) {
  if (expected != actual) return {DecodeStatus::kWrongDirection, "record travels the other way"};
  T r = std::bit_cast<T>(raw);
  if (r.header.version == 0) return {DecodeStatus::kBadVersion, "version 0"};
  bool strict = r.header.version == kRecordVersion;
  if (Problem p = check_header(r.header, allowed_flags, session_required)) return {DecodeStatus::kBadField, p};
  if (Problem p = check(r, strict)) return {DecodeStatus::kBadField, p};
  return {DecodeStatus::kOk, nullptr};
}

Verdict validate_any(const Slot& raw, Direction dir) {
  RecordHeader h;
  std::memcpy(&h, &raw, sizeof h);
  constexpr auto kUp = Direction::kToDaemon;
  constexpr auto kDown = Direction::kToClient;
  switch (static_cast<RecordType>(h.type)) {
    case RecordType::kRoundSubmit:
      return validate<RoundSubmit>(raw, kUp, dir, 0, true);
    case RecordType::kRoundFirstToken:
      return validate<RoundFirstToken>(raw, kUp, dir, 0, true);
    case RecordType::kRoundEnd:
      return validate<RoundEnd>(raw, kUp, dir, kRoundEndToolFollows, true);
    case RecordType::kKvStats:
      return validate<KvStats>(raw, kUp, dir, 0, false);
    case RecordType::kKvEvent:
      return validate<KvEvent>(raw, kUp, dir, 0, true);
    case RecordType::kGpuPartitions:
      return validate<GpuPartitions>(raw, kUp, dir, 0, false);
    case RecordType::kStageProfile:
      return validate<StageProfileRow>(raw, kUp, dir, 0, false);
    case RecordType::kWeightModule:
      return validate<WeightModule>(raw, kUp, dir, 0, false);
    case RecordType::kKvBlocks:
      return validate<KvBlocks>(raw, kUp, dir, kKvBlocksHasParent, true);
    case RecordType::kSessionOpen:
      return validate<SessionOpen>(raw, kUp, dir, 0, true);
    case RecordType::kSessionClose:
      return validate<SessionClose>(raw, kUp, dir, 0, true);
    case RecordType::kToolStart:
      return validate<ToolStart>(raw, kUp, dir, 0, true);
    case RecordType::kToolEnd:
      return validate<ToolEnd>(raw, kUp, dir, 0, true);
    case RecordType::kAdmit:
      return validate<Admit>(raw, kDown, dir, 0, true);
    case RecordType::kPause:
      return validate<Pause>(raw, kDown, dir, 0, true);
    case RecordType::kRestore:
      return validate<Restore>(raw, kDown, dir, 0, true);
    case RecordType::kPriority:
      return validate<Priority>(raw, kDown, dir, 0, true);
    case RecordType::kPin:
      return validate<Pin>(raw, kDown, dir, 0, true);
    case RecordType::kUnpin:
      return validate<Unpin>(raw, kDown, dir, 0, true);
    case RecordType::kDrop:
      return validate<Drop>(raw, kDown, dir, 0, true);
    case RecordType::kOffload:
      return validate<Offload>(raw, kDown, dir, 0, true);
    case RecordType::kPrefetch:
      return validate<Prefetch>(raw, kDown, dir, 0, true);
    case RecordType::kClose:
      return validate<Close>(raw, kDown, dir, 0, true);
  }
  return {DecodeStatus::kUnknownType, "unknown record type"};
}

}  // namespace

std::string_view record_type_name(RecordType t) {
  switch (t) {
    case RecordType::kRoundSubmit:
      return "ROUND_SUBMIT";
    case RecordType::kRoundFirstToken:
      return "ROUND_FIRST_TOKEN";
    case RecordType::kRoundEnd:
      return "ROUND_END";
    case RecordType::kKvStats:
      return "KV_STATS";
    case RecordType::kKvEvent:
      return "KV_EVENT";
    case RecordType::kGpuPartitions:
      return "GPU_PARTITIONS";
    case RecordType::kStageProfile:
      return "STAGE_PROFILE";
    case RecordType::kWeightModule:
      return "WEIGHT_MODULE";
    case RecordType::kKvBlocks:
      return "KV_BLOCKS";
    case RecordType::kSessionOpen:
      return "SESSION_OPEN";
    case RecordType::kSessionClose:
      return "SESSION_CLOSE";
    case RecordType::kToolStart:
      return "TOOL_START";
    case RecordType::kToolEnd:
      return "TOOL_END";
    case RecordType::kAdmit:
      return "ADMIT";
    case RecordType::kPause:
      return "PAUSE";
    case RecordType::kRestore:
      return "RESTORE";
    case RecordType::kPriority:
      return "PRIORITY";
    case RecordType::kPin:
      return "PIN";
    case RecordType::kUnpin:
      return "UNPIN";
    case RecordType::kDrop:
      return "DROP";
    case RecordType::kOffload:
      return "OFFLOAD";
    case RecordType::kPrefetch:
      return "PREFETCH";
    case RecordType::kClose:
      return "CLOSE";
  }
  return "UNKNOWN";
}

DecodeStatus RecordDecoder::decode(const Slot& raw, Record& out, std::string_view* problem) {
  Verdict v = validate_any(raw, direction);
  switch (v.status) {
    case DecodeStatus::kOk:
      ++ok;
      out.slot_ = raw;
      return v.status;
    case DecodeStatus::kUnknownType:
      ++unknown_type;
      break;
    case DecodeStatus::kWrongDirection:
      ++wrong_direction;
      break;
    case DecodeStatus::kBadVersion:
      ++bad_version;
      break;
    case DecodeStatus::kBadField:
      ++bad_field;
      break;
  }
  if (problem != nullptr) *problem = v.problem;
  return v.status;
}

}  // namespace tandem::ipc
