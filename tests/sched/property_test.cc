// Properties every policy must keep, over random workloads:
//
//   step half, on a toy engine (a block pool, chunked prefill, decode,
//   preemption by recompute, pins, sessions whose next round arrives after a
//   tool delay):
//     - a plan never allocates a block that is not free, and blocks held by
//       running requests + pinned blocks + free blocks always equal the pool
//       (so pinned blocks never exceed it);
//     - every request gets its first chunk within a starvation bound, and
//       every session finishes;
//   control half, on a host that applies admits:
//     - mars and tandem never have more live sessions than window_max
//       (the host reports no CPU pressure, so tandem's addition 19, which
//       frees the slots of sessions in starved tools, stays inactive);
//   both: the same input gives the same output.
//
// The toy engine is deliberately small; the simulator (sim/) is the real one.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "sched/registry.h"

namespace tandem::sched {
namespace {

constexpr std::uint32_t kBlockSize = 16;
constexpr std::uint32_t kPool = 1500;
constexpr Duration kStep = std::chrono::milliseconds(20);

struct Req {
  StepRequest r;
  std::uint32_t output_target = 0;
  std::int64_t arrived_step = 0;
  bool started = false;
};

struct SessionPlan {
  SessionId id;
  int rounds_left;
  std::uint32_t context;
  std::int64_t next_arrival_step;  // -1: a round is in the engine
};

struct Outcome {
  std::vector<std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>> log;  // (step, request, tokens)
  std::int64_t worst_wait_steps = 0;
  int sessions_done = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t pins_made = 0;
  std::int64_t steps = 0;
  bool conserved = true;
  bool over_allocated = false;
};

Outcome run_toy_engine(std::string_view policy, std::uint64_t seed, int sessions, std::int64_t steps) {
  auto inst = make_policy(policy);
  EXPECT_TRUE(inst) << policy;
  StepScheduler& sched = *inst->step;
  std::mt19937_64 rng(seed);
  Outcome out;
  std::vector<SessionPlan> plans;
  plans.reserve(static_cast<std::size_t>(sessions));
  for (int i = 0; i < sessions; ++i) {
    plans.push_back({static_cast<SessionId>(i + 1), 3 + static_cast<int>(rng() % 4),
                     static_cast<std::uint32_t>(300 + rng() % 3000), static_cast<std::int64_t>(rng() % 200)});
  }
  std::vector<Req> running;
  std::deque<Req> waiting;
  std::vector<PinnedKv> pins;
  std::uint32_t free_blocks = kPool;
  std::uint64_t next_id = 1;
  auto blocks_for = [](std::uint32_t t) { return (t + kBlockSize - 1) / kBlockSize; };

  for (std::int64_t step = 0; step < steps && out.sessions_done < sessions; ++step) {
    out.steps = step + 1;
    const Time now = base::from_ns(step * kStep.count());
    // Arrivals: a session's next round, reusing its pin if it still has one.
    for (SessionPlan& p : plans) {
      if (p.next_arrival_step < 0 || p.next_arrival_step > step || p.rounds_left == 0) continue;
      Req q;
      q.r.id = next_id++;
      q.r.session = p.id;
      q.r.phase = RequestPhase::kWaiting;
      q.r.prompt_tokens = p.context + 200;
      q.r.arrival = now;
      q.output_target = 10 + static_cast<std::uint32_t>(rng() % 60);
      q.arrived_step = step;
      auto pin = std::find_if(pins.begin(), pins.end(), [&](const PinnedKv& k) { return k.session == p.id; });
      if (pin != pins.end()) {  // warm resume: the pinned prefix is its own
        q.r.cached_tokens = p.context;
        q.r.blocks_held = pin->blocks;
        pins.erase(pin);
      }
      waiting.push_back(q);
      p.next_arrival_step = -1;
    }

    // The step input: running in running order, then the waiting queue.
    std::vector<StepRequest> reqs;
    reqs.reserve(running.size() + waiting.size());
    for (const Req& q : running) reqs.push_back(q.r);
    for (const Req& q : waiting) reqs.push_back(q.r);
    StepInput in;
    in.token_budget = 1024;
    in.max_seqs = 32;
    in.block_size = kBlockSize;
    in.free_blocks = free_blocks;
    in.requests = reqs;
    in.pinned = pins;
    StepPlan plan;
    sched.plan(in, now, plan);

    // Apply: unpins, preemptions, then chunks.
    for (SessionId s : plan.unpin) {
      auto pin = std::find_if(pins.begin(), pins.end(), [&](const PinnedKv& k) { return k.session == s; });
      if (pin != pins.end()) {
        free_blocks += pin->blocks;
        pins.erase(pin);
      }
    }
    const std::size_t n_running = running.size();
    std::vector<bool> preempted(reqs.size(), false);
    // This toy engine has no host memory: a swap is a preemption by recompute.
    for (const auto* list : {&plan.preempt, &plan.swap}) {
      for (std::uint32_t i : *list) {
        EXPECT_LT(i, n_running) << policy << ": only running requests can be preempted";
        if (i >= n_running) continue;
        EXPECT_FALSE(preempted[i]) << policy << ": request " << i << " preempted twice in one plan";
        preempted[i] = true;
      }
    }
    out.preemptions += plan.preempt.size() + plan.swap.size();
    std::vector<Req> all(running.begin(), running.end());
    all.insert(all.end(), waiting.begin(), waiting.end());
    for (std::uint32_t i = 0; i < all.size(); ++i) {
      if (!preempted[i]) continue;
      free_blocks += all[i].r.blocks_held;
      all[i].r.blocks_held = 0;
      all[i].r.computed_tokens = 0;
      all[i].r.cached_tokens = 0;
      all[i].r.phase = RequestPhase::kPreempted;
    }
    std::vector<bool> scheduled(all.size(), false);
    for (const ScheduledChunk& c : plan.run) {
      Req& q = all[c.request];
      const std::uint32_t start = q.r.start_tokens();
      const std::uint32_t need_total = blocks_for(start + c.tokens);
      const std::uint32_t need = need_total > q.r.blocks_held ? need_total - q.r.blocks_held : 0;
      if (need > free_blocks) {
        out.over_allocated = true;
        ADD_FAILURE() << policy << ": step " << step << " allocates " << need << " blocks with " << free_blocks
                      << " free";
        return out;
      }
      free_blocks -= need;
      q.r.blocks_held += need;
      q.r.computed_tokens = start + c.tokens;
      if (q.r.computed_tokens > q.r.prompt_tokens) q.r.output_tokens = q.r.computed_tokens - q.r.prompt_tokens;
      q.r.phase = RequestPhase::kRunning;
      q.r.last_scheduled = now;
      if (!q.started) {
        q.started = true;
        out.worst_wait_steps = std::max(out.worst_wait_steps, step - q.arrived_step);
      }
      scheduled[c.request] = true;
      out.log.emplace_back(static_cast<std::uint64_t>(step), c.request, c.tokens);
    }

    // New lists: preempted requests go to the head of the waiting queue.
    std::vector<Req> next_running;
    std::deque<Req> next_waiting;
    for (std::uint32_t i = 0; i < all.size(); ++i) {
      Req& q = all[i];
      if (preempted[i]) {
        next_waiting.push_front(q);
        continue;
      }
      const bool finished = q.r.phase == RequestPhase::kRunning && q.r.output_tokens >= q.output_target;
      if (finished) {
        SessionPlan& p = plans[q.r.session - 1];
        p.context = q.r.prompt_tokens + q.r.output_tokens;
        --p.rounds_left;
        const bool tool = p.rounds_left > 0;
        RoundEndInfo info{q.r.session, tool, static_cast<ToolKind>(1 + rng() % 3), p.context, q.r.blocks_held, 0};
        KeepPlan keep = sched.on_round_end(info, now);
        if (tool && keep.decision == KeepDecision::kPin) {
          pins.push_back({q.r.session, q.r.blocks_held, now, keep.until});
          ++out.pins_made;
        } else {
          free_blocks += q.r.blocks_held;
        }
        if (tool) {
          const std::int64_t tool_steps = 5 + static_cast<std::int64_t>(rng() % 100);
          p.next_arrival_step = step + tool_steps;
          sched.on_tool_end(q.r.session, info.tool, kStep * tool_steps, now + kStep * tool_steps);
        } else {
          ++out.sessions_done;
          sched.on_session_end(q.r.session, now);
        }
        continue;
      }
      if (q.r.phase == RequestPhase::kRunning) {
        next_running.push_back(q);
      } else {
        next_waiting.push_back(q);
      }
    }
    running = std::move(next_running);
    waiting = std::move(next_waiting);

    // Conservation: every block is running, pinned or free.
    std::uint64_t held = 0;
    for (const Req& q : running) held += q.r.blocks_held;
    for (const Req& q : waiting) held += q.r.blocks_held;  // warm resumes keep their pin's blocks
    for (const PinnedKv& k : pins) held += k.blocks;
    if (held + free_blocks != kPool) {
      out.conserved = false;
      ADD_FAILURE() << policy << ": step " << step << " holds " << held << " + " << free_blocks << " free != " << kPool;
      return out;
    }
  }
  return out;
}

class StepProperties : public ::testing::TestWithParam<std::string_view> {};

TEST_P(StepProperties, NeverOverAllocatesNoStarvationAllSessionsFinish) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    Outcome o = run_toy_engine(GetParam(), seed, 24, 60000);
    ASSERT_FALSE(o.over_allocated);
    ASSERT_TRUE(o.conserved);
    EXPECT_EQ(o.sessions_done, 24) << GetParam() << " seed " << seed << ": sessions left unfinished";
    // 2,500 steps = 50 s of engine time: MARS's 30 s aging bound plus slack.
    EXPECT_LE(o.worst_wait_steps, 2500) << GetParam() << " seed " << seed;
    // The workload must press on the pool, or the test proves nothing.
    EXPECT_GT(o.preemptions + o.pins_made, 0u) << GetParam() << " seed " << seed;
    std::printf("  %s seed %llu: %lld steps, %llu preemptions, %llu pins, worst first-chunk wait %lld steps\n",
                std::string(GetParam()).c_str(), static_cast<unsigned long long>(seed), static_cast<long long>(o.steps),
                static_cast<unsigned long long>(o.preemptions), static_cast<unsigned long long>(o.pins_made),
                static_cast<long long>(o.worst_wait_steps));
  }
}

