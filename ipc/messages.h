// Socket messages (docs/architecture.md "Wire records"): one flatbuffers `wire::Message` per
// SOCK_SEQPACKET datagram, with up to kMaxMessageFds fds attached (SCM_RIGHTS).
//
// Receiving is where the trust boundary is. recv_message() reads exactly one
// datagram into a buffer one byte larger than the largest legal message (so an
// oversized one is seen, never silently cut), takes ownership of every fd that
// arrived before it looks at anything else, and hands back the message only
// after verify_message() has checked the whole buffer: size, identifier,
// flatbuffers bounds with explicit depth and table limits, and a payload type
// this build knows. Anything else is an error and every received fd is closed.
//
// The builders return a finished, 8-byte-aligned buffer ready for
// send_message(). They only encode; what a field may hold (e.g. Hello.engine
// present iff role == Engine) is checked by the receiver, which must not trust
// the sender to have used these builders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/schema/tandem_generated.h"

namespace tandem::ipc {

// Bumps on any incompatible change to ipc/schema/tandem.fbs.
inline constexpr std::uint32_t kProtocolVersion = 1;
// Largest datagram either side sends or accepts.
inline constexpr std::size_t kMaxMessageSize = 64 * 1024;
// Most fds one message may carry (Welcome carries three, ToolPlacement one
// per cgroup hierarchy).
inline constexpr std::size_t kMaxMessageFds = 8;

// Checks that `bytes` holds one well-formed Message this build understands and
// returns its root, which points into `bytes`. Pure: no I/O, and it
// allocates only to describe a failure.
// Errors: EMSGSIZE (larger than kMaxMessageSize), EBADMSG (anything malformed,
// including a NONE or unknown payload type), EINVAL (`bytes` does not start on
// an 8-byte boundary: a caller bug, since flatbuffers reads scalars in place).
base::Result<const wire::Message*> verify_message(std::span<const std::uint8_t> bytes);

// Sends `bytes` as one datagram on a SOCK_SEQPACKET socket, with `fds`
// attached (they stay open and owned by the caller). Never raises SIGPIPE.
// Errors: EINVAL (empty message, more than kMaxMessageFds fds), EMSGSIZE
// (larger than kMaxMessageSize), and sendmsg's own (EAGAIN on a full
// non-blocking socket, EPIPE when the peer is gone).
base::Result<void> send_message(int sock, std::span<const std::uint8_t> bytes, std::span<const int> fds = {});

// One verified datagram and the fds that came with it (all O_CLOEXEC).
// Thread-safety: a value type.
struct ReceivedMessage {
  std::vector<std::uint8_t> bytes;
  std::vector<base::UniqueFd> fds;

