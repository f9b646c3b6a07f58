// SessionTable: the state machine of docs/architecture.md "Sessions", the event orders that ring
// interleaving produces, and rejection (counted, never a crash) of the rest.
#include "sched/session_table.h"

#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

using S = SessionState;
constexpr SessionId kA = 0xA;
constexpr EngineId kE = 7;

Time at(int ms) { return base::from_ns(std::int64_t{ms} * 1'000'000); }

RoundSubmitted submit(SessionId s, std::uint32_t round, std::uint32_t prompt = 1000, std::uint32_t cached = 0) {
  return RoundSubmitted{s, kE, round, prompt, cached, (prompt + 15) / 16};
}
RoundEnded end(SessionId s, std::uint32_t round, bool tool, std::uint32_t out = 100) {
  return RoundEnded{s, kE, round, out, 70, tool};
}

TEST(StateMachine, LegalTransitionsAreExactlyTheDesignOnes) {
  const S all[] = {S::kWaiting, S::kReasoning, S::kActing, S::kPaused, S::kDone};
  int legal = 0;
  for (S from : all) {
    for (S to : all) legal += legal_transition(from, to);
  }
  // WAITING→REASONING; REASONING→ACTING,PAUSED; ACTING→REASONING,PAUSED;
  // PAUSED→REASONING; and every live state → DONE.
  EXPECT_EQ(legal, 6 + 4);
  EXPECT_TRUE(legal_transition(S::kWaiting, S::kReasoning));
  EXPECT_FALSE(legal_transition(S::kWaiting, S::kActing));
  EXPECT_FALSE(legal_transition(S::kPaused, S::kActing));
  EXPECT_FALSE(legal_transition(S::kDone, S::kWaiting));
  EXPECT_FALSE(legal_transition(S::kDone, S::kDone));
}

TEST(SessionTable, AFullLifecycle) {
  SessionTable t;
  ASSERT_TRUE(t.apply(SessionOpened{kA, 1, 30}, at(0)));
  EXPECT_EQ(t.find(kA)->state, S::kWaiting);
  ASSERT_TRUE(t.apply(submit(kA, 0), at(1)));
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(2), kE));  // admitted
  ASSERT_TRUE(t.apply(end(kA, 0, true), at(10)));
  const Session* s = t.find(kA);
  EXPECT_EQ(s->state, S::kActing);
  EXPECT_EQ(s->context_tokens, 1100u);
  EXPECT_EQ(s->residency, Residency::kResident);
  EXPECT_EQ(s->service_tokens, 1100u);
  ASSERT_TRUE(t.apply(ToolStarted{kA, 42, 1}, at(11)));
  EXPECT_EQ(t.find(kA)->tool, 42u);
  ASSERT_TRUE(t.apply(ToolEnded{kA, 42, 1, 0, std::chrono::milliseconds(5), {}}, at(16)));
  EXPECT_EQ(t.find(kA)->state, S::kReasoning);
  // Round 1 reuses the 1100-token prefix: only new tokens count as service.
  ASSERT_TRUE(t.apply(submit(kA, 1, 1300, 1100), at(17)));
  ASSERT_TRUE(t.apply(end(kA, 1, false, 50), at(30)));
  EXPECT_EQ(t.find(kA)->service_tokens, 1100u + 200u + 50u);
  EXPECT_EQ(t.find(kA)->rounds_done, 2u);
  ASSERT_TRUE(t.apply(SessionClosed{kA}, at(31)));
  EXPECT_EQ(t.count(S::kDone), 1u);
  EXPECT_EQ(t.reap_done(), 1u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.rejected(), 0u);
}

TEST(SessionTable, ToolStartMayOvertakeTheRoundEnd) {
  SessionTable t;
  ASSERT_TRUE(t.apply(submit(kA, 0), at(0)));
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(1)));
  ASSERT_TRUE(t.apply(ToolStarted{kA, 9, 1}, at(2)));  // runner's ring first
  EXPECT_EQ(t.find(kA)->state, S::kActing);
  ASSERT_TRUE(t.apply(end(kA, 0, true), at(3)));  // engine's ring second
  EXPECT_EQ(t.find(kA)->state, S::kActing);
  EXPECT_EQ(t.rejected(), 0u);
}

