// Wire record → validated Record → sched::Event → NodeModel, for every type.
#include "daemon/events.h"

#include <gtest/gtest.h>

#include <string>

#include "base/ids.h"
#include "daemon/event_log.h"
#include "ipc/messages.h"
#include "sched/model.h"

namespace tandem::daemon {
namespace {

// Encodes, then decodes as the daemon would, so each case also passes
// validation.
template <class T>
ipc::Record decoded(T r, std::uint64_t session = 42, std::int64_t ts = 5'000) {
  r.header.session = session;
  r.header.timestamp_ns = ts;
  ipc::RecordDecoder d(ipc::Direction::kToDaemon);
  ipc::Record out;
  std::string_view problem;
  EXPECT_EQ(d.decode(ipc::encode(r), out, &problem), ipc::DecodeStatus::kOk) << problem;
  return out;
}

TEST(EventLog, KeepsTheNewestKSizeInOrderAndCountsWhatFellOut) {
  EventLog log;
  // Twice round the ring, so that unnamed entries overwrite named ones.
  const std::size_t n = 2 * EventLog::kSize + 10;
  for (std::size_t i = 1; i <= n; ++i) {
    log.add(base::from_ns(static_cast<std::int64_t>(i)), EventLog::Kind::kSessionClose, i, {},
            i % 1000 == 0 ? "session-" + std::to_string(i) : std::string());
  }
  ASSERT_EQ(log.size(), EventLog::kSize);
  EXPECT_EQ(log.next_seq(), n + 1);
  for (std::size_t i = 0; i < log.size(); ++i) {
    const EventLog::Entry& e = log.at(i);
    ASSERT_EQ(e.seq, EventLog::kSize + 11 + i) << "oldest first";
    ASSERT_EQ(e.session, e.seq);
    ASSERT_EQ(log.name(e), e.seq % 1000 == 0 ? "session-" + std::to_string(e.seq) : std::string());
  }
  EXPECT_EQ(log.lost_after(0), EventLog::kSize + 10);  // entries 1..kSize+10 went before anyone read them
  EXPECT_EQ(log.lost_after(EventLog::kSize + 10), 0u);
  EXPECT_EQ(log.lost_after(n), 0u);
}

TEST(EventLog, AnEntryKeepsItsNameUntilItFallsOut) {
  EventLog log;
  // Names live in a ring of their own: three laps, with two entries in
  // three named, reuse every name slot while the entries that named them
  // are still held, and a lap with every entry named follows.
  const std::size_t n = 4 * EventLog::kSize + 7;
  auto named = [&](std::size_t i) { return i > 3 * EventLog::kSize || i % 3 != 0; };
  for (std::size_t i = 1; i <= n; ++i) {
    log.add(base::from_ns(static_cast<std::int64_t>(i)), EventLog::Kind::kKill, i, {},
            named(i) ? "s" + std::to_string(i) + std::string(i % 40, 'x') : std::string());
    if (i % 997 != 0 && i != n) continue;
    for (std::size_t k = 0; k < log.size(); ++k) {
      const EventLog::Entry& e = log.at(k);
      ASSERT_EQ(log.name(e), named(e.seq) ? "s" + std::to_string(e.seq) + std::string(e.seq % 40, 'x') : std::string())
          << "entry " << e.seq << " after " << i << " added";
    }
  }
}

TEST(Events, EngineRecordsCarryTheSendingEngine) {
  ipc::RoundSubmit s;
  s.round = 2;
  s.prompt_tokens = 900;
  s.cached_tokens = 800;
  s.projected_blocks = 60;
  auto e = to_event(decoded(s), 7, 0);
  ASSERT_TRUE(e);
  auto& rs = std::get<sched::RoundSubmitted>(*e);
  EXPECT_EQ(rs.session, 42u);
  EXPECT_EQ(rs.engine, 7u) << "attributed to the client that sent it";
  EXPECT_EQ(rs.round, 2u);
  EXPECT_EQ(rs.cached_tokens, 800u);
  EXPECT_EQ(rs.projected_blocks, 60u);

  ipc::RoundEnd end;
  end.round = 2;
  end.output_tokens = 30;
  end.blocks_held = 59;
  end.header.flags = ipc::kRoundEndToolFollows;
  auto re = std::get<sched::RoundEnded>(*to_event(decoded(end), 7, 0));
  EXPECT_TRUE(re.tool_follows);
  EXPECT_EQ(re.blocks_held, 59u);

  ipc::KvStats kv;
  kv.blocks_total = 100;
  kv.blocks_free = 40;
  kv.blocks_pinned = 10;
  kv.step_time_us = 1500;
  auto ks = std::get<sched::KvStatsReported>(*to_event(decoded(kv, 0), 7, 0));
  EXPECT_EQ(ks.engine, 7u);
  EXPECT_EQ(ks.stats.blocks_free, 40u);
  EXPECT_EQ(ks.stats.step_time, std::chrono::microseconds(1500));

  ipc::RoundFirstToken ft;
  ft.queue_delay_ns = 2000;
  ft.prefill_ns = 3000;
  auto f = std::get<sched::RoundFirstToken>(*to_event(decoded(ft), 7, 0));
  EXPECT_EQ(f.queue_delay, sched::Duration(2000));

  ipc::KvEvent ev;
  ev.kind = static_cast<std::uint8_t>(ipc::KvEventKind::kOffloaded);
  ev.blocks = 12;
  auto kc = std::get<sched::KvChanged>(*to_event(decoded(ev), 7, 0));
  EXPECT_EQ(kc.change, sched::KvChange::kOffloaded);
  EXPECT_EQ(kc.blocks, 12u);
}

TEST(Events, RunnerRecords) {
  ipc::SessionOpen o;
  o.priority_class = 2;
  o.expected_rounds = 30;
  auto so = std::get<sched::SessionOpened>(*to_event(decoded(o), 3, 0));
  EXPECT_EQ(so.priority_class, 2);
  EXPECT_EQ(so.expected_rounds, 30u);
  EXPECT_TRUE(std::holds_alternative<sched::SessionClosed>(*to_event(decoded(ipc::SessionClose{}), 3, 0)));
  ipc::ToolStart ts;
  ts.tool_kind = 99;
  ts.tool_call = 4;
  auto st = std::get<sched::ToolStarted>(*to_event(decoded(ts), 3, 1000));
  EXPECT_EQ(st.kind, base::principal_tool_kind(1000, 99));
  ipc::ToolEnd te;
  te.tool_kind = 99;
  te.tool_call = 4;
  te.exit_code = -9;
  te.wall_ns = 2'000'000'000;
  te.cpu_ns = 500'000'000;
  auto en = std::get<sched::ToolEnded>(*to_event(decoded(te), 3, 1000));
  EXPECT_EQ(en.kind, st.kind);
  EXPECT_EQ(en.principal, 1000u);
  EXPECT_EQ(en.exit_code, -9);
  EXPECT_EQ(en.wall, std::chrono::seconds(2));
  EXPECT_EQ(en.cpu, std::chrono::milliseconds(500));
}

// A tool kind is a hash of a name the runner chose: the kind the policy
// learns of is the sender's own, so one user's reports of "pytest" are not
// what another user's "pytest" is judged by.
TEST(Events, ToolKindsAreTheSendersOwn) {
  ipc::ToolEnd te;
  te.tool_kind = base::tool_kind_id("pytest");
  te.tool_call = 1;
  const auto a = std::get<sched::ToolEnded>(*to_event(decoded(te), 3, 1000));
  const auto again = std::get<sched::ToolEnded>(*to_event(decoded(te), 4, 1000));
  const auto b = std::get<sched::ToolEnded>(*to_event(decoded(te), 3, 1001));
  EXPECT_EQ(a.kind, again.kind) << "the same user, another connection: the same kind";
  EXPECT_NE(a.kind, b.kind);
  EXPECT_NE(a.kind, te.tool_kind);
  EXPECT_NE(a.kind, 0u);
  EXPECT_EQ(base::principal_tool_kind(1000, 0), 0u) << "no kind stays no kind";

  // What the model learns of user 1000's pytest says nothing of user 1001's.
  // (The model learns from every call it is given, whatever its session
  // table says of a session that was never opened here.)
  sched::NodeModel model;
  for (std::uint32_t call = 1; call <= 50; ++call) {
    te.tool_call = call;
    te.wall_ns = 600'000'000'000;  // ten minutes, fifty times
    (void)model.observe(*to_event(decoded(te), 3, 1000), sched::Time{});
  }
  const auto ten_s = std::chrono::seconds(10);
  EXPECT_LT(model.tools().cdf(a.kind, ten_s), 0.1);
  EXPECT_DOUBLE_EQ(model.tools().cdf(b.kind, ten_s), model.tools().cdf(base::tool_kind_id("never-seen"), ten_s));
  EXPECT_EQ(model.tools().kinds_of(1000), 1u);
  EXPECT_EQ(model.tools().kinds_of(1001), 0u);
}

TEST(Events, DirectivesAreNotEvents) {
  ipc::Admit a;
  a.header.session = 1;
  ipc::RecordDecoder d(ipc::Direction::kToClient);
  ipc::Record r;
  ASSERT_EQ(d.decode(ipc::encode(a), r), ipc::DecodeStatus::kOk);
  EXPECT_FALSE(to_event(r, 1, 0));
}

TEST(Events, AWireSessionDrivesTheNodeModel) {
  sched::NodeModel model;
  auto feed = [&](const ipc::Record& r, sched::EngineId from) {
    auto e = to_event(r, from, 0);
    ASSERT_TRUE(e);
    ASSERT_TRUE(model.observe(*e, record_time(r)));
  };
  feed(decoded(ipc::SessionOpen{}), 100);
  ipc::RoundSubmit s;
  s.prompt_tokens = 1000;
  s.projected_blocks = 70;
  feed(decoded(s), 1);
  ASSERT_TRUE(model.sessions().transition(42, sched::SessionState::kReasoning, sched::Time{}));
  ipc::RoundEnd end;
  end.output_tokens = 50;
  end.blocks_held = 66;
  end.header.flags = ipc::kRoundEndToolFollows;
  feed(decoded(end), 1);
  ipc::ToolStart ts;
  ts.tool_kind = 5;
  feed(decoded(ts), 100);  // principal 0: root's kinds
  const sched::Session* sess = model.sessions().find(42);
  ASSERT_NE(sess, nullptr);
  EXPECT_EQ(sess->state, sched::SessionState::kActing);
  EXPECT_EQ(sess->engine, 1u);
  EXPECT_EQ(sess->context_tokens, 1050u);
  EXPECT_EQ(sess->tool, base::principal_tool_kind(0, 5));
  EXPECT_EQ(sess->tool_started, base::from_ns(5'000));
}

// ---- resync snapshots ----

// One snapshot entry as it arrives: built, sent as bytes and verified.
class Snapshot {
 public:
  explicit Snapshot(const ipc::SessionSnapshotInfo& info) {
    const ipc::SessionSnapshotInfo one[] = {info};
    bytes_ = ipc::build_resync(one, false);
    auto m = ipc::verify_message(bytes_);
    EXPECT_TRUE(m) << m.error().message();
    snap_ = (*m)->payload_as_Resync()->sessions()->Get(0);
  }
  const wire::SessionSnapshot& operator*() const { return *snap_; }

 private:
  std::vector<std::uint8_t> bytes_;
  const wire::SessionSnapshot* snap_ = nullptr;
};

ipc::SessionSnapshotInfo entry(sched::SessionState state, bool in_tool = false) {
  ipc::SessionSnapshotInfo e;
  e.session = 42;
  e.state = static_cast<std::uint8_t>(state);
  e.round = 3;
  e.blocks_held = 17;
  e.in_tool = in_tool;
  e.tool_kind = in_tool ? 9 : 0;
  return e;
}

// Runs the steps as the daemon does (daemon/sessions.cc).
void run(const std::vector<ResyncStep>& steps, sched::NodeModel& model, sched::Time now = sched::Time{}) {
  for (const ResyncStep& step : steps) {
    if (const auto* mark = std::get_if<MarkRunning>(&step)) {
      const sched::Session* s = model.sessions().find(mark->session);
      if (s != nullptr && s->state == sched::SessionState::kWaiting) {
        ASSERT_TRUE(model.sessions().transition(mark->session, sched::SessionState::kReasoning, now));
      }
    } else {
      ASSERT_TRUE(model.observe(std::get<sched::Event>(step), now));
    }
  }
}

// ---- authorize: who may send what about which session ---------------------

constexpr std::uint32_t kEngine = 7;  // the sending engine's id
constexpr std::uint32_t kMine = 3;    // the sending runner's handle
constexpr std::uint32_t kTheirs = 4;  // another runner's handle

constexpr Sending kFromEngine{Sender::kEngine, kEngine, 0};
constexpr Sending kFromRunner{Sender::kRunner, 21, kMine};

RecordRule rule_of(ipc::RecordType t) { return record_rule(t); }

// A live session whose latest round is on `on` (in flight if `flying`).
sched::Session live_on(sched::EngineId on, bool flying) {
  sched::Session s;
  s.engine = on;
  s.round_in_flight = flying;
  return s;
}

// A verdict in words: "charged" verdicts are taken only while the sender has
// room for one more session, and say what it is told when it has none.
std::string said(const Verdict& v) {
  switch (v.kind) {
    case Verdict::Kind::kTaken:
      return "taken";
    case Verdict::Kind::kCharged:
      return std::string("charged, else: ") + v.why;
    case Verdict::Kind::kRefused:
      return std::string("refused: ") + v.why;
    case Verdict::Kind::kOverLimit:
      return std::string("over limit: ") + v.why;
    case Verdict::Kind::kLate:
      return std::string("late: ") + v.why;
  }
  return "?";
}

TEST(Authorize, EachRoleSendsOnlyItsOwnRecordsAndNoDirectives) {
  using T = ipc::RecordType;
  EXPECT_EQ(said(authorize(kFromEngine, rule_of(T::kAdmit), {})), "refused: a directive on the event ring");
  EXPECT_EQ(said(authorize(kFromRunner, rule_of(T::kClose), {})), "refused: a directive on the event ring");
  EXPECT_EQ(said(authorize(kFromEngine, rule_of(T::kSessionOpen), {})), "refused: an engine sent a runner's record");
  EXPECT_EQ(said(authorize(kFromRunner, rule_of(T::kRoundSubmit), {})), "refused: a runner sent an engine's record");
  EXPECT_EQ(said(authorize(kFromRunner, rule_of(T::kKvStats), {})), "refused: a runner sent an engine's record");
  // An engine's pool and GPU records name no session: nothing about one is asked.
  EXPECT_EQ(said(authorize(kFromEngine, rule_of(T::kKvStats), {})), "taken");
  EXPECT_EQ(said(authorize(kFromEngine, rule_of(T::kGpuPartitions), {})), "taken");
}

TEST(Authorize, ARoundIsSubmittedOnlyWhereNoOtherEngineRunsOneAndNewSessionsAreCharged) {
  const RecordRule submit = rule_of(ipc::RecordType::kRoundSubmit);
  const sched::Session elsewhere = live_on(9, true);
  const sched::Session here = live_on(kEngine, true);
  const sched::Session idle_elsewhere = live_on(9, false);
  EXPECT_EQ(said(authorize(kFromEngine, submit, {&elsewhere, 0u})),
            "refused: ROUND_SUBMIT: the session has a round in flight on another engine");
  EXPECT_EQ(said(authorize(kFromEngine, submit, {&here, 0u})), "taken");
  EXPECT_EQ(said(authorize(kFromEngine, submit, {&idle_elsewhere, kMine})), "taken") << "moving between rounds";
  // A session the daemon holds costs nothing more; a new one is charged.
  EXPECT_EQ(said(authorize(kFromEngine, submit, {nullptr, 0u})), "taken");
  EXPECT_EQ(said(authorize(kFromEngine, submit, {})), "charged, else: ROUND_SUBMIT: over limits.sessions_per_client");
}

TEST(Authorize, RoundRecordsComeOnlyFromTheEngineRunningTheRound) {
  for (ipc::RecordType t : {ipc::RecordType::kRoundFirstToken, ipc::RecordType::kRoundEnd, ipc::RecordType::kKvEvent}) {
    const RecordRule rule = rule_of(t);
    const sched::Session here = live_on(kEngine, true);
    const sched::Session elsewhere = live_on(9, true);
    EXPECT_EQ(said(authorize(kFromEngine, rule, {&here, 0u})), "taken") << ipc::record_type_name(t);
    EXPECT_EQ(said(authorize(kFromEngine, rule, {&elsewhere, 0u})),
              "refused: the session's round is not on this engine");
    EXPECT_EQ(said(authorize(kFromEngine, rule, {nullptr, 0u})), "refused: the session's round is not on this engine");
    // Its runner closed it before this engine's record was taken: late,
    // whether the table still holds it (DONE) or a tombstone remembers it.
    EXPECT_EQ(said(authorize(kFromEngine, rule, {&here, kMine, true})), "late: the session has ended");
    EXPECT_EQ(said(authorize(kFromEngine, rule, {nullptr, std::nullopt, true})), "late: the session has ended");
  }
}

TEST(Authorize, ARunnerOpensOnlySessionsNoOtherRunnerHoldsAndIsChargedForNewOnes) {
  const RecordRule open = rule_of(ipc::RecordType::kSessionOpen);
  const sched::Session s = live_on(kEngine, false);
  EXPECT_EQ(said(authorize(kFromRunner, open, {&s, kTheirs})),
            "refused: SESSION_OPEN: the session belongs to another runner");
  EXPECT_EQ(said(authorize(kFromRunner, open, {&s, kMine})), "taken") << "its own: already charged";
  EXPECT_EQ(said(authorize(kFromRunner, open, {&s, 0u})),
            "charged, else: SESSION_OPEN: over limits.sessions_per_client")
      << "taking over an engine's session";
  EXPECT_EQ(said(authorize(kFromRunner, open, {})), "charged, else: SESSION_OPEN: over limits.sessions_per_client");
  EXPECT_EQ(said(authorize(kFromRunner, open, {nullptr, std::nullopt, true})),
            "charged, else: SESSION_OPEN: over limits.sessions_per_client")
      << "a runner may open a session of an ended one's name anew";
}

TEST(Authorize, ToolsAndClosesAreForLiveSessionsOfTheSendingRunner) {
  for (ipc::RecordType t : {ipc::RecordType::kSessionClose, ipc::RecordType::kToolStart, ipc::RecordType::kToolEnd}) {
    const RecordRule rule = rule_of(t);
    const sched::Session s = live_on(kEngine, false);
    EXPECT_EQ(said(authorize(kFromRunner, rule, {})), "refused: unknown session") << ipc::record_type_name(t);
    EXPECT_EQ(said(authorize(kFromRunner, rule, {nullptr, kMine})), "refused: unknown session") << "no longer live";
    EXPECT_EQ(said(authorize(kFromRunner, rule, {&s, kTheirs})), "refused: the session belongs to another runner");
    EXPECT_EQ(said(authorize(kFromRunner, rule, {&s, kMine})), "taken");
    EXPECT_EQ(said(authorize(kFromRunner, rule, {&s, 0u})), "charged, else: over limits.sessions_per_client")
        << "taking over an engine's session";
    // An operator killed it while its tool ran: the runner learns late.
    EXPECT_EQ(said(authorize(kFromRunner, rule, {nullptr, std::nullopt, true})), "late: the session has ended");
  }
}

using S = sched::SessionState;

TEST(ResyncSteps, ARunnerOpensWhatTheTableDoesNotHoldAndStartsItsTool) {
  auto steps = resync_steps(*Snapshot(entry(S::kActing, true)), Sender::kRunner, 100, 1000, nullptr, false);
  ASSERT_EQ(steps.size(), 2u);
  const auto& open = std::get<sched::SessionOpened>(std::get<sched::Event>(steps[0]));
  EXPECT_EQ(open.session, 42u);
  const auto& tool = std::get<sched::ToolStarted>(std::get<sched::Event>(steps[1]));
  EXPECT_EQ(tool.session, 42u);
  EXPECT_EQ(tool.kind, base::principal_tool_kind(1000, 9)) << "the runner's own kind, as on its ring";
  EXPECT_EQ(tool.tool_call, 0u);

  // No tool running: only the opening.
  steps = resync_steps(*Snapshot(entry(S::kReasoning)), Sender::kRunner, 100, 0, nullptr, false);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<sched::SessionOpened>(std::get<sched::Event>(steps[0])));
}

TEST(ResyncSteps, ARunnerSaysNothingTheTableKnowsAlready) {
  sched::Session live;
  live.id = 42;
  live.state = S::kActing;
  live.tool = 9;
  EXPECT_TRUE(resync_steps(*Snapshot(entry(S::kActing, true)), Sender::kRunner, 100, 0, &live, false).empty());
  // Live without a tool: the tool it runs starts.
  live.tool = 0;
  auto steps = resync_steps(*Snapshot(entry(S::kActing, true)), Sender::kRunner, 100, 0, &live, false);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<sched::ToolStarted>(std::get<sched::Event>(steps[0])));
  // A DONE session is not live: opened again (the table decides whether it may be).
  live.state = S::kDone;
  steps = resync_steps(*Snapshot(entry(S::kWaiting)), Sender::kRunner, 100, 0, &live, false);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<sched::SessionOpened>(std::get<sched::Event>(steps[0])));
}

TEST(ResyncSteps, AnEngineReattachesItsRoundByState) {
  // WAITING: submitted, not running.
  auto steps = resync_steps(*Snapshot(entry(S::kWaiting)), Sender::kEngine, 7, 0, nullptr, false);
  ASSERT_EQ(steps.size(), 1u);
  const auto& submit = std::get<sched::RoundSubmitted>(std::get<sched::Event>(steps[0]));
  EXPECT_EQ(submit.engine, 7u) << "attributed to the engine that sent it";
  EXPECT_EQ(submit.round, 3u);
  EXPECT_EQ(submit.projected_blocks, 17u);
  EXPECT_EQ(submit.prompt_tokens, 0u);

  // REASONING: submitted and running.
  steps = resync_steps(*Snapshot(entry(S::kReasoning)), Sender::kEngine, 7, 0, nullptr, false);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<sched::RoundSubmitted>(std::get<sched::Event>(steps[0])));
  EXPECT_EQ(std::get<MarkRunning>(steps[1]), MarkRunning{42});

