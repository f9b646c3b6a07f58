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

// The sender's timestamp of a record, on the same clock as the daemon's.
inline sched::Time record_time(const ipc::Record& record) { return base::from_ns(record.timestamp_ns()); }

}  // namespace tandem::daemon
