// Clients: tandemd's client registry and the limits it judges by itself.
//
// The registry holds every connection by id, in id order (the pump's
// round-robin order), from accept until the Server's sweep removes it.
// Ids are never reused, so a late completion for a connection that is gone
// finds nothing. A connection marked for removal (doomed) stays listed until
// then, but find() no longer returns it.
//
// The limits judged here need nothing but the registry and the config's
// [limits]: how many connections may be open (max_clients, the slots
// reserved for engines and runners, clients_per_uid), how many ctl clients,
// and how many per-request Errors a client is sent a second. The Server
// (daemon/server.h) does the I/O, the handshake (handshake.cc) and the
// sessions clients hold.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/config.h"
#include "daemon/gpu_plane.h"
#include "daemon/kv_events.h"
#include "ipc/channel.h"
#include "ipc/records.h"
#include "sched/types.h"

namespace tandem::daemon {

// Allows `rate` events per second with bursts of one second's worth.
// Thread-safety: a value type.
class TokenBucket {
 public:
  TokenBucket() = default;
  TokenBucket(double rate, base::Time now) : rate_(rate), tokens_(rate), last_(now) {}
  // Tokens available now (whole ones), after refilling.
  std::uint64_t available(base::Time now);
  void take(std::uint64_t n) { tokens_ -= static_cast<double>(n); }

 private:
  double rate_ = 0.0;
  double tokens_ = 0.0;
  base::Time last_{};
};

// Where a connection is: waiting for its Hello, or past it.
enum class Phase : std::uint8_t { kHello, kActive };

// One connection: who the peer is and its socket and pidfd, then one group
// per concern (rings, io_uring arms, removal, rate budgets, engine state,
// resync, counters, once-only warnings). Thread-safety: the loop thread only.
struct Client {
  std::uint32_t id = 0;
  Phase phase = Phase::kHello;
  Role role = Role::kCtlRead;
  std::string name;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  base::UniqueFd sock;
  base::UniqueFd pidfd;
  base::Time connected_at{};
  std::uint64_t instance = 0;  // Hello.instance
  std::uint32_t owner = 0;     // runners: its Owner (SessionDirectory::owners()), which holds its sessions
  base::Time last_request{};   // ctl: when it last sent something (ctl_idle_timeout_s)
  std::unordered_map<sched::SessionId, std::string> pending_names;  // names before their session

  // Engines and runners: the segment's rings, status page and doorbells, and the directives waiting for room.
  struct Rings {
    bool attached = false;  // it has a segment (the rest is empty without one)
    ipc::Channel channel;
    ipc::RingConsumer events;
    ipc::RingProducer directives;
    ipc::StatusWriter<ipc::EngineStatus> status;
    ipc::Doorbell event_bell;
    ipc::Doorbell directive_bell;
    ipc::RecordDecoder decoder{ipc::Direction::kToDaemon};
    std::deque<ipc::Slot> backlog;  // directives that did not fit in the ring
    bool pending = false;           // the pump should look at its ring
    bool bell_due = false;          // directives pushed since its doorbell was last rung
  } rings;

  // The io_uring operations outstanding for it.
  struct Armed {
    std::uint64_t bell_buf = 0;  // target of the doorbell read
    bool bell = false;           // a doorbell read
    bool sock = false;           // a POLLIN on the socket
    bool pidfd = false;          // a POLLIN on the pidfd
  } armed;

  // The end of the connection: marked by Server::doom, removed by the sweep.
  struct Doom {
    bool marked = false;        // to be removed by sweep()
    bool misbehaved = false;    // removed for breaking the protocol or the limits
    bool process_gone = false;  // its pidfd fired: the process exited
    std::string reason;
  } doom;
  bool doomed() const { return doom.marked; }

  // What it may send: records and messages a second, and per-request Errors
  // in this second (at most kErrorsPerSecond).
  struct Budgets {
    TokenBucket records;
    TokenBucket messages;
    struct Errors {
      std::uint32_t sent = 0;
      base::Time since{};
    } errors;
  } budgets;

  // Engines only: their parameters, what the GPU plane chose for them
  // (published on the status page), and their KV_BLOCKS events not yet
  // published with the sequence number of their next batch ([kv_events],
  // daemon/kv_events.h).
  struct EngineSide {
    sched::EngineParams params;
    std::int32_t gpu_index = -1;
    std::uint32_t saturating_tokens = 0;
    GpuChoice gpu;
    KvEventBatch kv_batch;
    std::uint64_t kv_seq = 0;
  } engine;

  // A Resync sequence being received (messages with `more`, then the last).
  struct Resync {
    bool open = false;
    std::uint64_t position = 0;
    std::unordered_set<sched::SessionId> listed;
    std::uint32_t refused = 0;
    std::string problem;  // the first refusal's reason
  } resync;

  // Counters: records accepted, rejected (in all, and in this pump round)
  // and late (about an ended session: ignored), and event-ring slots taken
  // (Resync.ring_position's counterpart).
  struct Counts {
    std::uint64_t accepted = 0;
    std::uint64_t rejected = 0;
    std::uint64_t late = 0;
    std::uint64_t rejected_this_round = 0;
    std::uint64_t records_taken = 0;
  } counts;

  // Warnings logged once per client.
  struct Warned {
    bool record = false;    // its first bad record
    bool limit = false;     // hitting its session limit
    bool throttle = false;  // hitting its message rate
    bool backlog = false;   // dropping directives
  } warned;
};

// Thread-safety: the loop thread only.
class Clients {
 public:
  using Map = std::map<std::uint32_t, Client>;

  // Every connection in id order, those marked for removal included.
  Map::iterator begin() { return map_.begin(); }
  Map::iterator end() { return map_.end(); }
  Map::const_iterator begin() const { return map_.begin(); }
  Map::const_iterator end() const { return map_.end(); }
  std::size_t size() const { return map_.size(); }
  // Connection `id` unless it is marked for removal (null: none).
  Client* find(std::uint32_t id);
  // Connection `id`, marked for removal or not (null: none).
  const Client* entry(std::uint32_t id) const;
  // A new connection of a peer with credentials `cred`, with the next id.
  Client& add(base::UniqueFd sock, const ucred& cred, base::Time now, const Limits& limits);
  // Removes an entry (the sweep); returns the next.
  Map::iterator erase(Map::iterator it) { return map_.erase(it); }

  // Why a new connection of a peer with credentials `cred` is refused now
  // ("" when it is not): limits.max_clients; the slots reserved for engines
  // and runners, unless `serves` (the peer may be one); the uid's share,
  // limits.clients_per_uid, unless `trusted` (root, tandemd's own user),
  // counting the uid's live connections and `held` (its runner handles held
  // without a connection, but the connecting process's own).
  std::string refusal(const Limits& limits, const ucred& cred, bool serves, bool trusted, std::size_t held) const;
  // Live connections of uid `uid`.
  std::size_t of_uid(uid_t uid) const;
  // Why one more ctl client is refused ("" when it is not): ctl clients
  // never take the slots reserved for engines and runners.
  std::string ctl_refusal(const Limits& limits) const;
  // Whether `c` may be sent one more per-request Error now (at most
  // kErrorsPerSecond a second), counting it if so.
  static bool take_error(Client& c, base::Time now);

 private:
  Map map_;
  std::uint32_t next_ = 1;
};

}  // namespace tandem::daemon
