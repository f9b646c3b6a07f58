// Coordinator: the step half of the daemon's policy, run inside the engine
// (tandem_engine_plan_step, tandem_engine_keep_decision).
//
// The daemon names the policy and its parameters in PolicyConfig; the
// coordinator builds it with sched::make_policy() and keeps only its
// StepScheduler. A config that does not build (unknown policy, bad
// parameter) changes nothing: the previous policy stays. Before the first
// config it runs "fcfs" with its defaults (vLLM V1's scheduler).
//
// plan() translates the C step input into sched::StepInput (validating every
// field, since a bad phase or priority would index out of range inside a
// policy), runs the scheduler and copies the plan into the caller's arrays.
// Scratch vectors are kept across steps so a warm engine loop allocates
// nothing.
//
// Tool durations. Policies learn how long each kind of tool runs
// (StepScheduler::on_tool_end: Continuum's TTL, InferCept's waste terms,
// tandem's release order). The simulator tells them the tool's wall time;
// an engine never sees the tool, which runs under the agent's runner. The
// coordinator measures it as the MARS repo does: from a round's end with a
// tool to follow (keep()) to the arrival of the session's next request (the
// first plan() that shows a request of the session that arrived at or after
// that end). It so includes the runner's own time between the tool and the
// next round, and any think time there.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/id_map.h"
#include "base/result.h"
#include "sched/policy.h"
#include "tandem/tandem.h"

namespace tandem::client {

// Thread-safety: one thread (the engine's scheduling loop).
class Coordinator {
 public:
  // The initial policy: "fcfs" with its defaults.
  static base::Result<Coordinator> create();

  // Switches to `name` with `params`; on error nothing changes.
  base::Result<void> configure(std::string_view name, const std::map<std::string, double>& params, std::uint64_t epoch);

  const std::string& policy_name() const { return name_; }
  std::uint64_t epoch() const { return epoch_; }

  // Plans one step. Returns 0 or -errno; on error `error` says why and
  // `out` is untouched. `in` and `out` are full-size copies (sz checked by
  // the caller).
  int plan(const tandem_step_input& in, tandem_step_plan& out, std::string& error);

  // The keep decision for a finished round. A round that a tool follows
  // starts that tool's clock (above).
  sched::KeepPlan keep(const tandem_round_end_info& info);

  // Session `id` is over (a CLOSE directive, or the engine closed it): the
  // scheduler forgets what it kept about it (Autellix's program service,
  // tandem's pins), so its per-session state lives as long as the session.
  // Stamped with the last step's `now_ns`, the engine's clock.
  void session_end(std::uint64_t id);

 private:
  // A tool whose end the next request of its session will show.
  struct ToolInFlight {
    sched::ToolKind kind = 0;
    base::Time since{};  // the round's end, the engine's clock
  };
  void observe_tool_ends();

  std::string name_;
  std::unique_ptr<sched::StepScheduler> step_;
  std::uint64_t epoch_ = 0;
  base::Time last_now_{};  // the last plan's now_ns
  std::vector<sched::StepRequest> requests_;
  std::vector<sched::PinnedKv> pinned_;
  sched::StepPlan plan_;
  base::IdMap<ToolInFlight> tools_;  // by session; at most one per open session
};

}  // namespace tandem::client
