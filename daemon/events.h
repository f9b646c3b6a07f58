// From the wire to the policy core: a validated ring record (ipc/records.h)
// becomes the sched::Event a policy is fed (sched/types.h).
//
// This lives in daemon/ because it is the one place that sees both: sched/
// depends on base/ alone, and ipc/ knows nothing of policies. The record has
// already passed RecordDecoder (copied out of shared memory, every field
// checked), so the mapping is total for the nine client → daemon types and
// has no error path; directives (daemon → client) are not events.
#pragma once

#include <optional>

#include "ipc/records.h"
#include "sched/types.h"

namespace tandem::daemon {

// The event a record from client `client` means, or nullopt for a directive.
// Engine records are attributed to the engine that sent them: `client` is its
// id, whatever the record might claim.
std::optional<sched::Event> to_event(const ipc::Record& record, sched::EngineId client);

// Who may put a record type on its event ring, and what the record needs of
// its session: the one table ring intake consults (Server::authorize, then
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

// The sender's timestamp of a record, on the same clock as the daemon's.
inline sched::Time record_time(const ipc::Record& record) { return base::from_ns(record.timestamp_ns()); }

}  // namespace tandem::daemon
