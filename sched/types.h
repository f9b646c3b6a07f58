// The vocabulary of the policy core (docs/architecture.md "Sessions"): ids, session states, KV
// residency, and the events every policy is fed.
//
// sched/ is pure: no syscalls, no clock reads, no threads. Time arrives as an
// argument (base::Time: CLOCK_MONOTONIC in the daemon, virtual time in the
// simulator). Events mirror the wire records of ipc/records.h, but sched/ does
// not depend on ipc/: the daemon decodes records and hands over these structs,
// and the simulator constructs them directly.
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>

#include "base/clock.h"

namespace tandem::sched {

using base::Duration;
using base::Time;
using SessionId = std::uint64_t;  // base::session_id(name); never 0
using EngineId = std::uint32_t;   // the daemon's client id of an engine
using ToolKind = std::uint64_t;   // base::tool_kind_id(name); 0 = unknown

inline constexpr EngineId kNoEngine = ~EngineId{0};

// docs/architecture.md "Sessions":
//   (new) ─submit→ WAITING ─admit→ REASONING ─round_end(tool)→ ACTING ─tool_end→ REASONING
//   REASONING (at a round end) or ACTING ─pause→ PAUSED ─restore→ REASONING
//   any ─close/owner died→ DONE
enum class SessionState : std::uint8_t { kWaiting, kReasoning, kActing, kPaused, kDone };

// Where a session's KV cache is, independent of its state.
enum class Residency : std::uint8_t {
  kNone,       // nothing computed yet
  kResident,   // in the engine's cache, evictable
  kPinned,     // held against eviction (while a tool runs)
  kOffloaded,  // copied to host memory
  kDropped,    // gone; the next round recomputes it
};

std::string_view to_string(SessionState s);
std::string_view to_string(Residency r);

// Whether `from → to` is a legal state transition.
bool legal_transition(SessionState from, SessionState to);

// ---- events -----------------------------------------------------------------

inline constexpr std::uint32_t kDefaultBlockSize = 16;  // vLLM on CUDA

// The static description of an engine (its Hello).
struct EngineParams {
  std::uint32_t block_size = kDefaultBlockSize;  // tokens per KV block (0: unknown)
  std::uint32_t total_blocks = 0;                // KV blocks in the pool
  std::uint32_t max_seqs = 256;                  // running sequences per step
  std::uint32_t token_budget = 8192;             // tokens per step
  std::uint32_t max_model_len = 131072;
  // block_size, or the default when the engine did not say.
  std::uint32_t block_size_or_default() const { return block_size > 0 ? block_size : kDefaultBlockSize; }
};

struct KvPoolStats {
  std::uint32_t blocks_total = 0;
  std::uint32_t blocks_free = 0;  // includes free-but-cached blocks
  std::uint32_t blocks_pinned = 0;
  std::uint32_t blocks_offloaded = 0;  // host copies, not part of blocks_total
  std::uint32_t running_seqs = 0;
  std::uint32_t waiting_seqs = 0;
  std::uint32_t step_tokens = 0;
  Duration step_time{};
  std::uint32_t host_blocks_total = 0;  // host memory for KV copies, in blocks (0 = unknown or unlimited)
  Duration offload_backlog{};           // copies to host still queued on the engine's link
  Duration host_oldest_idle{};          // idle time of the host copy a new one would evict first (0 = none)
};

enum class KvChange : std::uint8_t { kEvicted, kRestored, kOffloaded, kDropped };

struct EngineJoined {
  EngineId engine;
  EngineParams params;
};
struct EngineLeft {
  EngineId engine;
};
struct SessionOpened {
  SessionId session;
  std::uint8_t priority_class = 0;
  std::uint32_t expected_rounds = 0;
};
struct SessionClosed {
  SessionId session;
};
struct RoundSubmitted {
  SessionId session;
  EngineId engine;
  std::uint32_t round = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t cached_tokens = 0;
  std::uint32_t projected_blocks = 0;
};
struct RoundFirstToken {
  SessionId session;
  EngineId engine;
  std::uint32_t round;
  Duration queue_delay;
  Duration prefill;
};
struct RoundEnded {
  SessionId session;
  EngineId engine;
  std::uint32_t round = 0;
  std::uint32_t output_tokens = 0;
  std::uint32_t blocks_held = 0;
  bool tool_follows = false;
};
struct KvStatsReported {
  EngineId engine;
  KvPoolStats stats;
};
struct KvChanged {
  SessionId session;
  EngineId engine;
  KvChange change;
  std::uint32_t blocks;
};
struct ToolStarted {
  SessionId session;
  ToolKind kind;
  std::uint32_t tool_call;
};
struct ToolEnded {
  SessionId session;
  ToolKind kind;
  std::uint32_t tool_call;
  std::int32_t exit_code;
  Duration wall;
  Duration cpu;
  // Who reported it (tandemd: the runner's uid, daemon/events.h); the tool
  // model's bound on kinds is shared out among principals (sched/kind_table.h).
  std::uint32_t principal = 0;
};

using Event = std::variant<EngineJoined, EngineLeft, SessionOpened, SessionClosed, RoundSubmitted, RoundFirstToken,
                           RoundEnded, KvStatsReported, KvChanged, ToolStarted, ToolEnded>;

}  // namespace tandem::sched