  // ACTING: its round ended with a tool following.
  steps = resync_steps(*Snapshot(entry(S::kActing)), Sender::kEngine, 7, 0, nullptr, false);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_TRUE(std::holds_alternative<MarkRunning>(steps[1]));
  const auto& end = std::get<sched::RoundEnded>(std::get<sched::Event>(steps[2]));
  EXPECT_EQ(end.engine, 7u);
  EXPECT_EQ(end.round, 3u);
  EXPECT_EQ(end.blocks_held, 17u);
  EXPECT_TRUE(end.tool_follows);

  // PAUSED, and DONE: nothing on the engine to account for.
  EXPECT_TRUE(resync_steps(*Snapshot(entry(S::kPaused)), Sender::kEngine, 7, 0, nullptr, false).empty());
  EXPECT_TRUE(resync_steps(*Snapshot(entry(S::kDone)), Sender::kEngine, 7, 0, nullptr, false).empty());
}

TEST(ResyncSteps, AnEngineDoesNotResubmitARoundInFlightNorDescribeARunnersSessionBetweenRounds) {
  sched::Session live;
  live.id = 42;
  live.state = S::kReasoning;
  live.round_in_flight = true;
  auto steps = resync_steps(*Snapshot(entry(S::kReasoning)), Sender::kEngine, 7, 0, &live, false);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<MarkRunning>(steps[0]));

  // A runner owns it: ACTING between rounds is the runner's word; a round
  // in flight is still the engine's.
  EXPECT_TRUE(resync_steps(*Snapshot(entry(S::kActing)), Sender::kEngine, 7, 0, nullptr, true).empty());
  EXPECT_EQ(resync_steps(*Snapshot(entry(S::kReasoning)), Sender::kEngine, 7, 0, nullptr, true).size(), 2u);
}