TEST(SessionTable, NextSubmitImpliesToolEnd) {
  SessionTable t;
  ASSERT_TRUE(t.apply(submit(kA, 0), at(0)));
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(1)));
  ASSERT_TRUE(t.apply(end(kA, 0, true), at(2)));
  ASSERT_TRUE(t.apply(submit(kA, 1, 1200, 1100), at(3)));
  EXPECT_EQ(t.find(kA)->state, S::kReasoning);
}

TEST(SessionTable, PauseAndRestore) {
  SessionTable t;
  ASSERT_TRUE(t.apply(submit(kA, 0), at(0)));
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(1)));
  ASSERT_TRUE(t.apply(end(kA, 0, true), at(2)));
  ASSERT_TRUE(t.transition(kA, S::kPaused, at(3)));
  ASSERT_TRUE(t.apply(ToolEnded{kA, 1, 1, 0, {}, {}}, at(4)));
  EXPECT_EQ(t.find(kA)->state, S::kPaused) << "a paused session stays paused when its tool ends";
  ASSERT_TRUE(t.apply(submit(kA, 1, 1200, 0), at(5)));
  EXPECT_EQ(t.find(kA)->state, S::kPaused) << "its next round waits for restore";
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(6), 3));
  EXPECT_EQ(t.find(kA)->engine, 3u) << "restore may move it to another engine";
}

TEST(SessionTable, IllegalEventsAreRejectedAndCounted) {
  SessionTable t;
  EXPECT_FALSE(t.apply(end(kA, 0, true), at(0))) << "unknown session";
  ASSERT_TRUE(t.apply(submit(kA, 0), at(0)));
  EXPECT_FALSE(t.apply(end(kA, 0, true), at(1))) << "a waiting round cannot end: it never ran";
  EXPECT_FALSE(t.apply(submit(kA, 1), at(1))) << "one round in flight at a time";
  EXPECT_FALSE(t.transition(kA, S::kActing, at(1))) << "WAITING → ACTING";
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(2)));
  EXPECT_FALSE(t.apply(end(kA, 5, true), at(3))) << "wrong round";
  EXPECT_FALSE(t.apply(SessionOpened{kA, 0, 0}, at(3))) << "opened twice";
  EXPECT_FALSE(t.apply(SessionOpened{0, 0, 0}, at(3))) << "session 0";
  ASSERT_TRUE(t.apply(SessionClosed{kA}, at(4)));
  EXPECT_FALSE(t.apply(SessionClosed{kA}, at(5)));
  EXPECT_FALSE(t.apply(ToolStarted{kA, 1, 1}, at(5))) << "nothing after DONE";
  EXPECT_EQ(t.rejected(), 9u);
  EXPECT_EQ(t.find(kA)->state, S::kDone);
}

TEST(SessionTable, KvChangesSetResidency) {
  SessionTable t;
  ASSERT_TRUE(t.apply(submit(kA, 0), at(0)));
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(1)));
  ASSERT_TRUE(t.apply(end(kA, 0, true), at(2)));
  ASSERT_TRUE(t.apply(KvChanged{kA, kE, KvChange::kOffloaded, 70}, at(3)));
  EXPECT_EQ(t.find(kA)->residency, Residency::kOffloaded);
  ASSERT_TRUE(t.apply(KvChanged{kA, kE, KvChange::kRestored, 70}, at(4)));
  EXPECT_EQ(t.find(kA)->residency, Residency::kResident);
  EXPECT_EQ(t.find(kA)->blocks_held, 70u);
  ASSERT_TRUE(t.apply(KvChanged{kA, kE, KvChange::kEvicted, 70}, at(5)));
  EXPECT_EQ(t.find(kA)->residency, Residency::kDropped);
}