TEST_P(StepProperties, SameInputSamePlans) {
  Outcome a = run_toy_engine(GetParam(), 7, 12, 20000);
  Outcome b = run_toy_engine(GetParam(), 7, 12, 20000);
  EXPECT_EQ(a.log, b.log);
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, StepProperties,
                         ::testing::Values("fcfs", "autellix", "infercept", "continuum", "thunderagent", "mars",
                                           "tandem"),
                         [](const auto& test_info) { return std::string(test_info.param); });

// Control half: a host that applies admits and plays rounds and tools.
TEST(ControlProperties, MarsAndTandemNeverExceedTheWindow) {
  for (std::string_view policy : {"mars", "tandem"}) {
    auto inst = make_policy(policy, {{"window_max", 12}, {"window_min", 2}, {"window_init", 12}});
    ASSERT_TRUE(inst) << inst.error().message();
    NodeModel model;
    EngineParams ep;
    ep.total_blocks = 5000;
    ASSERT_TRUE(model.observe(EngineJoined{1, ep}, {}));
    model.set_cpu(CpuView{8, 0, -1, {}});
    std::mt19937_64 rng(11);
    std::size_t max_live = 0;
    for (int t = 0; t < 3000; ++t) {
      const Time now = base::from_ns(std::int64_t{t} * 100'000'000);
      // Arrivals, KV stats, round ends and tool ends at random.
      const SessionId s = 1 + rng() % 200;
      const Session* cur = model.sessions().find(s);
      if (cur == nullptr) {
        Event e = RoundSubmitted{s, 1, 0, static_cast<std::uint32_t>(500 + rng() % 70000), 0, 100};
        (void)model.observe(e, now);
        inst->control->on_event(e, model, now);
      } else if (cur->state == SessionState::kReasoning && cur->round_in_flight) {
        Event e = RoundEnded{s, 1, cur->round, 50, 100, rng() % 3 != 0};
        (void)model.observe(e, now);
        inst->control->on_event(e, model, now);
      } else if (cur->state == SessionState::kActing || cur->state == SessionState::kReasoning) {
        Event e = rng() % 4 == 0 ? Event(SessionClosed{s}) : Event(RoundSubmitted{s, 1, cur->round + 1, 800, 700, 60});
        (void)model.observe(e, now);
        inst->control->on_event(e, model, now);
      }
      KvPoolStats kv;
      kv.blocks_total = 5000;
      kv.blocks_free = static_cast<std::uint32_t>(rng() % 5000);
      (void)model.observe(KvStatsReported{1, kv}, now);
      Actions out;
      inst->control->tick(model, now, out);
      for (const Action& a : out.list()) {
        if (a.kind == ActionKind::kAdmit) (void)model.sessions().transition(a.session, SessionState::kReasoning, now);
        if (a.kind == ActionKind::kPause) (void)model.sessions().transition(a.session, SessionState::kPaused, now);
        if (a.kind == ActionKind::kRestore) (void)model.sessions().transition(a.session, SessionState::kReasoning, now);
      }
      model.sessions().reap_done();
      const std::size_t live = model.sessions().count(SessionState::kReasoning) +
                               model.sessions().count(SessionState::kActing) +
                               model.sessions().count(SessionState::kPaused);
      max_live = std::max(max_live, live);
      ASSERT_LE(live, 12u) << policy << " at tick " << t;
    }
    EXPECT_GT(max_live, 6u) << policy << ": the workload must actually press on the window";
  }
}

}  // namespace
}  // namespace tandem::sched
