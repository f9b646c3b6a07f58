// sched::apply: what each Action means, the one interpreter tandemd and
// tandem-sim share (sched/apply.h).
#include "sched/apply.h"

#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

using S = SessionState;
constexpr SessionId kA = 0xA;
constexpr EngineId kE = 1;
constexpr EngineId kOther = 2;

Time at(int ms) { return base::from_ns(std::int64_t{ms} * 1'000'000); }

// Writes down each effect with what the table said when it was called.
class Recorder final : public ActionSink {
 public:
  explicit Recorder(const SessionTable& t) : table_(t) {}
  bool admit = true;
  std::vector<std::string> seen;

  bool may_admit() const override { return admit; }
  void admitted(const Session& s, Time) override { note("admitted", s); }
  void paused(const Session& s, Time) override { note("paused", s); }
  void restored(const Session& s, EngineId from, Time) override { note(fmt::format("restored from {}", from), s); }
  void priority(const Session& s, std::int64_t level, Time) override { note(fmt::format("priority {}", level), s); }
  void pinned(const Session& s, Time until, Time) override {
    note(fmt::format("pinned until {}", base::to_ns(until)), s);
  }
  void unpinned(const Session& s, Time) override { note("unpinned", s); }
  void dropped(const Session& s, Time) override { note("dropped", s); }
  void offloaded(const Session& s, Time) override { note("offloaded", s); }
  void cpu_weight(const Session& s, std::int64_t w, Time) override { note(fmt::format("weight {}", w), s); }
  void cpu_quota(const Session& s, std::int64_t q, Time) override { note(fmt::format("quota {}", q), s); }
  void kill_tools(const Session& s, Time) override { note("kill tools", s); }
  void sm_partition(EngineId e, std::int64_t i, Time) override { seen.push_back(fmt::format("sm {} = {}", e, i)); }

 private:
  void note(const std::string& what, const Session& s) {
    const Session* live = table_.find(s.id);
    seen.push_back(fmt::format("{}: {} on {}{}", what, to_string(live->state), live->engine,
                               live->residency == Residency::kPinned ? ", pinned" : ""));
  }
  const SessionTable& table_;
};

TEST(Apply, TransitionsComeBeforeTheirEffects) {
  SessionTable t;
  Recorder r(t);
  ASSERT_TRUE(t.apply(SessionOpened{kA, 0, 3}, at(0)));
  ASSERT_TRUE(t.apply(RoundSubmitted{kA, kE, 0, 100, 0, 7}, at(1)));
  apply({ActionKind::kAdmit, kA}, t, r, at(2));
  ASSERT_TRUE(t.apply(RoundEnded{kA, kE, 0, 10, 7, true}, at(3)));
  apply({ActionKind::kPin, kA, kNoEngine, 5'000'000'000}, t, r, at(4));
  apply({ActionKind::kPause, kA}, t, r, at(5));
  apply({ActionKind::kRestore, kA, kOther}, t, r, at(6));
  apply({ActionKind::kUnpin, kA}, t, r, at(7));
  apply({ActionKind::kSetPriority, kA, kNoEngine, 9}, t, r, at(8));
  apply({ActionKind::kSetCpuWeight, kA, kNoEngine, 250}, t, r, at(9));
  apply({ActionKind::kSetCpuQuota, kA, kNoEngine, 50'000}, t, r, at(10));
  apply({ActionKind::kDrop, kA}, t, r, at(11));
  apply({ActionKind::kOffload, kA}, t, r, at(12));
  apply({ActionKind::kKillTools, kA}, t, r, at(13));
  apply({ActionKind::kSetSmPartition, 0, kE, 3}, t, r, at(14));
  const std::vector<std::string> want = {
      "admitted: REASONING on 1",
      // The pin's effect comes first; the table marks it pinned after.
      "pinned until 5000000000: ACTING on 1",
      "paused: PAUSED on 1, pinned",
      "restored from 1: REASONING on 2, pinned",
      "unpinned: REASONING on 2, pinned",
      "priority 9: REASONING on 2",
      "weight 250: REASONING on 2",
      "quota 50000: REASONING on 2",
      "dropped: REASONING on 2",
      "offloaded: REASONING on 2",
      "kill tools: REASONING on 2",
      "sm 1 = 3",
  };
  EXPECT_EQ(r.seen, want);
  EXPECT_EQ(t.find(kA)->residency, Residency::kResident) << "unpinned after the effect";
}

TEST(Apply, RefusedTransitionsAndDeadSessionsDoNothing) {
  SessionTable t;
  Recorder r(t);
  apply({ActionKind::kAdmit, kA}, t, r, at(1));  // unknown
  ASSERT_TRUE(t.apply(SessionOpened{kA, 0, 3}, at(1)));
  apply({ActionKind::kPause, kA}, t, r, at(2));  // WAITING → PAUSED is not a transition
  r.admit = false;                               // draining
  apply({ActionKind::kAdmit, kA}, t, r, at(3));
  EXPECT_EQ(t.find(kA)->state, S::kWaiting);
  r.admit = true;
  apply({ActionKind::kAdmit, kA}, t, r, at(4));
  EXPECT_EQ(r.seen, std::vector<std::string>{"admitted: REASONING on 4294967295"});
  ASSERT_TRUE(t.apply(SessionClosed{kA}, at(5)));
  r.seen.clear();
  for (ActionKind k : {ActionKind::kPin, ActionKind::kDrop, ActionKind::kKillTools, ActionKind::kSetCpuWeight}) {
    apply({k, kA, kNoEngine, 1}, t, r, at(6));
  }
  EXPECT_TRUE(r.seen.empty()) << "a DONE session gets no effect";
}

}  // namespace
}  // namespace tandem::sched