TEST(SessionTable, PinAndUnpinMarkOnlyResidentKv) {
  SessionTable t;
  ASSERT_TRUE(t.apply(submit(kA, 0), at(0)));
  ASSERT_TRUE(t.transition(kA, S::kReasoning, at(1)));
  ASSERT_TRUE(t.apply(end(kA, 0, true), at(2)));
  ASSERT_EQ(t.find(kA)->residency, Residency::kResident);
  EXPECT_TRUE(t.set_pinned(kA, true));
  EXPECT_EQ(t.find(kA)->residency, Residency::kPinned);
  EXPECT_FALSE(t.set_pinned(kA, true)) << "already pinned";
  EXPECT_TRUE(t.set_pinned(kA, false));
  EXPECT_EQ(t.find(kA)->residency, Residency::kResident);
  ASSERT_TRUE(t.set_pinned(kA, true));
  ASSERT_TRUE(t.apply(KvChanged{kA, kE, KvChange::kEvicted, 70}, at(3)));
  EXPECT_EQ(t.find(kA)->residency, Residency::kDropped) << "the engine's report wins";
  EXPECT_FALSE(t.set_pinned(kA, true)) << "nothing on the GPU to pin";
  EXPECT_EQ(t.find(kA)->residency, Residency::kDropped);
  EXPECT_FALSE(t.set_pinned(0xB, true)) << "unknown session";
}

// Property: whatever the event soup, counts match the table, nothing crashes,
// and every session that closes reaches DONE.
TEST(SessionTable, RandomEventStreamsKeepCountsConsistent) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    SessionTable t;
    for (int i = 0; i < 2000; ++i) {
      SessionId s = 1 + rng() % 8;
      auto r = static_cast<std::uint32_t>(rng() % 3);
      Time now = at(i);
      switch (rng() % 10) {
        case 0:
          (void)t.apply(SessionOpened{s, 0, 0}, now);
          break;
        case 1:
          (void)t.apply(submit(s, r), now);
          break;
        case 2:
          (void)t.apply(end(s, r, rng() % 2 == 0), now);
          break;
        case 3:
          (void)t.apply(ToolStarted{s, 1, 1}, now);
          break;
        case 4:
          (void)t.apply(ToolEnded{s, 1, 1, 0, {}, {}}, now);
          break;
        case 5:
          (void)t.transition(s, static_cast<S>(rng() % 5), now, rng() % 2 == 0 ? kNoEngine : EngineId{3});
          break;
        case 6:
          (void)t.apply(KvChanged{s, kE, static_cast<KvChange>(rng() % 4), 3}, now);
          break;
        case 7:
          if (t.apply(SessionClosed{s}, now)) {
            ASSERT_EQ(t.find(s)->state, S::kDone) << "a session that closes reaches DONE";
            ASSERT_FALSE(t.find(s)->round_in_flight);
          }
          break;
        case 8:
          (void)t.reap_done();
          break;
        case 9:
          (void)t.abort_round(s, now);
          break;
      }
      std::size_t sum = 0;
      std::set<SessionId> indexed;
      for (int st = 0; st < 5; ++st) {
        // The per-state index holds exactly the sessions in that state, and
        // each one's brief beside it says what the session says.
        const auto in = t.in_state(static_cast<S>(st));
        const auto briefs = t.briefs(static_cast<S>(st));
        ASSERT_EQ(briefs.size(), in.size());
        for (std::size_t k = 0; k < in.size(); ++k) {
          const Session* p = in[k];
          ASSERT_EQ(p->state, static_cast<S>(st));
          ASSERT_EQ(t.find(p->id), p);
          ASSERT_TRUE(indexed.insert(p->id).second) << "indexed twice";
          ASSERT_EQ(briefs[k].engine, p->engine);
          ASSERT_EQ(briefs[k].prompt_tokens, p->prompt_tokens);
          ASSERT_EQ(briefs[k].round_in_flight, p->round_in_flight);
        }
        sum += t.count(static_cast<S>(st));
      }
      ASSERT_EQ(sum, t.size());
      // by_id(): every session once, in id order.
      std::vector<SessionId> ids;
      for (const Session* p : t.by_id()) ids.push_back(p->id);
      ASSERT_EQ(ids, std::vector<SessionId>(indexed.begin(), indexed.end()));
    }
  }
}

}  // namespace
}  // namespace tandem::sched
