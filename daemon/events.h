// From the wire to the policy core: a validated ring record (ipc/records.h)
// becomes the sched::Event a policy is fed (sched/types.h), and one entry of
// a client's Resync snapshot (ipc/schema/tandem.fbs SessionSnapshot) becomes
// the events that bring the daemon's table to what the client says. These
// are the only two conversions from the wire to events.
//
// This lives in daemon/ because it is the one place that sees both: sched/
// depends on base/ alone, and ipc/ knows nothing of policies. The record has
// already passed RecordDecoder (copied out of shared memory, every field
// checked), so the mapping is total for the nine client → daemon types and
// has no error path; directives (daemon → client) are not events. A snapshot
// entry has been verified as flatbuffers and its state and residency range
// checked; whether the client may say what it says (its own session, a round
// not in flight elsewhere, …) is the server's to decide before it asks for
// the steps (daemon/sessions.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "ipc/records.h"
#include "ipc/schema/tandem_generated.h"
#include "sched/session_table.h"
#include "sched/types.h"

namespace tandem::daemon {

// The event a record from client `client` means, or nullopt for a directive.
// Engine records are attributed to the engine that sent them: `client` is its
// id, whatever the record might claim. Tool kinds are the sender's own: a
// record's kind becomes base::principal_tool_kind(principal, kind), with
// `principal` the sender's uid, so what the policy learns of a kind from one
// user's reports decides only for that user's sessions.
std::optional<sched::Event> to_event(const ipc::Record& record, sched::EngineId client, std::uint32_t principal);

// Who may put a record type on its event ring, and what the record needs of
// its session: the one table ring intake consults (authorize() below, then
// Server::take_record), beside to_event(), the one conversion.
enum class Sender : std::uint8_t {
  kNobody,  // a directive (daemon → client): never accepted on an event ring
  kEngine,
  kRunner,
};
enum class SessionRule : std::uint8_t {
  kNone,           // the engine's own pool or GPU: no session
  kSubmit,         // ROUND_SUBMIT: no round of it in flight on another engine; a new session is charged
  kRoundOnSender,  // its round is on the sending engine
  kOpen,           // SESSION_OPEN: not another runner's; charged unless already its runner's
  kOwned,          // a live session, not another runner's; charged when a runner takes over an engine's
};
struct RecordRule {
  Sender sender = Sender::kNobody;
  SessionRule session = SessionRule::kNone;
  bool gpu_plane = false;  // state for the GPU plane (daemon/gpu_plane.h), not a policy event
};
RecordRule record_rule(ipc::RecordType type);

// What ring intake makes of one record under its rule: taken, or refused
// with a reason (counted, not answered), or refused at the client's session
// limit (answered: the client is told which session was not taken), or late:
// about a session that has ended, which a client cannot always know yet (a
// runner's SESSION_CLOSE can overtake its engine's ROUND_END, which waits in
// the engine's ring for the tick), so it is ignored and counted apart, not
// held against the client.
//
// authorize() leaves one check to its caller: a verdict that charges the
// sender a session (kCharged) is taken only while the sender has room for
// one more under limits.sessions_per_client; otherwise it is over_limit(why).
struct Verdict {
  enum class Kind : std::uint8_t { kTaken, kCharged, kRefused, kOverLimit, kLate };
  Kind kind = Kind::kTaken;
  const char* why = "";  // kCharged: what the sender is told when it has no room
  bool ok() const { return kind == Kind::kTaken || kind == Kind::kCharged; }
  static Verdict taken() { return {}; }
  static Verdict charged(const char* why_if_full) { return {Kind::kCharged, why_if_full}; }
  static Verdict refused(const char* why) { return {Kind::kRefused, why}; }
  static Verdict over_limit(const char* why) { return {Kind::kOverLimit, why}; }
  static Verdict too_late(const char* why) { return {Kind::kLate, why}; }
};

// Who sent a record, as far as authorize() asks.
struct Sending {
  Sender as = Sender::kNobody;  // the client's role: kEngine or kRunner
  std::uint32_t client = 0;     // its id (an engine's is its EngineId)
  std::uint32_t owner = 0;      // a runner's handle (daemon/owners.h Owner id; 0: none)
};
// What the daemon holds of the record's session.
struct SessionFacts {
  const sched::Session* live = nullptr;  // the policy's table entry (nullptr: none)
  std::optional<std::uint32_t> owner;    // the daemon's meta of it: its runner handle (0: none); nullopt: no meta
  // It has ended: DONE in the table, or remembered by a tombstone. Read only
  // by the rules about a live session (kRoundOnSender, kOwned).
  bool ended = false;
};
// Whether a record of rule `rule` from `from` about a session the daemon
// holds as `session` is taken. Pure: it changes nothing and sends nothing;
// ring intake (daemon/intake.cc) gathers the facts, applies the session
// limit to a charged verdict, and acts on it. `session` is read only for
// rules with a session.
Verdict authorize(const Sending& from, const RecordRule& rule, const SessionFacts& session);

// ---- resync ------------------------------------------------------------------

// A step of a resync that is not an event: the engine runs the session's
// round, so it was admitted before the daemon could see it, and a WAITING
// session becomes REASONING in the table (admission is otherwise the
// policy's action, never an event).
struct MarkRunning {
  sched::SessionId session = 0;
  bool operator==(const MarkRunning&) const = default;
};
using ResyncStep = std::variant<sched::Event, MarkRunning>;

// The steps, in order, that bring the table to one entry of a Resync from a
// runner or an engine (`sender`; an engine's are attributed to its id
// `client`), given the table's session now (`current`; nullptr or DONE: not
// live) and, for an engine, whether a runner owns the session
// (`runner_owned`: then a session between rounds is the runner's to
// describe). A runner's entry opens a session the table does not hold live
// and starts its tool if one runs and the table has none; an engine's
// submits its round unless one is in flight, marks it running unless
// WAITING, and ends it with a tool following if ACTING; PAUSED says nothing.
// Pure. Run them as the daemon does: events through the model and policy,
// a MarkRunning as SessionTable::transition(session, kReasoning) when the
// session is WAITING.
// `principal`: the sender's uid, whose own tool kinds the entry's are (to_event).
std::vector<ResyncStep> resync_steps(const wire::SessionSnapshot& snap, Sender sender, sched::EngineId client,
                                     std::uint32_t principal, const sched::Session* current, bool runner_owned);

// The sender's timestamp of a record, on the same clock as the daemon's.
inline sched::Time record_time(const ipc::Record& record) { return base::from_ns(record.timestamp_ns()); }

}  // namespace tandem::daemon
