// Client: one libtandem handle — the connection to tandemd, the session
// table, and (engines) the in-process coordinator. tandem.h's functions are
// thin checks in front of these methods (api.cc).
//
// Connection state machine (docs/architecture.md "Wire records", "Trust model"). Nothing here ever blocks on
// the daemon: the socket is non-blocking and each state advances inside
// whatever call comes next.
//
//   kDisconnected ──(backoff expired: socket, connect, send Hello)──▶ kAwaitingWelcome
//   kAwaitingWelcome ──(Welcome + 3 fds: attach channel, resync)──▶ kConnected
//   kAwaitingWelcome ──(Error: the handshake refused)──▶ kDisconnected
//   any ──(EOF/ECONNRESET, a fatal Error, a bad message, no Welcome within
//          1 s, a send failure)──▶ kDisconnected, next attempt after the backoff
//
// An Error that answers one request (a session over the daemon's limit, a
// name it will not take) is not a disconnect: it is counted, the session it
// names is marked refused, and the connection stays. The daemon's limits
// come in its Welcome, and calls that would break them fail at once.
//
// The backoff starts at reconnect_min and doubles to reconnect_max; a
// Welcome resets it. In kDisconnected every call first checks the backoff
// (a clock read); in kAwaitingWelcome every call does one non-blocking
// recv; in kConnected the socket is read only by poll() and when a socket
// message is sent, so the per-record path is a ring push and nothing else.
//
// Fail-open. While not connected, records are dropped (counted) and a
// session's queued round is runnable if the daemon had admitted it before
// it went away, or if it holds one of `fallback_cap` local slots. Slots go
// to queued rounds in submit order when a caller asks, and come back at the
// round's end. On the next Welcome, slot holders become admitted (they keep
// running) and the resync snapshot tells the daemon so.
//
// Thread-safety: one thread at a time per Client (tandem.h's rule).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "cpu/cgroup_dirs.h"
#include "cpu/spawn.h"
#include "ipc/channel.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "libclient/coordinator.h"
#include "sched/types.h"
#include "tandem/tandem.h"

