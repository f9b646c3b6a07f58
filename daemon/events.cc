// Wire records to policy events.
#include "daemon/events.h"

#include "base/ids.h"

namespace tandem::daemon {
namespace {

sched::Duration ns(std::uint64_t v) { return sched::Duration(static_cast<std::int64_t>(v)); }

}  // namespace

RecordRule record_rule(ipc::RecordType type) {
  using T = ipc::RecordType;
  using S = SessionRule;
  switch (type) {
    case T::kRoundSubmit:
      return {Sender::kEngine, S::kSubmit, false};
    case T::kRoundFirstToken:
    case T::kRoundEnd:
    case T::kKvEvent:
      return {Sender::kEngine, S::kRoundOnSender, false};
    case T::kKvStats:
    case T::kKvBlocks:  // the session only labels the blocks: no state of it is checked
      return {Sender::kEngine, S::kNone, false};
    case T::kGpuPartitions:
    case T::kStageProfile:
    case T::kWeightModule:
      return {Sender::kEngine, S::kNone, true};
    case T::kSessionOpen:
      return {Sender::kRunner, S::kOpen, false};
    case T::kSessionClose:
    case T::kToolStart:
    case T::kToolEnd:
      return {Sender::kRunner, S::kOwned, false};
    default:
      return {};
  }
}

Verdict authorize(const Sending& from, const RecordRule& rule, const SessionFacts& session) {
  if (rule.sender == Sender::kNobody) return Verdict::refused("a directive on the event ring");
  if (rule.sender != from.as) {
    return Verdict::refused(from.as == Sender::kEngine ? "an engine sent a runner's record"
                                                       : "a runner sent an engine's record");
  }
  const sched::Session* s = session.live;
  const std::optional<std::uint32_t>& owner = session.owner;
  const bool others = owner.has_value() && *owner != 0 && *owner != from.owner;  // another runner's
  switch (rule.session) {
    case SessionRule::kNone:
      return Verdict::taken();
    case SessionRule::kSubmit:
      if (s != nullptr && s->round_in_flight && s->engine != from.client) {
        return Verdict::refused("ROUND_SUBMIT: the session has a round in flight on another engine");
      }
      if (!owner) return Verdict::charged("ROUND_SUBMIT: over limits.sessions_per_client");  // a new session
      return Verdict::taken();
    case SessionRule::kRoundOnSender:
      if (session.ended) return Verdict::too_late("the session has ended");
      if (s == nullptr || s->engine != from.client)
        return Verdict::refused("the session's round is not on this engine");
      return Verdict::taken();
    case SessionRule::kOpen:
      if (others) return Verdict::refused("SESSION_OPEN: the session belongs to another runner");
      if (!owner || *owner != from.owner) return Verdict::charged("SESSION_OPEN: over limits.sessions_per_client");
      return Verdict::taken();
    case SessionRule::kOwned:
      if (session.ended) return Verdict::too_late("the session has ended");
      if (!owner || s == nullptr) return Verdict::refused("unknown session");
      if (others) return Verdict::refused("the session belongs to another runner");
      if (*owner == 0) return Verdict::charged("over limits.sessions_per_client");  // taking over an engine's
      return Verdict::taken();
  }
  return Verdict::refused("unknown session rule");
}

std::optional<sched::Event> to_event(const ipc::Record& record, sched::EngineId client, std::uint32_t principal) {
  using ipc::RecordType;
  const sched::SessionId session = record.session();
  switch (record.type()) {
    case RecordType::kRoundSubmit: {
      auto r = record.as<ipc::RoundSubmit>();
      return sched::RoundSubmitted{session, client, r.round, r.prompt_tokens, r.cached_tokens, r.projected_blocks};
    }
    case RecordType::kRoundFirstToken: {
      auto r = record.as<ipc::RoundFirstToken>();
      return sched::RoundFirstToken{session, client, r.round, ns(r.queue_delay_ns), ns(r.prefill_ns)};
    }
    case RecordType::kRoundEnd: {
      auto r = record.as<ipc::RoundEnd>();
      const bool tool = (r.header.flags & ipc::kRoundEndToolFollows) != 0;
      return sched::RoundEnded{session, client, r.round, r.output_tokens, r.blocks_held, tool};
    }
    case RecordType::kKvStats: {
      auto r = record.as<ipc::KvStats>();
      sched::KvPoolStats s;
      s.blocks_total = r.blocks_total;
      s.blocks_free = r.blocks_free;
      s.blocks_pinned = r.blocks_pinned;
      s.blocks_offloaded = r.blocks_offloaded;
      s.running_seqs = r.running_seqs;
      s.waiting_seqs = r.waiting_seqs;
      s.step_tokens = r.step_tokens;
      s.step_time = std::chrono::microseconds(r.step_time_us);
      return sched::KvStatsReported{client, s};
    }
    case RecordType::kKvEvent: {
      auto r = record.as<ipc::KvEvent>();
      sched::KvChange change = sched::KvChange::kEvicted;
      switch (static_cast<ipc::KvEventKind>(r.kind)) {
        case ipc::KvEventKind::kEvicted:
          change = sched::KvChange::kEvicted;
          break;
        case ipc::KvEventKind::kRestored:
          change = sched::KvChange::kRestored;
          break;
        case ipc::KvEventKind::kOffloaded:
          change = sched::KvChange::kOffloaded;
          break;
        case ipc::KvEventKind::kDropped:
          change = sched::KvChange::kDropped;
          break;
      }
      return sched::KvChanged{session, client, change, r.blocks};
    }
    case RecordType::kGpuPartitions:
    case RecordType::kStageProfile:
    case RecordType::kWeightModule:
    case RecordType::kKvBlocks:
      // GPU-plane state, and block hashes published for routers
      // (Server::take_kv_blocks): not policy events.
      return std::nullopt;
    case RecordType::kSessionOpen: {
      auto r = record.as<ipc::SessionOpen>();
      return sched::SessionOpened{session, r.priority_class, r.expected_rounds};
    }
    case RecordType::kSessionClose:
      return sched::SessionClosed{session};
    case RecordType::kToolStart: {
      auto r = record.as<ipc::ToolStart>();
      return sched::ToolStarted{session, base::principal_tool_kind(principal, r.tool_kind), r.tool_call};
    }
    case RecordType::kToolEnd: {
      auto r = record.as<ipc::ToolEnd>();
      return sched::ToolEnded{session,       base::principal_tool_kind(principal, r.tool_kind),
                              r.tool_call,   r.exit_code,
                              ns(r.wall_ns), ns(r.cpu_ns),
                              principal};
    }
    case RecordType::kAdmit:
    case RecordType::kPause:
    case RecordType::kRestore:
    case RecordType::kPriority:
    case RecordType::kPin:
    case RecordType::kUnpin:
    case RecordType::kDrop:
    case RecordType::kOffload:
    case RecordType::kPrefetch:
    case RecordType::kClose:
      return std::nullopt;
  }
  return std::nullopt;
}

std::vector<ResyncStep> resync_steps(const wire::SessionSnapshot& snap, Sender sender, sched::EngineId client,
                                     std::uint32_t principal, const sched::Session* current, bool runner_owned) {
  using S = sched::SessionState;
  const sched::SessionId id = snap.session();
  const bool live = current != nullptr && current->state != S::kDone;
  std::vector<ResyncStep> steps;
  if (sender == Sender::kRunner) {
    if (!live) steps.emplace_back(sched::Event{sched::SessionOpened{id}});
    // Call 0: the tool's call id is not in the snapshot's summary.
    if (snap.in_tool() && (!live || current->tool == 0)) {
      steps.emplace_back(
          sched::Event{sched::ToolStarted{id, base::principal_tool_kind(principal, snap.tool_kind()), 0}});
    }
    return steps;
  }
  if (sender != Sender::kEngine) return steps;
  const auto state = static_cast<S>(snap.state());
  const bool in_flight = state == S::kWaiting || state == S::kReasoning;
  if (state == S::kPaused || (runner_owned && !in_flight)) return steps;
  if (!in_flight && state != S::kActing) return steps;
  if (!live || !current->round_in_flight) {
    steps.emplace_back(sched::Event{sched::RoundSubmitted{id, client, snap.round(), 0, 0, snap.blocks_held()}});
  }
  if (state != S::kWaiting) steps.emplace_back(MarkRunning{id});
  if (state == S::kActing) {
    steps.emplace_back(sched::Event{sched::RoundEnded{id, client, snap.round(), 0, snap.blocks_held(), true}});
  }
  return steps;
}

}  // namespace tandem::daemon
