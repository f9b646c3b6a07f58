// tandemd's ring intake: records from clients' event rings, checked, authorized and fed to the model and the policy
// (daemon/server.h).

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/ids.h"
#include "base/text.h"
#include "daemon/events.h"
#include "daemon/server.h"
#include "daemon/server_parts.h"

namespace tandem::daemon {

using base::Time;
using sched::SessionState;

// ---- ring pump ------------------------------------------------------------------

void Server::pump() {
  const Time now = clock_->now();
  for (int round = 0; round < kPumpRounds; ++round) {
    bool more = false;
    for (auto& [id, c] : clients_) {
      if (c.doomed() || !c.rings.pending || !c.rings.attached) continue;
      more |= pump_client(c, now);
    }
    if (!more) break;
  }
  for (auto& [id, c] : clients_) {
    if (!c.doomed() && c.rings.attached && !c.rings.backlog.empty()) flush_backlog(c);
    if (!c.engine.kv_batch.empty()) flush_kv_events(c);
  }
  ring_directive_bells();
}

bool Server::pump_client(Client& c, Time now) {
  const Limits& limits = config_->config().limits;
  const std::uint64_t allowed = std::min<std::uint64_t>(limits.pump_batch, c.budgets.records.available(now));
  if (allowed == 0) {
    c.rings.pending = false;  // over its record rate: the tick looks again
    return false;
  }
  batch_.resize(allowed);
  const std::size_t n = c.rings.events.pop_batch(batch_);
  c.budgets.records.take(n);
  c.counts.rejected_this_round = 0;
  for (std::size_t i = 0; i < n && !c.doomed(); ++i) {
    ++c.counts.records_taken;
    ipc::Record record;
    std::string_view problem;
    const ipc::DecodeStatus st = c.rings.decoder.decode(batch_[i], record, &problem);
    if (st != ipc::DecodeStatus::kOk) {
      reject_record(c, problem.empty() ? std::string_view("undecodable record") : problem);
      continue;
    }
    take_record(c, record, now);
  }
  if (c.doomed()) return false;
  if (c.rings.events.corruption_count() > 0) {
    doom(c, "its event ring is corrupt (indices or slot sequence numbers were tampered with)", true);
    return false;
  }
  if (c.counts.rejected_this_round >= kHostileRejects) {
    doom(c, fmt::format("sent {} bad records in one batch", c.counts.rejected_this_round), true);
    return false;
  }
  if ((c.rings.channel.segment().take_flags(ipc::kFlagResyncNeeded) & ipc::kFlagResyncNeeded) != 0) {
    send_message(c, ipc::build_resync_request("events were lost: the event ring and its overflow were full"));
  }
  if (n == allowed) return true;  // more may be waiting: another round
  // Drained: announce we sleep with a watermark, re-check, and wait on the
  // doorbell. The tick drains whatever stays below the watermark.
  const std::uint32_t watermark = wake_watermark(c);
  c.rings.event_bell.arm(watermark);
  if (c.rings.events.available() >= watermark) {
    c.rings.event_bell.disarm();
    return true;
  }
  c.rings.pending = false;
  if (!c.armed.bell) {
    loop_.uring().read(c.rings.channel.event_bell_fd(), &c.armed.bell_buf, sizeof c.armed.bell_buf,
                       Tag{Op::kClientBell, c.id});
    c.armed.bell = true;
  }
  return false;
}

void Server::reject_record(Client& c, std::string_view why) {
  ++c.counts.rejected;
  ++c.counts.rejected_this_round;
  ++stats_.records_rejected;
  if (!c.warned.record) {
    spdlog::warn("client {} ({} \"{}\"): rejected a record: {} (further rejections are only counted)", c.id,
                 to_string(c.role), c.name, why);
    c.warned.record = true;
  }
}

Verdict Server::authorize(const Client& c, const ipc::Record& r, const RecordRule& rule) const {
  SessionFacts session;
  if (rule.session != SessionRule::kNone) {
    session.live = control_->model().sessions().find(r.session());
    if (const SessionMeta* m = sessions_.find(r.session())) session.owner = m->owner;
    const bool about_live = rule.session == SessionRule::kRoundOnSender || rule.session == SessionRule::kOwned;
    session.ended = session.live != nullptr ? session.live->state == SessionState::kDone
                                            : about_live && sessions_.ledger().tombstone(r.session()).has_value();
  }
  const Sending from{c.role == Role::kEngine ? Sender::kEngine : Sender::kRunner, c.id, c.owner};
  const Verdict v = daemon::authorize(from, rule, session);
  if (v.kind == Verdict::Kind::kCharged && !may_open_session(c)) return Verdict::over_limit(v.why);
  return v;
}

void Server::take_record(Client& c, const ipc::Record& r, Time now) {
  const RecordRule rule = record_rule(r.type());
  if (const Verdict v = authorize(c, r, rule); !v.ok()) {
    if (v.kind == Verdict::Kind::kLate) {  // not the client's fault: ignored, counted apart
      ++c.counts.late;
      ++stats_.records_late;
      return;
    }
    if (v.kind == Verdict::Kind::kOverLimit)
      refuse_session(c, r.session());  // answered: the client learns which session was not taken
    reject_record(c, v.why);
    return;
  }
  if (rule.gpu_plane) {
    // GPU-plane state, not policy events.
    auto taken = control_->gpu().on_record(c.id, r);
    if (!taken) {
      reject_record(c, taken.error().context());
      return;
    }
    // A new pool: the index published for the old one means nothing until
    // the next tick chooses one for this pool.
    if (*taken) {
      c.engine.gpu.sm_partition_set = false;
      publish_status(c, now);
    }
    ++c.counts.accepted;
    ++stats_.records_accepted;
    return;
  }
  if (r.type() == ipc::RecordType::kKvBlocks) {
    take_kv_blocks(c, r.as<ipc::KvBlocks>(), r.session());
    ++c.counts.accepted;
    ++stats_.records_accepted;
    return;
  }
  if (r.type() == ipc::RecordType::kKvStats) control_->gpu().on_kv_stats(c.id, r.as<ipc::KvStats>());
  auto event = to_event(r, c.id, c.uid);
  if (!event) {
    reject_record(c, "a directive on the event ring");
    return;
  }
  if (r.type() == ipc::RecordType::kSessionOpen) {
    const sched::Session* s = control_->model().sessions().find(r.session());
    if (s != nullptr && s->state != SessionState::kDone) {
      // The engine's first round opened it: a runner's SESSION_OPEN and its
      // engine's ROUND_SUBMIT travel on different rings, so either may come
      // first. The runner takes the session over (authorize() checked that
      // no other runner holds it); its hints come too late for the policy,
      // which saw the session arrive with the round.
      SessionMeta& m = sessions_.meta_for(c, r.session());
      if (m.owner != c.owner) log_event(now, LogKind::kSessionTakeover, r.session());
      sessions_.set_owner(c, r.session(), m);
      m.attached_at = c.counts.records_taken;
      ++c.counts.accepted;
      ++stats_.records_accepted;
      return;
    }
  }
  count_record(r);
  // The host plane tracks tool calls whatever the scheduler makes of them
  // (a runner may run tools in a session no engine has seen).
  if (r.type() == ipc::RecordType::kToolStart) {
    const auto t = r.as<ipc::ToolStart>();
    effects_->tool_started(r.session(), t.tool_call, static_cast<std::int32_t>(t.pid));
    if (t.cgroup_id == 0) track_unplaced(c, r.session(), t.tool_call, static_cast<std::int32_t>(t.pid));
  } else if (r.type() == ipc::RecordType::kToolEnd) {
    const std::uint32_t call = r.as<ipc::ToolEnd>().tool_call;
    effects_->tool_ended(r.session(), call);
    unplaced_.ended(r.session(), call);
  }
  if (!control_->feed(*event, now)) {
    const sched::Session* s = control_->model().sessions().find(r.session());
    reject_record(c, fmt::format("{}: not legal in the session's state ({}{})", ipc::record_type_name(r.type()),
                                 s == nullptr ? "no such session" : sched::to_string(s->state),
                                 s != nullptr && s->round_in_flight ? ", a round in flight" : ""));
    return;
  }
  ++c.counts.accepted;
  ++stats_.records_accepted;
  if (r.type() == ipc::RecordType::kKvStats) return;
  const sched::Session* s = control_->model().sessions().find(r.session());
  if (s == nullptr) return;
  SessionMeta& m = sessions_.meta_for(c, r.session());
  if (c.role == Role::kRunner) {
    if (m.owner != c.owner) sessions_.set_owner(c, r.session(), m);  // a runner takes over an engine-opened session
    if (r.type() == ipc::RecordType::kSessionOpen) m.attached_at = c.counts.records_taken;
  }
  if (r.type() == ipc::RecordType::kSessionClose) sessions_.ledger().ended(r.session(), Closed::kByOwner);
  if (r.type() == ipc::RecordType::kRoundSubmit && s->state == SessionState::kReasoning && m.steer.told != c.id) {
    // Admitted before this round reached this engine (a runner opened it and
    // the policy admitted it, or it moved engines): the engine has not been
    // told it may run, so tell it now.
    send_directive(c.id, directive_slot(ipc::Admit{}, r.session(), now));
    m.steer.told = c.id;
  }
}

// ---- KV events for routers (daemon/kv_events.h) -------------------------------------

// Each engine's batch goes out through kv_events_ (KvEventsOut, which bounds
// it); the Server counts what was published and dropped.
void Server::take_kv_blocks(Client& c, const ipc::KvBlocks& r, std::uint64_t session) {
  count_kv_events(kv_events_.add(c.engine.kv_batch, c.engine.kv_seq, c.name, r, session));
}

void Server::flush_kv_events(Client& c) {
  count_kv_events(kv_events_.flush(c.engine.kv_batch, c.engine.kv_seq, c.name));
}

void Server::count_kv_events(const KvEventsOut::Sent& sent) {
  stats_.kv_events_published += sent.published;
  stats_.kv_events_dropped += sent.dropped;
}

// Counters for the metrics that the session table does not keep: KV moves
// by kind, and the tokens a round computes again because its session's
// earlier context was not served from cache (the part of the prompt that
// the session had computed before, less the engine's prefix hit).
void Server::count_record(const ipc::Record& r) {
  if (r.type() == ipc::RecordType::kKvEvent) {
    const auto e = r.as<ipc::KvEvent>();
    const std::size_t kind = e.kind - 1u;  // KvEventKind 1..4, validated by the decoder
    if (kind < stats_.kv_events.size()) {
      ++stats_.kv_events[kind];
      stats_.kv_event_blocks[kind] += e.blocks;
    }
  } else if (r.type() == ipc::RecordType::kRoundSubmit) {
    const auto rs = r.as<ipc::RoundSubmit>();
    if (const sched::Session* s = control_->model().sessions().find(r.session())) {
      const std::uint32_t known = std::min(rs.prompt_tokens, s->context_tokens);
      if (known > rs.cached_tokens) stats_.recomputed_tokens += known - rs.cached_tokens;
    }
  }
}

void Server::log_event(Time now, LogKind kind, sched::SessionId session, std::array<std::int64_t, 4> v) {
  std::string_view name;
  if (kind == LogKind::kSessionClose || kind == LogKind::kKill) {
    if (const SessionMeta* m = sessions_.find(session)) name = m->name;
  }
  log_.add(now, kind, session, v, name);
}

}  // namespace tandem::daemon
