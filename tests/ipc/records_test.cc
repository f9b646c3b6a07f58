// Wire records: every type round-trips, every rule rejects what it should,
// and unknown or misdirected records are counted, not decoded.
#include "ipc/records.h"

#include <cstring>

#include <gtest/gtest.h>

namespace tandem::ipc {
namespace {

template <class T>
T with_session(T r, std::uint64_t session = 42) {
  r.header.session = session;
  r.header.timestamp_ns = 1000;
  return r;
}

RoundSubmit good_submit() {
  RoundSubmit r = with_session(RoundSubmit{});
  r.round = 3;
  r.prompt_tokens = 4000;
  r.cached_tokens = 3500;
  r.projected_blocks = 260;
  return r;
}

// Decodes `r` travelling `dir`; returns the status and the problem text.
template <class T>
std::pair<DecodeStatus, std::string> decode(const T& r, Direction dir = Direction::kToDaemon) {
  RecordDecoder d(dir);
  Record out;
  std::string_view problem;
  DecodeStatus s = d.decode(encode(r), out, &problem);
  return {s, std::string(problem)};
}

TEST(Records, RoundSubmitRoundTrips) {
  RecordDecoder d(Direction::kToDaemon);
  Record out;
  ASSERT_EQ(d.decode(encode(good_submit()), out), DecodeStatus::kOk);
  EXPECT_EQ(out.type(), RecordType::kRoundSubmit);
  EXPECT_EQ(out.session(), 42u);
  EXPECT_EQ(out.timestamp_ns(), 1000);
  auto r = out.as<RoundSubmit>();
  EXPECT_EQ(r.round, 3u);
  EXPECT_EQ(r.cached_tokens, 3500u);
  EXPECT_EQ(d.ok, 1u);
}

TEST(Records, EveryValidRecordDecodes) {
  KvStats kv{};
  kv.blocks_total = 1000;
  kv.blocks_free = 200;
  kv.blocks_pinned = 800;
  KvEvent ev = with_session(KvEvent{});
  ev.kind = static_cast<std::uint8_t>(KvEventKind::kOffloaded);
  ToolStart ts = with_session(ToolStart{});
  ts.tool_kind = 7;
  ToolEnd te = with_session(ToolEnd{});
  te.tool_kind = 7;
  te.exit_code = -9;
  Pin pin = with_session(Pin{});
  pin.until_ns = 5;
  Priority prio = with_session(Priority{});
  prio.level = kPriorityLevels - 1;

  EXPECT_EQ(decode(kv).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(ev).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(RoundFirstToken{})).first, DecodeStatus::kOk);
  RoundEnd end = with_session(RoundEnd{});
  end.header.flags = kRoundEndToolFollows;
  EXPECT_EQ(decode(end).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(SessionOpen{})).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(SessionClose{})).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(ts).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(te).first, DecodeStatus::kOk);
  KvBlocks stored = with_session(KvBlocks{});
  stored.op = static_cast<std::uint8_t>(KvBlocksOp::kStored);
  stored.header.flags = kKvBlocksHasParent;
  stored.parent = 11;
  stored.count = kKvBlocksPerRecord;
  stored.block_size = 16;
  stored.hashes[0] = 1, stored.hashes[1] = 2, stored.hashes[2] = 3;
  EXPECT_EQ(decode(stored).first, DecodeStatus::kOk);
  KvBlocks removed = with_session(KvBlocks{});
  removed.op = static_cast<std::uint8_t>(KvBlocksOp::kRemoved);
  removed.medium = static_cast<std::uint8_t>(KvMedium::kCpu);
  removed.count = 1;
  EXPECT_EQ(decode(removed).first, DecodeStatus::kOk);
  const auto down = Direction::kToClient;
  EXPECT_EQ(decode(with_session(Admit{}), down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(Pause{}), down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(Restore{}), down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(prio, down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(pin, down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(Unpin{}), down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(Drop{}), down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(Offload{}), down).first, DecodeStatus::kOk);
  EXPECT_EQ(decode(with_session(Prefetch{}), down).first, DecodeStatus::kOk);
}

struct BadCase {
  const char* name;
  Slot slot;
  DecodeStatus status;
  const char* problem;
};

template <class T, class F>
Slot mutated(T r, F f) {
  f(r);
  return encode(r);
}

std::vector<BadCase> bad_cases() {
  auto s = good_submit();
  KvStats kv{};
  kv.blocks_total = 100;
  KvBlocks blocks = with_session(KvBlocks{});
  blocks.op = static_cast<std::uint8_t>(KvBlocksOp::kStored);
  blocks.count = 1;
  blocks.block_size = 16;
  blocks.hashes[0] = 5;
  KvBlocks removal = blocks;
  removal.op = static_cast<std::uint8_t>(KvBlocksOp::kRemoved);
  removal.block_size = 0;
  return {
      {"KvBlocksOp", mutated(blocks, [](auto& r) { r.op = 3; }), DecodeStatus::kBadField, "unknown op"},
      {"KvBlocksMedium", mutated(blocks, [](auto& r) { r.medium = 2; }), DecodeStatus::kBadField, "unknown medium"},
      {"KvBlocksNone", mutated(blocks, [](auto& r) { r.count = 0; }), DecodeStatus::kBadField, "count outside"},
      {"KvBlocksTooMany", mutated(blocks, [](auto& r) { r.count = kKvBlocksPerRecord + 1; }), DecodeStatus::kBadField,
       "count outside"},
      {"KvBlocksNoSize", mutated(blocks, [](auto& r) { r.block_size = 0; }), DecodeStatus::kBadField,
       "block_size outside"},
      {"KvBlocksHugeSize", mutated(blocks, [](auto& r) { r.block_size = kMaxKvBlockSize + 1; }),
       DecodeStatus::kBadField, "block_size outside"},
      {"KvBlocksRemovalSize", mutated(removal, [](auto& r) { r.block_size = 16; }), DecodeStatus::kBadField,
       "block_size of a removal"},
      {"KvBlocksRemovalParent", mutated(removal, [](auto& r) { r.header.flags = kKvBlocksHasParent; }),
       DecodeStatus::kBadField, "a removal has a parent"},
      {"KvBlocksStrayParent", mutated(blocks, [](auto& r) { r.parent = 9; }), DecodeStatus::kBadField,
       "parent without"},
      {"KvBlocksPastCount", mutated(blocks, [](auto& r) { r.hashes[2] = 9; }), DecodeStatus::kBadField,
       "hashes past count"},
      {"KvBlocksNoSession", mutated(blocks, [](auto& r) { r.header.session = 0; }), DecodeStatus::kBadField,
       "session id is 0"},
      {"CachedExceedsPrompt", mutated(s, [](auto& r) { r.cached_tokens = r.prompt_tokens + 1; }),
       DecodeStatus::kBadField, "cached_tokens > prompt_tokens"},
      {"EmptyPrompt", mutated(s, [](auto& r) { r.prompt_tokens = r.cached_tokens = 0; }), DecodeStatus::kBadField,
       "prompt_tokens is 0"},
      {"NoSession", mutated(s, [](auto& r) { r.header.session = 0; }), DecodeStatus::kBadField, "session id is 0"},
      {"NegativeTime", mutated(s, [](auto& r) { r.header.timestamp_ns = -1; }), DecodeStatus::kBadField,
       "negative timestamp"},
      {"UnknownFlag", mutated(s, [](auto& r) { r.header.flags = 0x80; }), DecodeStatus::kBadField, "unknown flag bits"},
      {"ReservedPayload", mutated(s, [](auto& r) { r.reserved[4] = 1; }), DecodeStatus::kBadField, "reserved"},
      {"VersionZero", mutated(s, [](auto& r) { r.header.version = 0; }), DecodeStatus::kBadVersion, "version 0"},
      {"UnknownType", mutated(s, [](auto& r) { r.header.type = 999; }), DecodeStatus::kUnknownType, "unknown"},
      {"DirectiveFromClient", encode(with_session(Admit{})), DecodeStatus::kWrongDirection, "other way"},
      {"StatsWithSession", mutated(kv, [](auto& r) { r.header.session = 5; }), DecodeStatus::kBadField,
       "session id must be 0"},
      {"StatsNoBlocks", mutated(kv, [](auto& r) { r.blocks_total = 0; }), DecodeStatus::kBadField, "blocks_total is 0"},
      {"StatsFreeTooBig", mutated(kv, [](auto& r) { r.blocks_free = 101; }), DecodeStatus::kBadField,
       "blocks_free > blocks_total"},
      {"StatsPinnedTooBig", mutated(kv, [](auto& r) { r.blocks_free = 50, r.blocks_pinned = 51; }),
       DecodeStatus::kBadField, "blocks_pinned > allocated"},
      {"KvEventKind", encode(with_session(KvEvent{})), DecodeStatus::kBadField, "unknown kind"},
      {"ToolKindZero", encode(with_session(ToolStart{})), DecodeStatus::kBadField, "tool_kind is 0"},
      {"ExitCodeGarbage", mutated(with_session(ToolEnd{}), [](auto& r) { r.tool_kind = 1, r.exit_code = 1000; }),
       DecodeStatus::kBadField, "exit_code"},
      {"PriorityClass", mutated(with_session(SessionOpen{}), [](auto& r) { r.priority_class = kPriorityClasses; }),
       DecodeStatus::kBadField, "priority_class"},
      {"CloseReason", mutated(with_session(SessionClose{}), [](auto& r) { r.reason = 9; }), DecodeStatus::kBadField,
       "unknown reason"},
  };
}

TEST(Records, BadRecordsAreRejectedWithTheirProblem) {
  for (const BadCase& c : bad_cases()) {
    RecordDecoder d(Direction::kToDaemon);
    Record out;
    std::string_view problem;
    EXPECT_EQ(d.decode(c.slot, out, &problem), c.status) << c.name;
    EXPECT_NE(std::string(problem).find(c.problem), std::string::npos) << c.name << ": " << problem;
    EXPECT_EQ(d.ok, 0u) << c.name;
  }
}

TEST(Records, DirectivesAreCheckedOnTheClientSide) {
  Priority p = with_session(Priority{});
  p.level = kPriorityLevels;
  EXPECT_EQ(decode(p, Direction::kToClient).first, DecodeStatus::kBadField);
  Pin pin = with_session(Pin{});
  EXPECT_EQ(decode(pin, Direction::kToClient).second, "until_ns is not a deadline");
  EXPECT_EQ(decode(good_submit(), Direction::kToClient).first, DecodeStatus::kWrongDirection);
}

TEST(Records, NewerVersionsSkipReservedChecks) {
  // A v2 sender may have put new fields where v1 has reserved space.
  RoundSubmit r = good_submit();
  r.header.version = 2;
  r.reserved[0] = 77;
  EXPECT_EQ(decode(r).first, DecodeStatus::kOk);
  r.cached_tokens = r.prompt_tokens + 1;  // known fields are still checked
  EXPECT_EQ(decode(r).first, DecodeStatus::kBadField);
}

TEST(Records, DecoderCountsEachOutcome) {
  RecordDecoder d(Direction::kToDaemon);
  Record out;
  for (const BadCase& c : bad_cases()) (void)d.decode(c.slot, out);
  (void)d.decode(encode(good_submit()), out);
  EXPECT_EQ(d.ok, 1u);
  EXPECT_EQ(d.unknown_type, 1u);
  EXPECT_EQ(d.wrong_direction, 1u);
  EXPECT_EQ(d.bad_version, 1u);
  EXPECT_EQ(d.bad_field, bad_cases().size() - 3);
}

TEST(Records, FailedDecodeLeavesOutputUntouched) {
  RecordDecoder d(Direction::kToDaemon);
  Record out;
  ASSERT_EQ(d.decode(encode(good_submit()), out), DecodeStatus::kOk);
  Slot garbage{};
  garbage.words[0] = 0xffff;
  EXPECT_NE(d.decode(garbage, out), DecodeStatus::kOk);
  EXPECT_EQ(out.type(), RecordType::kRoundSubmit);
}

TEST(Records, TypeNames) {
  EXPECT_EQ(record_type_name(RecordType::kKvStats), "KV_STATS");
  EXPECT_EQ(record_type_name(RecordType::kKvBlocks), "KV_BLOCKS");
  EXPECT_EQ(record_type_name(static_cast<RecordType>(12345)), "UNKNOWN");
}

}  // namespace
}  // namespace tandem::ipc