  // The verified root (nullptr for a default-constructed one). Valid while
  // `bytes` is alive and unmodified.
  const wire::Message* message() const;
};

// Receives one datagram from a SOCK_SEQPACKET socket and verifies it.
// Errors: ECONNRESET (the peer closed the connection — a 0-byte datagram reads
// the same, and is not a legal message either), EAGAIN (non-blocking socket,
// nothing queued), EMSGSIZE (datagram larger than kMaxMessageSize; it is
// discarded and the socket stays usable), EBADMSG (ancillary data truncated,
// more than kMaxMessageFds fds, or verify_message() failed), and recvmsg's own.
// On every error, fds that arrived are closed.
base::Result<ReceivedMessage> recv_message(int sock);

// --- Builders -------------------------------------------------------------

// Static description of an engine; mirrors wire::EngineParams.
struct EngineInfo {
  std::int32_t gpu_index = -1;
  std::uint32_t block_size = 0;         // tokens per KV block
  std::uint32_t total_blocks = 0;       // KV blocks in the engine's pool
  std::uint32_t max_seqs = 0;           // max running sequences per step
  std::uint32_t token_budget = 0;       // max tokens per step
  std::uint32_t saturating_tokens = 0;  // step size from which a step is compute-bound, 0 = unknown
  std::uint32_t max_model_len = 0;      // 0 = unknown
};

// What the daemon tells a client in Welcome (protocol version is implied).
struct WelcomeInfo {
  std::uint32_t client_id = 0;
  std::uint64_t segment_size = 0;
  std::uint32_t event_slots = 0;
  std::uint32_t directive_slots = 0;
  // The daemon's limits the client should apply itself (0: not told).
  std::uint32_t max_name = 0;
  std::uint32_t sessions_per_client = 0;
  std::uint32_t tools_per_session = 0;
  bool tool_ahead = false;  // the daemon takes ToolPrepare.ahead
};

// Hello carries kProtocolVersion. `engine` should be set iff role == Engine.
// `instance` names the handle within its process (Hello.instance).
std::vector<std::uint8_t> build_hello(wire::Role role, std::string_view name, std::int32_t pid,
                                      const std::optional<EngineInfo>& engine = std::nullopt,
                                      std::uint64_t instance = 0);
std::vector<std::uint8_t> build_welcome(const WelcomeInfo& info);
// `code` is a positive errno value; `session` what it is about (0: none);
// `fatal`: the sender closes the connection after it.
std::vector<std::uint8_t> build_error(std::int32_t code, std::string_view message, std::uint64_t session = 0,
                                      bool fatal = false);
std::vector<std::uint8_t> build_session_name(std::uint64_t session, std::string_view name);
std::vector<std::uint8_t> build_resync_request(std::string_view reason);

// A running tool call in a SessionSnapshot; mirrors wire::ToolSnapshot.
struct ToolSnapshotInfo {
  std::uint32_t call = 0;
  std::int32_t pid = 0;
  std::uint64_t cgroup_id = 0;
};

// One live session of a client, as it sends it in Resync; mirrors
// wire::SessionSnapshot. `state` and `residency` are sched::SessionState and
// sched::Residency values (ipc/ does not depend on sched/).
struct SessionSnapshotInfo {
  std::uint64_t session = 0;
  std::string name;
  std::uint8_t state = 0;
  std::uint8_t residency = 0;
  std::uint32_t round = 0;
  std::uint32_t blocks_held = 0;
  bool in_tool = false;
  std::uint64_t tool_kind = 0;
  std::vector<ToolSnapshotInfo> tools;
};
// Sessions that fit in one datagram with their names (the caller splits a
// larger snapshot and sets `more` on all but the last message).
inline constexpr std::size_t kResyncBatch = 256;
// `ring_position`: Resync.ring_position.
std::vector<std::uint8_t> build_resync(std::span<const SessionSnapshotInfo> sessions, bool more,
                                       std::uint64_t ring_position = 0);
// `keys` and `values` are parallel.
std::vector<std::uint8_t> build_policy_config(std::uint64_t epoch, std::string_view name,
                                              std::span<const std::string> keys, std::span<const double> values);
// `cursor`: the previous page's `next` ("" for the first page).
std::vector<std::uint8_t> build_ctl_request(std::string_view command, std::span<const std::string> args, bool json,
                                            std::string_view cursor = {});
// `status` is 0 or a positive errno value; `next`: the cursor of the next
// page ("" when this is the last).
std::vector<std::uint8_t> build_ctl_response(std::int32_t status, std::string_view body, std::string_view next = {});

// Why a tool call ended (ToolKilled.reason; tandem.h's tandem_tool_exit_reason).
enum class ToolExitReason : std::uint8_t {
  kExited = 0,         // it exited by itself
  kSignaled = 1,       // a signal not sent by tandem
  kOomKilled = 2,      // the kernel's OOM killer, at its cgroup's memory limit
  kKilledMemory = 3,   // tandemd: stalled at its memory limit too long, or memory pressure
  kKilledPolicy = 4,   // tandemd: the scheduling policy
  kKilledSession = 5,  // tandemd: its session ended or an operator killed it
};
inline constexpr std::uint8_t kToolExitReasonMax = 5;

// Mirrors wire::ToolLimits (0 = unset).
struct ToolLimitsInfo {
  std::uint32_t cpu_quota_us = 0;
  std::uint32_t cpu_period_us = 0;
  std::uint64_t memory_high = 0;
  std::uint64_t memory_max = 0;
  std::uint64_t pids_max = 0;
  bool low_priority = false;
  friend bool operator==(const ToolLimitsInfo&, const ToolLimitsInfo&) = default;
};
// `ahead`: for the session's next call, before it starts (ToolPrepare.ahead).
std::vector<std::uint8_t> build_tool_prepare(std::uint32_t request, std::uint64_t session, std::uint32_t call,
                                             std::uint64_t tool_kind, const ToolLimitsInfo& limits, bool ahead = false);
// Mirrors wire::ToolPlacement. has_v2 … cpu_fd say which of the attached
// fds is which: cpu/cgroup_dirs.h's DirsLayout, field for field, made by
// encode_dirs() and checked by decode_dirs() (ipc/ cannot name cpu/'s types).
struct ToolPlacementInfo {
  std::uint32_t request = 0;
  std::int32_t code = 0;
  std::string message;
  std::uint64_t cgroup_id = 0;
  bool has_v2 = false;
  std::uint8_t v1_count = 0;
  std::int8_t cpuacct_fd = -1;
  std::int8_t memory_fd = -1;
  std::int8_t cpu_fd = -1;
  std::string bwrap;
  std::vector<std::string> bwrap_args;
};
std::vector<std::uint8_t> build_tool_placement(const ToolPlacementInfo& info);
// The inverse of build_tool_placement() on a verified message: every field,
// unchecked (what the fds may be is decode_dirs()'s to judge).
ToolPlacementInfo parse_tool_placement(const wire::ToolPlacement& placement);
std::vector<std::uint8_t> build_tool_killed(std::uint64_t session, std::uint32_t call, std::uint8_t reason,
                                            std::string_view message);

}  // namespace tandem::ipc