namespace tandem::client {

enum class Role : std::uint8_t { kEngine, kRunner };

struct Config {
  Role role = Role::kEngine;
  std::string socket_path;  // <runtime_dir>/tandemd.sock
  std::string name;
  std::uint32_t fallback_cap = 64;
  base::Duration reconnect_min = std::chrono::milliseconds(50);
  base::Duration reconnect_max = std::chrono::milliseconds(2000);
  std::optional<ipc::EngineInfo> engine;  // set iff role == kEngine
};

enum class ConnState : std::uint8_t { kDisconnected, kAwaitingWelcome, kConnected };

// Limits of one handle (while connected, the daemon's, from its Welcome,
// where they are smaller).
inline constexpr std::size_t kMaxSessions = std::size_t{1} << 20;
inline constexpr std::size_t kMaxToolsPerSession = 1024;
// Session and client names: the daemon's rule (base::name_problem).
inline constexpr std::size_t kMaxNameLength = base::kMaxNameBytes;
// Directives kept for the caller between polls (all already applied).
inline constexpr std::size_t kMaxQueuedDirectives = std::size_t{1} << 16;
// Socket messages waiting for room in the socket buffer; more means the
// daemon stopped reading, which counts as a lost connection.
inline constexpr std::size_t kMaxOutbox = kMaxSessions / 64;
inline constexpr base::Duration kWelcomeTimeout = std::chrono::seconds(1);
// How long tandem_tool_spawn waits for tandemd's ToolPlacement before it
// starts the tool without a cgroup.
inline constexpr base::Duration kPlacementTimeout = std::chrono::seconds(1);
inline constexpr std::size_t kMaxToolArgs = 65536;
// Tool calls the library numbers itself (tandem_tool_spawn) start here, away
// from the small numbers runners pick for tandem_tool_begin.
inline constexpr std::uint32_t kFirstSpawnCall = 0x80000000u;

// What tandem_tool_spawn starts (api.cc checks it): the process as
// cpu::spawn takes it (tandemd's bubblewrap settings are added later), and
// the limits tandemd is asked for.
struct ToolSpec {
  cpu::SpawnSpec process;
  ipc::ToolLimitsInfo limits;
  bool allow_unplaced = false;  // TANDEM_TOOL_ALLOW_UNPLACED
};
// Thread-safety: one thread at a time.
class Client {
 public:
  // Builds the handle; does not connect (call start()).
  static base::Result<std::unique_ptr<Client>> create(Config config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The first connection attempt (tandem_*_open).
  void start();
  // Flushes what is queued for the daemon and closes the connection.
  void shutdown();

  Role role() const { return config_.role; }
  bool connected() const { return state_ == ConnState::kConnected; }
  ConnState state() const { return state_; }
  std::uint32_t client_id() const { return client_id_; }
  tandem_client_stats stats() const;

  const std::string& last_error() const { return last_error_; }
  // Records `message` as the last error and returns -code.
  int fail(int code, std::string message);

  // ---- either role ----
  int session_name(std::uint64_t session, std::string_view name);
  int poll(int timeout_ms, int max, tandem_directive* out);
  int runnable(std::uint64_t session);
  int priority(std::uint64_t session);

  // ---- runner ----
  int session_open(std::string_view name, std::uint8_t priority_class, std::uint32_t expected_rounds,
                   std::uint64_t& ret_session);
  int session_close(std::uint64_t session, std::uint8_t reason);
  int tool_begin(std::uint64_t session, std::string_view tool, std::uint32_t call, std::int32_t pid);
  int tool_end(std::uint64_t session, std::string_view tool, std::uint32_t call, std::int32_t exit_code,
               const tandem_tool_usage* usage);
  // tandem_tool_spawn / _wait / _kill (libclient/tools.cc).
  int tool_spawn(std::uint64_t session, std::string_view tool, const ToolSpec& spec, std::int32_t& ret_pid);
  int tool_wait(std::int32_t pid, int timeout_ms, tandem_tool_result& out);
  int tool_kill(std::int32_t pid);
  int tool_info(std::int32_t pid, tandem_tool_info& out) const;
  std::size_t live_tools() const { return procs_.size(); }

  // ---- engine ----
  int round_submit(std::uint64_t session, const tandem_round& round);
  int round_first_token(std::uint64_t session, std::uint32_t round, std::uint64_t queue_delay_ns,
                        std::uint64_t prefill_ns);
  int round_end(std::uint64_t session, std::uint32_t round, std::uint32_t output_tokens, std::uint32_t blocks_held,
                bool tool_follows);
  int kv_stats(const tandem_kv_stats& stats);
  int kv_event(std::uint64_t session, int kind, std::uint32_t blocks, std::uint32_t round);
  // REQUIRES: `blocks` checked by tandem_kv_blocks_report.
  int kv_blocks(std::uint64_t session, const tandem_kv_blocks& blocks);
  Coordinator& coordinator() { return coordinator_; }
  const Coordinator& coordinator() const { return coordinator_; }

  // ---- engine GPU plane (libclient/gpu_api.cc checks the arguments) ----
  // Each is remembered and sent now and again after every (re)connect and
  // ResyncRequest, so a restarted daemon learns the engine's pool, profiles
  // and modules. Fail-open: while not connected only the memory changes.
  // The engine's green-context pool (tandem_gpu_open); replaces the last one.
  // Gives it a pool id of its own (never 0, never reused by this client) and
  // returns it.
  std::uint32_t set_gpu_partitions(ipc::GpuPartitions partitions);
  // The pool closed: stop resending it (the daemon is not told; its index
  // for this engine is simply no longer followed).
  void clear_gpu_partitions() { gpu_partitions_.reset(); }
  bool has_gpu_partitions() const { return gpu_partitions_.has_value(); }
  // One stage's whole profile (rows in order, row/row_count filled in here).
  void set_gpu_profile(ipc::GpuStage stage, std::vector<ipc::StageProfileRow> rows);
  void set_weight_module(const ipc::WeightModule& module);
  // The status page's current contents; nullopt while not connected (or
  // when a read raced the daemon's writer too long).
  std::optional<ipc::EngineStatus> engine_status();

 private:
  struct ToolCall {
    std::uint32_t call = 0;
    std::uint64_t kind = 0;
    std::int64_t started_ns = 0;
  };

  // Everything the handle knows about one session.
  struct Session {
    std::string name;  // empty: never named
    // engine
    bool submitted = false;     // this handle submitted a round of it
    bool in_flight = false;     // a round is submitted and has not ended
    bool admitted = false;      // the daemon let it run (ADMIT, RESTORE here)
    bool paused = false;        // the last word from the daemon was PAUSE (or RESTORE elsewhere)
    bool has_slot = false;      // holds a fail-open slot
    bool tool_follows = false;  // its last round ended with a tool call
    std::uint8_t priority = 0;  // MLFQ level
    sched::Residency residency = sched::Residency::kNone;
    std::uint32_t round = 0;
    std::uint32_t blocks_held = 0;
    std::uint64_t submit_seq = 0;
    // runner
    bool open = false;
    std::vector<ToolCall> tools;  // running tool calls, oldest first
    // The daemon refused it (Error naming it): the errno, else 0. Runner
    // calls on it return -refused; an engine runs it fail-open.
    int refused = 0;
    bool closed = false;  // CLOSE came while a round was in flight: forget it at the round's end
  };

  // A process started by tool_spawn, until tool_wait reaps it.
  struct ToolProc {
    std::uint64_t session = 0;
    std::uint32_t call = 0;
    std::string tool;
    base::UniqueFd pidfd;
    cpu::ReceivedDirs dirs;  // its cgroup directories (ToolPlacement's fds, decoded); empty: unplaced
    std::uint64_t cgroup_id = 0;
    std::int64_t started_ns = 0;
    std::uint32_t flags = 0;  // tandem_tool_flags
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    bool daemon_lost = false;  // the connection was lost while it ran
  };
  // A ToolPlacement that arrived.
  struct Placement {
    ipc::ToolPlacementInfo info;
    std::vector<base::UniqueFd> fds;
  };
  // The placement asked for a session's next tool call as soon as one starts
  // (ToolPrepare.ahead), with that call's limits; its answer, once here,
  // waits in placements_ under `request`.
  struct Ahead {
    std::uint32_t request = 0;
    std::uint32_t call = 0;
    ipc::ToolLimitsInfo limits;
  };
  // What ToolKilled said about a call.
  struct Kill {
    std::uint8_t reason = 0;
    std::string message;
  };

  explicit Client(Config config, Coordinator coordinator);
  // Sends ToolPrepare and waits for its answer (nullopt: none in time, or not connected).
  std::optional<Placement> request_placement(std::uint64_t session, std::uint32_t call, std::uint64_t kind,
                                             const ipc::ToolLimitsInfo& limits, std::string& why, int& why_code);
  // Sends ToolPrepare; returns its request id (0: not connected, or lost).
  std::uint32_t ask_placement(std::uint64_t session, std::uint32_t call, std::uint64_t kind,
                              const ipc::ToolLimitsInfo& limits, bool ahead, std::string& why, int& why_code);
  // Waits for the answer to `request` (nullopt: none in time, or the connection was lost).
  std::optional<Placement> await_placement(std::uint32_t request, std::string& why, int& why_code);
  // The session's placement ahead if it was asked with `limits` (it is then
  // the caller's); one asked with other limits stays for a later call.
  std::optional<Ahead> take_ahead(std::uint64_t session, const ipc::ToolLimitsInfo& limits);
  // Forgets the session's placement ahead and closes its fds (its cgroup goes
  // with the session, or with the connection's sessions on a daemon restart).
  void drop_ahead(std::uint64_t session);
  // Next tool-call number of tool_spawn.
  std::uint32_t new_call();
  // Kills and reaps every tool of `session` (0: all), without records.
  void reap_tools(std::uint64_t session);

  // ---- connection ----
  // Advances the state machine; `read_socket` also drains the socket when
  // connected (poll(), socket sends).
  void drive(bool read_socket);
  void try_connect(base::Time now);
  // Reads every queued socket message; false if the connection was lost.
  bool pump_socket();
  bool handle_message(ipc::ReceivedMessage& received);
  bool on_welcome(const wire::Welcome& welcome, std::vector<base::UniqueFd>& fds);
  // An Error from the daemon after the Welcome: one request refused.
  void on_daemon_error(const wire::Error& error);
  // Whether the process at the other end of `fd` may be tandemd (root, or
  // our own user); `why` says who it is if not.
  static bool trusted_daemon(int fd, std::string& why);
  void on_policy_config(const wire::PolicyConfig& config);
  // Drops the connection and schedules the next attempt.
  void lose(std::string reason);
  // Releases the socket, the segment and the ring endpoints (no backoff).
  void drop_connection();
  // Sends what fits of outbox_; false if the connection was lost.
  bool flush_outbox();
  void queue_message(std::vector<std::uint8_t> message);
  // Queues a Resync snapshot of every live session and their names.
  void queue_resync();
  std::optional<ipc::SessionSnapshotInfo> snapshot(std::uint64_t id, const Session& s) const;
  // Sends the GPU plane's remembered records (part of every resync).
  void send_gpu_records();

  // ---- rings ----
  template <class T>
  void send_record(const T& record, std::uint64_t session);
  // Moves directives from the ring into ready_, applying each.
  void drain_directives();
  void apply(const ipc::Record& record);
  // Blocks in poll(2) until a directive, a socket message, the next
  // reconnect attempt or `deadline`.
  void wait(base::Time deadline);

  // ---- sessions ----
  // The entry for `id`, created if absent; nullptr at kMaxSessions.
  Session* entry(std::uint64_t id);
  Session* find(std::uint64_t id);
  void set_admitted(std::uint64_t id, Session& s, bool admitted);
  void release_slot(std::uint64_t id, Session& s);
  void grant_slots();
  // Erases an engine session that holds nothing any more.
  void maybe_forget(std::uint64_t id);

  Config config_;
  std::uint64_t instance_ = 0;  // Hello.instance: this handle, across reconnects
  // The daemon's limits from its Welcome (0: not told).
  std::uint32_t daemon_sessions_ = 0;
  std::uint32_t daemon_tools_ = 0;
  bool daemon_ahead_ = false;  // Welcome.tool_ahead: placements may be asked ahead
  std::string daemon_error_;   // the last per-request Error's text
  Coordinator coordinator_;
  base::MonotonicClock clock_;
  std::string last_error_;
  std::string connection_error_;  // why the last connection ended (for tests and logs)

  ConnState state_ = ConnState::kDisconnected;
  base::UniqueFd sock_;
  base::Time next_attempt_{};
  base::Duration backoff_{};
  base::Time hello_at_{};
  std::uint32_t client_id_ = 0;
  std::unique_ptr<ipc::Channel> channel_;  // stable address: the endpoints point into it
  std::optional<ipc::EventSender> sender_;
  std::optional<ipc::RingConsumer> directives_;
  std::optional<ipc::StatusReader<ipc::EngineStatus>> status_;  // engine_status()
  ipc::Doorbell directive_bell_;
  ipc::RecordDecoder decoder_{ipc::Direction::kToClient};
  std::deque<std::vector<std::uint8_t>> outbox_;
  std::deque<tandem_directive> ready_;

  std::unordered_map<std::uint64_t, Session> sessions_;
  // Submitted rounds that wait: in flight, neither admitted nor holding a
  // slot; ordered by submit, so fail-open slots go out in that order.
  std::set<std::pair<std::uint64_t, std::uint64_t>> waiting_;
  std::uint32_t slots_used_ = 0;
  std::uint64_t submit_seq_ = 0;

  tandem_client_stats stats_{};

  // engine GPU plane, resent on every resync
  std::optional<ipc::GpuPartitions> gpu_partitions_;
  std::uint32_t last_pool_id_ = 0;
  std::map<ipc::GpuStage, std::vector<ipc::StageProfileRow>> gpu_profiles_;
  std::map<std::uint8_t, ipc::WeightModule> weight_modules_;  // by index

  // tools (libclient/tools.cc)
  std::unordered_map<std::int32_t, ToolProc> procs_;  // by pid
  std::map<std::uint32_t, Placement> placements_;     // by request
  std::unordered_map<std::uint64_t, Ahead> aheads_;   // by session: at most one each
  std::map<std::pair<std::uint64_t, std::uint32_t>, Kill> kills_;
  std::uint32_t next_request_ = 1;
  std::uint32_t next_call_ = kFirstSpawnCall;
};

}  // namespace tandem::client

// The opaque handle of the C ABI (api.cc, gpu_api.cc).
struct tandem_client {  // NOLINT(readability-identifier-naming): the C ABI's name
  std::unique_ptr<tandem::client::Client> impl;
};
