// ThunderAgentControl: admission to capacity, the Δt cadence, pause order,
// decay, best-fit restore over one queue, timeouts and determinism. Every
// expectation is computed by hand in the comments (C = blocks × 16 tokens,
// buffer 100 tokens per program).
#include "sched/thunderagent.h"

#include <cmath>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sched/model.h"

namespace tandem::sched {

// gtest prints actions readably (Action has padding bytes).
inline void PrintTo(const Action& a, std::ostream* os) { *os << to_string(a); }

namespace {

using S = SessionState;

Time at(double s) { return base::from_ns(std::llround(s * 1e9)); }

Action admit(SessionId s) { return {ActionKind::kAdmit, s}; }
Action pause(SessionId s) { return {ActionKind::kPause, s}; }
Action restore(SessionId s, EngineId e) { return {ActionKind::kRestore, s, e}; }

EngineJoined engine(EngineId e, std::uint32_t blocks) {
  return {e, EngineParams{.block_size = 16, .total_blocks = blocks}};
}
RoundSubmitted submit(SessionId s, EngineId e, std::uint32_t round, std::uint32_t prompt) {
  return {.session = s, .engine = e, .round = round, .prompt_tokens = prompt};
}
RoundEnded end(SessionId s, EngineId e, std::uint32_t round, std::uint32_t out, bool tool = true) {
  return {.session = s, .engine = e, .round = round, .output_tokens = out, .blocks_held = 1, .tool_follows = tool};
}
ToolStarted tool_start(SessionId s) { return {s, 7, 1}; }
ToolEnded tool_end(SessionId s) { return {s, 7, 1, 0, std::chrono::seconds(1), {}}; }

// A minimal host: feeds events to the model and the policy, and applies the
// policy's actions the way tandemd does — a pause of a session with a round in
// flight takes effect when that round ends.
struct Host {
  explicit Host(ThunderAgentParams p = {}) : policy(p) {}

  void feed(const Event& e, double t) {
    EXPECT_TRUE(model.observe(e, at(t))) << "event rejected at t=" << t;
    policy.on_event(e, model, at(t));
    if (const auto* r = std::get_if<RoundEnded>(&e); r != nullptr && deferred.erase(r->session) > 0) {
      EXPECT_TRUE(model.sessions().transition(r->session, S::kPaused, at(t)));
    }
  }

  std::vector<Action> tick(double t) {
    Actions out;
    policy.tick(model, at(t), out);
    for (const Action& a : out.list()) {
      const Session* s = model.sessions().find(a.session);
      if (s == nullptr) {
        ADD_FAILURE() << "action for an unknown session: " << to_string(a);
        continue;
      }
      switch (a.kind) {
        case ActionKind::kAdmit:
          EXPECT_TRUE(model.sessions().transition(a.session, S::kReasoning, at(t)));
          break;
        case ActionKind::kRestore:
          EXPECT_TRUE(model.sessions().transition(a.session, S::kReasoning, at(t), a.engine));
          break;
        case ActionKind::kPause:
          if (s->round_in_flight && s->state != S::kPaused) {
            deferred.insert(a.session);
          } else {
            EXPECT_TRUE(model.sessions().transition(a.session, S::kPaused, at(t)));
          }
          break;
        default:
          ADD_FAILURE() << "unexpected action " << to_string(a);
      }
    }
    return out.list();
  }

  // Set-up without the policy: a session admitted on `e` with a round of
  // `prompt` tokens in flight.
  void running(SessionId s, EngineId e, std::uint32_t prompt, double t) {
    feed(submit(s, e, 1, prompt), t);
    EXPECT_TRUE(model.sessions().transition(s, S::kReasoning, at(t), e));
  }
  // A session that ran one round of `context` tokens on `e` and was paused
  // while its tool ran; with `pending` > 0 its next round (that many prompt
  // tokens) has been submitted and is held.
  void paused(SessionId s, EngineId e, std::uint32_t context, double t, std::uint32_t pending = 0) {
    running(s, e, context, t);
    feed(end(s, e, 1, 0), t);
    EXPECT_TRUE(model.sessions().transition(s, S::kPaused, at(t)));
    if (pending > 0) feed(submit(s, e, 2, pending), t);
  }

