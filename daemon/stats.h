// What tandemd counts (ServerStats) and how much it holds on clients'
// behalf (Footprint): read by tandemctl status and the metrics
// (daemon/ctl_service.h), and by tests through Server::stats() and
// Server::footprint().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tandem::daemon {

// Thread-safety: a value type, written by the loop thread.
struct ServerStats {
  std::uint64_t records_accepted = 0;
  std::uint64_t records_rejected = 0;  // failed validation, authorization or the session table
  std::uint64_t records_late = 0;      // about a session that had ended: ignored (events.h Verdict)
  std::uint64_t messages = 0;
  std::uint64_t ticks = 0;
  std::uint64_t actions = 0;
  std::uint64_t directives = 0;
  std::uint64_t directives_dropped = 0;  // a client's directive backlog was full
  std::uint64_t clients_accepted = 0;
  std::uint64_t clients_refused = 0;  // handshake failed
  std::uint64_t clients_dropped = 0;  // removed for misbehaving
  std::uint64_t effects_cpu_weight = 0;
  std::uint64_t effects_cpu_quota = 0;
  std::uint64_t effects_kill_tools = 0;
  std::uint64_t effects_sm_partition = 0;
  std::uint64_t offload_plan_changes = 0;  // the GPU plane changed an engine's weight-offload plan
  std::uint64_t resyncs = 0;               // Resync messages taken
  std::uint64_t tools_prepared = 0;        // ToolPrepare answered with a cgroup
  std::uint64_t tools_refused = 0;         // ToolPrepare answered with an error
  // An exception escaped a handler (a bug): answered as an error, counted,
  // logged, and the loop went on.
  std::uint64_t internal_errors = 0;
  std::uint64_t names_refused = 0;  // client or session names that failed base::name_problem()
  // Refused at accept or Hello by the per-uid cap, the reserved slots, or the ctl cap.
  std::uint64_t clients_refused_limits = 0;
  std::uint64_t ctl_idle_closed = 0;  // ctl connections closed for idling
  std::uint64_t accept_errors = 0;    // accept() failures (EMFILE, ENFILE, ...): backed off
  // Resync entries refused: another runner's session, a closed one, a bad
  // state, over the client's limit.
  std::uint64_t resync_refused = 0;
  std::uint64_t sessions_detached = 0;    // held for a runner handle whose connection ended
  std::uint64_t sessions_reattached = 0;  // given back to it by its resync
  std::uint64_t sessions_restored = 0;    // recreated at start from the ownership journal
  std::uint64_t unplaced_tools = 0;       // unplaced tools tracked by pid
  std::uint64_t unplaced_unverified = 0;  // ... not, their pid not a child of the runner
  // KV_EVENT records by ipc::KvEventKind − 1 (evicted, restored, offloaded,
  // dropped) and the blocks they moved.
  std::array<std::uint64_t, 4> kv_events{};
  std::array<std::uint64_t, 4> kv_event_blocks{};
  // [kv_events]: vLLM events (one per run of KV_BLOCKS records) published,
  // and those dropped (the PUB queue at its high-water mark, or the socket
  // could not be opened).
  std::uint64_t kv_events_published = 0;
  std::uint64_t kv_events_dropped = 0;
  std::uint64_t recomputed_tokens = 0;  // prompt tokens a session had computed before and the engine did not hit
  double tick_seconds = 0;              // Σ control tick durations
  double tick_seconds_max = 0;
};

// How much the daemon holds on clients' behalf (bounded by the limits;
// tandemctl status shows it as "tables").
// Thread-safety: a value type.
struct Footprint {
  std::size_t clients = 0;
  std::size_t sessions = 0;       // in the session table
  std::size_t session_meta = 0;   // names and owners of sessions
  std::size_t pending_names = 0;  // names waiting for their session, all clients
  std::size_t owners = 0;         // runner handles holding sessions
  std::size_t detached = 0;       // ... of which no connection is attached
  std::size_t tombstones = 0;
};

}  // namespace tandem::daemon