TEST(ResyncSteps, TheStepsBringTheTableToWhatTheClientSays) {
  // A daemon that restarted hears an engine first, then the runner.
  sched::NodeModel model;
  run(resync_steps(*Snapshot(entry(S::kActing)), Sender::kEngine, 7, 0, model.sessions().find(42), false), model);
  const sched::Session* s = model.sessions().find(42);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->state, S::kActing);
  EXPECT_EQ(s->engine, 7u);
  EXPECT_FALSE(s->round_in_flight);
  EXPECT_EQ(s->blocks_held, 17u);
  EXPECT_EQ(s->residency, sched::Residency::kResident);
  run(resync_steps(*Snapshot(entry(S::kActing, true)), Sender::kRunner, 100, 0, s, false), model);
  s = model.sessions().find(42);
  EXPECT_EQ(s->state, S::kActing);
  EXPECT_EQ(s->tool, base::principal_tool_kind(0, 9));

  // The other order: the runner first, then the engine's round in flight.
  sched::NodeModel other;
  run(resync_steps(*Snapshot(entry(S::kReasoning)), Sender::kRunner, 100, 0, nullptr, false), other);
  s = other.sessions().find(42);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->state, S::kWaiting);
  run(resync_steps(*Snapshot(entry(S::kReasoning)), Sender::kEngine, 7, 0, s, true), other);
  s = other.sessions().find(42);
  EXPECT_EQ(s->state, S::kReasoning);
  EXPECT_TRUE(s->round_in_flight);
  EXPECT_EQ(s->round, 3u);
}

}  // namespace
}  // namespace tandem::daemon