  S state(SessionId s) const { return model.sessions().find(s)->state; }

  NodeModel model;
  ThunderAgentControl policy;
  std::set<SessionId> deferred;
};

ThunderAgentParams no_decay() {
  ThunderAgentParams p;
  p.decay = ThunderDecay::kNone;
  return p;
}

using Acts = std::vector<Action>;

// ---- admission -----------------------------------------------------------------

TEST(ThunderAgent, AdmitsUpToCapacityAndNotBeyond) {
  Host h;
  h.feed(engine(1, 100), 0);  // C = 1600
  for (SessionId s : {1, 2, 3}) h.feed(submit(s, 1, 1, 500), 0);
  h.feed(submit(4, 1, 1, 100), 0);
  // Selection smallest first within the room (1600): 4 (200), 1 (600),
  // 2 (600) = 1400; 3 would make 2000. Placement largest first: 1, 2, 4.
  EXPECT_EQ(h.tick(0), (Acts{admit(1), admit(2), admit(4)}));
  EXPECT_EQ(h.state(3), S::kWaiting);
  // Room 200 < 600 at the next check.
  EXPECT_EQ(h.tick(5), Acts{});
  // Closing 4 frees 200 (room 400 < 600), closing 2 frees 600 more (1000).
  h.feed(SessionClosed{4}, 6);
  EXPECT_EQ(h.tick(10), Acts{});
  h.feed(SessionClosed{2}, 11);
  EXPECT_EQ(h.tick(12), Acts{});  // a close is not a request boundary
  EXPECT_EQ(h.tick(15), Acts{admit(3)});
}

TEST(ThunderAgent, FillsCapacityExactly) {
  Host h;
  h.feed(engine(1, 100), 0);
  h.feed(submit(1, 1, 1, 700), 0);
  h.feed(submit(2, 1, 1, 700), 0);
  // 800 + 800 = 1600 = C: both fit.
  EXPECT_EQ(h.tick(0), (Acts{admit(1), admit(2)}));
  // A one-token program needs 101 > 0 remaining: not at its arrival, not at
  // the next check.
  h.feed(submit(3, 1, 1, 1), 1);
  EXPECT_EQ(h.tick(1), Acts{});
  EXPECT_EQ(h.tick(5), Acts{});
  EXPECT_EQ(h.state(3), S::kWaiting);
}

TEST(ThunderAgent, DecidesOnlyEveryCheckIntervalOrAtRequestBoundaries) {
  Host h(no_decay());
  h.feed(engine(1, 100), 0);
  h.feed(submit(1, 1, 1, 600), 0);
  EXPECT_EQ(h.tick(0), Acts{admit(1)});  // the first tick is a check; next at 5
  h.feed(end(1, 1, 1, 100), 1);          // 1 is ACTING with 700 tokens
  h.feed(tool_start(1), 1);
  EXPECT_EQ(h.tick(1), Acts{});
  // A new program's arrival is a boundary: queue empty, remaining
  // 1600 - 800 = 800 >= 300 + 100, so it is admitted before the next check.
  h.feed(submit(2, 1, 1, 300), 2);
  EXPECT_EQ(h.tick(2), Acts{admit(2)});
  // 1's next round (1500) puts the engine at 1600 + 400 = 2000 > 1600, but an
  // admitted program's call is not checked when it arrives...
  h.feed(tool_end(1), 3);
  h.feed(submit(1, 1, 2, 1500), 3);
  EXPECT_EQ(h.tick(3), Acts{});
  EXPECT_EQ(h.tick(4), Acts{});
  EXPECT_EQ(h.tick(4.99), Acts{});
  // ...only at the check: over by 400, no ACTING program, so the smallest
  // REASONING one (2: 300 + 100) is marked, which is enough.
  EXPECT_EQ(h.tick(5), Acts{pause(2)});
  EXPECT_TRUE(h.policy.marked(2));
  EXPECT_EQ(h.state(2), S::kReasoning);  // its round runs to the end
  // Marked, it no longer counts against the check (1600 <= 1600), and the
  // pause is not repeated.
  EXPECT_EQ(h.tick(10), Acts{});
  h.feed(end(2, 1, 1, 50), 11);
  EXPECT_EQ(h.state(2), S::kPaused);
  EXPECT_EQ(h.tick(11), Acts{});
  EXPECT_FALSE(h.policy.marked(2));
}

TEST(ThunderAgent, ReleasedPauseLoopMarksEveryReasoningProgram) {
  ThunderAgentParams p = no_decay();
  p.released_pause_loop = true;
  Host h(p);
  h.feed(engine(1, 100), 0);
  h.feed(submit(1, 1, 1, 600), 0);
  EXPECT_EQ(h.tick(0), Acts{admit(1)});
  h.feed(end(1, 1, 1, 100), 1);
  h.feed(submit(2, 1, 1, 300), 2);
  EXPECT_EQ(h.tick(2), Acts{admit(2)});
  h.feed(tool_end(1), 3);
  h.feed(submit(1, 1, 2, 1500), 3);
  // Marking 2 does not lower the usage router.py checks, so 1 is marked too.
  EXPECT_EQ(h.tick(5), (Acts{pause(2), pause(1)}));
}

TEST(ThunderAgent, BoundaryArrivalQueuesBehindANonEmptyQueue) {
  Host h;
  h.feed(engine(1, 100), 0);
  h.paused(1, 1, 2000, 0);  // needs 2100 > C: never restored
  EXPECT_EQ(h.tick(0), Acts{});
  // Room for it, but the queue is not empty: it waits for the check.
  h.feed(submit(2, 1, 1, 100), 1);
  EXPECT_EQ(h.tick(1), Acts{});
  h.feed(submit(3, 1, 1, 100), 2);
  EXPECT_EQ(h.tick(2), Acts{});
  EXPECT_EQ(h.tick(5), (Acts{admit(2), admit(3)}));
}

// ---- pausing -------------------------------------------------------------------

TEST(ThunderAgent, PausesActingBeforeReasoningSmallestFirst) {
  Host h(no_decay());
  h.feed(engine(1, 100), 0);
  h.feed(submit(1, 1, 1, 100), 0);
  h.feed(submit(2, 1, 1, 50), 0);
  h.feed(submit(3, 1, 1, 100), 0);
  h.feed(submit(4, 1, 1, 500), 0);
  // 150 + 200 + 200 + 600 = 1150 fits; placement largest first, ties by id.
  EXPECT_EQ(h.tick(0), (Acts{admit(4), admit(1), admit(3), admit(2)}));
  h.feed(end(1, 1, 1, 100), 1);  // ACTING, 200
  h.feed(end(2, 1, 1, 50), 1);   // ACTING, 100
  h.feed(end(3, 1, 1, 0), 1);
  h.feed(tool_start(3), 1);
  h.feed(tool_end(3), 1.5);
  h.feed(submit(3, 1, 2, 1100), 2);  // REASONING, 1100; 4 REASONING, 500
  EXPECT_EQ(h.tick(1), Acts{});
  EXPECT_EQ(h.tick(2), Acts{});
  // Usage 300 + 200 + 1200 + 600 = 2300, over by 700: pause 2 (-> -500),
  // pause 1 (-> -200), then mark the smaller REASONING program 4 (-> 400).
  EXPECT_EQ(h.tick(5), (Acts{pause(2), pause(1), pause(4)}));
  EXPECT_EQ(h.state(1), S::kPaused);
  EXPECT_EQ(h.state(2), S::kPaused);
  EXPECT_EQ(h.state(3), S::kReasoning);
  EXPECT_TRUE(h.policy.marked(4));
  // Room for a restore is judged with the marked program still holding its
  // KV: 1200 + 600 = 1800 >= C, so nothing comes back yet.
  EXPECT_EQ(h.tick(10), Acts{});
}

// ---- decay ---------------------------------------------------------------------

// Program 1 (1000 prompt) ends its round at t = 1 with 1100 tokens and stays
// ACTING; program 2 (600) arrives at t = 2.
Host decay_scenario(ThunderDecay mode) {
  ThunderAgentParams p;
  p.decay = mode;
  Host h(p);
  h.feed(engine(1, 100), 0);
  h.feed(submit(1, 1, 1, 1000), 0);
  EXPECT_EQ(h.tick(0), Acts{admit(1)});
  h.feed(end(1, 1, 1, 100), 1);
  h.feed(tool_start(1), 1);
  EXPECT_EQ(h.tick(1), Acts{});
  h.feed(submit(2, 1, 1, 600), 2);
  return h;
}

TEST(ThunderAgent, DecayMakesALongActingProgramCountLess) {
  {
    // Paper: at t = 2 program 1 counts 1100 * 2^-1 + 100 = 650, remaining
    // 950 >= 700.
    Host h = decay_scenario(ThunderDecay::kCheckAndResume);
    EXPECT_EQ(h.tick(2), Acts{admit(2)});
    // At the check 1 counts 1100 * 2^-4 + 100 = 168.75; with 2 that is 868.75.
    EXPECT_EQ(h.tick(5), Acts{});
  }
  {
    // No decay: remaining 1600 - 1200 = 400 < 700, now and at the check.
    Host h = decay_scenario(ThunderDecay::kNone);
    EXPECT_EQ(h.tick(2), Acts{});
    EXPECT_EQ(h.tick(5), Acts{});
    EXPECT_EQ(h.state(2), S::kWaiting);
  }
  {
    // Released code: the arrival sees 400 < 700; the resume at the check sees
    // 1600 - 168.75 and admits 2 — and the undecayed check right after
    // (1200 + 700 = 1900 > 1600) pauses 1: the thrash the paper's variant avoids.
    Host h = decay_scenario(ThunderDecay::kResumeOnly);
    EXPECT_EQ(h.tick(2), Acts{});
    EXPECT_EQ(h.tick(5), (Acts{admit(2), pause(1)}));
  }
}

// ---- restoring -----------------------------------------------------------------

TEST(ThunderAgent, RestoresLargestFirstOntoTheEngineWithMostRoom) {
  Host h;
  h.feed(engine(1, 100), 0);  // C = 1600
  h.feed(engine(2, 200), 0);  // C = 3200
  h.running(10, 1, 900, 0);   // engine 1: room 1600 - 1000 = 600
  h.running(11, 2, 1000, 0);  // engine 2: room 3200 - 1100 = 2100
  // All paused on engine 1 (one queue for both engines).
  h.paused(1, 1, 1500, 0);
  h.paused(2, 1, 200, 0, 300);  // its next call (300) is held
  h.paused(3, 1, 400, 0);
  h.paused(4, 1, 2000, 0);
  // Selection in 2700: 2 (pending, 400), then 3 (500), 1 (1600) = 2500;
  // 4 (2100) does not fit. Placement largest first on the most room:
  // 1 -> engine 2 (2100 -> 500); 3 -> engine 1 (600 -> 100, full);
  // 2 -> engine 2 (500 -> 100).
  EXPECT_EQ(h.tick(10), (Acts{restore(1, 2), restore(3, 1), restore(2, 2)}));
  EXPECT_EQ(h.model.sessions().find(1)->engine, 2u);
  EXPECT_EQ(h.state(4), S::kPaused);
}

TEST(ThunderAgent, RestoreOrderFromTheGlobalQueue) {
  Host h;
  h.feed(engine(1, 100), 0);        // C = 1600, empty
  h.paused(1, 1, 100, 0, 700);      // pending call, 700
  h.paused(2, 1, 100, 0, 500);      // pending call, 500
  h.feed(submit(3, 1, 1, 200), 0);  // new program, 200
  h.paused(4, 1, 100, 0);           // no pending call, 100
  // Groups: pending calls (2, 1), new programs (3), the rest (4), smallest
  // first in each. In 1600: 2 (600), 1 (800) = 1400; 3 (300) would make
  // 1700, skipped; 4 (200) makes exactly 1600. Placement largest first.
  EXPECT_EQ(h.tick(0), (Acts{restore(1, 1), restore(2, 1), restore(4, 1)}));
  EXPECT_EQ(h.state(3), S::kWaiting);
}

// ---- timeout -------------------------------------------------------------------

TEST(ThunderAgent, HeldCallIsForcedThroughAfterTheTimeout) {
  Host h;
  h.feed(engine(1, 100), 0);
  h.running(10, 1, 1500, 0);  // 1600: the engine is full
  h.paused(1, 1, 200, 0);
  EXPECT_EQ(h.tick(0), Acts{});
  // Calls held from t = 10: 1's next round, and a new program.
  h.feed(submit(1, 1, 2, 300), 10);
  h.feed(submit(2, 1, 1, 100), 10);
  EXPECT_EQ(h.tick(10), Acts{});
  // 1804.999 is 1800 s after 1 was paused but not after its call arrived.
  EXPECT_EQ(h.tick(1804.999), Acts{});
  EXPECT_EQ(h.tick(1809.999), Acts{});  // a check; the next is at 1814.999
  // Forced without a capacity check, in arrival order (then id), the paused
  // one onto the engine it was on.
  EXPECT_EQ(h.tick(1810), (Acts{restore(1, 1), admit(2)}));
  EXPECT_EQ(h.state(1), S::kReasoning);
  EXPECT_EQ(h.state(2), S::kReasoning);
  // The next check finds 1600 + 400 + 200 = 2200: marks 2 (-> -400) and
  // 1 (-> 0).
  EXPECT_EQ(h.tick(1815), (Acts{pause(2), pause(1)}));
}

// ---- determinism ---------------------------------------------------------------

struct Agent {
  SessionId id = 0;
  EngineId engine = 1;
  std::uint32_t rounds = 0;
  std::uint32_t round = 0;
  std::uint32_t context = 0;
  double start = 0;
  double round_end = -1;
  double tool_end = -1;
  bool closed = false;
};

struct WorkloadRun {
  std::vector<std::string> log;
  std::size_t admits = 0, pauses = 0, restores = 0, closed = 0;
  std::uint64_t rejected = 0;
};

// 40 agent loops on two engines (3200 and 2400 tokens), 600 s in 0.25 s steps;
// everything random comes from one LCG, so a run depends only on the policy.
WorkloadRun run_workload() {
  Host h;
  h.feed(engine(1, 200), 0);
  h.feed(engine(2, 150), 0);
  std::uint64_t rng = 12345;
  auto next = [&rng](std::uint64_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
  };
  std::vector<Agent> agents(40);
  for (std::size_t i = 0; i < agents.size(); ++i) {
    agents[i].id = i + 1;
    agents[i].engine = 1 + static_cast<EngineId>(next(2));
    agents[i].rounds = 2 + static_cast<std::uint32_t>(next(5));
    agents[i].context = 200 + static_cast<std::uint32_t>(next(800));
    agents[i].start = static_cast<double>(next(200)) * 0.25;
  }
  WorkloadRun run;
  for (int step = 0; step <= 2400; ++step) {
    const double t = step * 0.25;
    for (Agent& a : agents) {
      if (a.closed) continue;
      if (a.round == 0) {
        if (t >= a.start) {
          a.round = 1;
          h.feed(submit(a.id, a.engine, 1, a.context), t);
        }
        continue;
      }
      const Session& s = *h.model.sessions().find(a.id);
      const bool admitted = s.state == S::kReasoning || s.state == S::kActing;
      if (s.round_in_flight) {
        if (admitted && a.round_end < 0) {
          a.round_end = t + 1 + static_cast<double>(next(4));
        } else if (a.round_end >= 0 && t >= a.round_end) {
          const auto out = static_cast<std::uint32_t>(50 + next(150));
          const bool last = a.round == a.rounds;
          h.feed(end(a.id, s.engine, a.round, out, !last), t);
          a.context += out;
          a.round_end = -1;
          if (last) {
            h.feed(SessionClosed{a.id}, t);
            a.closed = true;
            ++run.closed;
          } else {
            h.feed(tool_start(a.id), t);
            a.tool_end = t + static_cast<double>(next(40)) * 0.25;
          }
        }
      } else if (a.tool_end >= 0 && t >= a.tool_end) {
        h.feed(tool_end(a.id), t);
        a.tool_end = -1;
        ++a.round;
        a.context += 100 + static_cast<std::uint32_t>(next(400));
        h.feed(submit(a.id, h.model.sessions().find(a.id)->engine, a.round, a.context), t);
      }
    }
    for (const Action& act : h.tick(t)) {
      run.log.push_back(std::to_string(step) + " " + to_string(act));
      run.admits += act.kind == ActionKind::kAdmit;
      run.pauses += act.kind == ActionKind::kPause;
      run.restores += act.kind == ActionKind::kRestore;
    }
  }
  run.rejected = h.model.sessions().rejected();
  return run;
}

TEST(ThunderAgent, SameEventsGiveTheSameActions) {
  WorkloadRun a = run_workload();
  WorkloadRun b = run_workload();
  EXPECT_EQ(a.log, b.log);
  // The workload exercises every decision, and the host never had to reject
  // an action or event.
  EXPECT_EQ(a.admits, 40u);
  EXPECT_GT(a.pauses, 0u);
  EXPECT_GT(a.restores, 0u);
  EXPECT_GT(a.closed, 0u);
  EXPECT_EQ(a.rejected, 0u);
}

// ---- parameters ----------------------------------------------------------------

TEST(ThunderAgent, ParametersComeFromTheTable) {
  auto defaults = PolicyParams::create("thunderagent", kThunderAgentParams, {});
  ASSERT_TRUE(defaults);
  ThunderAgentParams d = thunderagent_params(*defaults);
  EXPECT_EQ(d.check_interval, std::chrono::seconds(5));
  EXPECT_EQ(d.buffer_tokens, 100.0);
  EXPECT_EQ(d.acting_weight, 1.0);
  EXPECT_EQ(d.decay, ThunderDecay::kCheckAndResume);
  EXPECT_EQ(d.decay_half_life_s, 1.0);
  EXPECT_EQ(d.resume_timeout, std::chrono::seconds(1800));
  EXPECT_EQ(d.lambda_max, 1.0);
  EXPECT_EQ(d.lambda_min, 1.0);
  EXPECT_FALSE(d.released_pause_loop);

  auto custom = PolicyParams::create("thunderagent", kThunderAgentParams,
                                     {{"check_interval_s", 2.5}, {"decay_mode", 1}, {"released_pause_loop", 1}});
  ASSERT_TRUE(custom);
  ThunderAgentParams c = thunderagent_params(*custom);
  EXPECT_EQ(c.check_interval, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.decay, ThunderDecay::kResumeOnly);
  EXPECT_TRUE(c.released_pause_loop);

  EXPECT_FALSE(PolicyParams::create("thunderagent", kThunderAgentParams, {{"decay_mode", 3}}));
  auto control = make_thunderagent_control(*defaults);
  EXPECT_EQ(control->name(), "thunderagent");
}

TEST(ThunderAgent, CheckIntervalParameterSetsTheCadence) {
  ThunderAgentParams p = no_decay();
  p.check_interval = std::chrono::seconds(2);
  Host h(p);
  h.feed(engine(1, 100), 0);
  h.running(1, 1, 1000, 0);
  EXPECT_EQ(h.tick(0), Acts{});
  h.feed(end(1, 1, 1, 0), 0.5);
  h.feed(tool_end(1), 0.6);
  h.feed(submit(1, 1, 2, 1600), 0.7);  // 1700 > 1600
  EXPECT_EQ(h.tick(1.9), Acts{});
  EXPECT_EQ(h.tick(2), Acts{pause(1)});
}

}  // namespace
}  // namespace tandem::sched
