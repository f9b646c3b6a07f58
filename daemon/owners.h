// Who owns a runner's sessions, and what survives a daemon restart of it
// (issue 18: "ownership follows credentials").
//
// A session a runner opens belongs to the runner *handle* that opened it,
// named by an OwnerKey: the peer's SO_PEERCRED uid and pid, the process's
// start time (so a recycled pid is another owner) and the handle's instance
// (Hello.instance, a random number libtandem keeps across reconnects). The
// kernel vouches for uid and pid; nothing a client says can make it another
// owner. While its connection is down (the daemon restarted, the socket
// broke) the handle's sessions are held for it, and only a connection with
// the same key gets them back; they end when its process does.
//
// The OwnerJournal keeps that across a restart: an append-only file in the
// runtime directory with one 48-byte record per change — "session S is owned
// by key K", "session S was closed (why)" — each with its own checksum, so a
// torn or scribbled record is skipped, never misread. A restarted tandemd
// reads it back (load()): sessions whose owner process still lives are
// recreated for that owner alone, the others are closed; closed sessions
// become tombstones, so an engine's stale snapshot cannot bring one back.
// The file is rewritten, compacted, when it holds four times what is live.
//
// parse_journal() is pure (tested and fuzzed on bytes); the I/O is in the
// class, on a file opened beneath the runtime dir's fd with O_NOFOLLOW.
//
// Thread-safety: the daemon loop's thread only.
#pragma once

#include <sys/types.h>

#include <array>
#include <compare>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/id_map.h"
#include "base/result.h"
#include "base/unique_fd.h"

namespace tandem::daemon {

struct OwnerKey {
  std::uint32_t uid = 0;
  std::int32_t pid = 0;
  std::uint64_t start = 0;     // the process's start time (/proc/<pid>/stat field 22, clock ticks since boot)
  std::uint64_t instance = 0;  // Hello.instance

  friend auto operator<=>(const OwnerKey&, const OwnerKey&) = default;
};

// Why a session ended, as a tombstone remembers it.
enum class Closed : std::uint8_t {
  kByOwner = 1,    // its runner closed it (SESSION_CLOSE, or a resync that left it out)
  kKilled = 2,     // an operator (tandemctl session kill)
  kOwnerGone = 3,  // its runner's process exited
};

// What a journal holds: the sessions owned now, and the recent closes (the
// newest last).
struct JournalState {
  std::unordered_map<std::uint64_t, OwnerKey> owned;
  std::vector<std::pair<std::uint64_t, Closed>> closed;
  std::size_t records = 0;  // valid records read
  std::size_t skipped = 0;  // records with a bad magic, operation or checksum
};

inline constexpr std::size_t kJournalRecordBytes = 48;
// Tombstones the journal keeps (the newest).
inline constexpr std::size_t kJournalTombstones = 4096;

// Replays journal bytes. Pure; never fails: what it cannot read is skipped.
JournalState parse_journal(std::span<const std::uint8_t> bytes);
// One record's bytes ("owned": closed_reason 0).
std::array<std::uint8_t, kJournalRecordBytes> journal_record(std::uint64_t session, const OwnerKey& key,
                                                             std::uint8_t closed_reason);

// The start time of process `pid` (field 22 of <proc_root>/<pid>/stat);
// ENOENT when there is none.
base::Result<std::uint64_t> process_start_time(std::string_view proc_root, pid_t pid);
// Pure: field 22 of a /proc/<pid>/stat text (the comm may hold spaces and
// parentheses: fields are counted after its last ')').
base::Result<std::uint64_t> parse_start_time(std::string_view stat);
// Pure: field 4 (the parent's pid) of a /proc/<pid>/stat text.
base::Result<pid_t> parse_parent_pid(std::string_view stat);

// Thread-safety: one thread.
class OwnerJournal {
 public:
  OwnerJournal() = default;
  // Opens <dirfd>/<name> (created 0600 if missing; a symlink or anything
  // but a regular file owned by us is refused) and reads it.
  static base::Result<OwnerJournal> open(int dirfd, std::string name = "owners");

  // What the file held when it was opened.
  const JournalState& loaded() const { return loaded_; }
  // Records the owner of `session` / that it ended, in memory; flush()
  // writes what was recorded since the last flush in one write. The server
  // flushes once per loop iteration (and when it stops), so a burst of
  // sessions costs one system call, not one each. A failed write is
  // reported once (the journal then stops; ownership still holds in memory
  // until the next restart).
  void owned(std::uint64_t session, const OwnerKey& key);
  void closed(std::uint64_t session, Closed why);
  void flush();
  bool ok() const { return fd_.get() >= 0 && !failed_; }
  std::size_t records() const { return records_; }

 private:
  void append(std::uint64_t session, const OwnerKey& key, std::uint8_t closed_reason);
  // Rewrites the file with what is live (renameat over the old one); false
  // (logged) when it could not, and the old file stays.
  bool compact();

  int dirfd_ = -1;  // borrowed: the runtime dir's, held by the server
  std::string name_;
  base::UniqueFd fd_;
  bool failed_ = false;
  JournalState loaded_;
  base::IdMap<OwnerKey> live_;
  std::deque<std::pair<std::uint64_t, Closed>> tombstones_;
  std::size_t records_ = 0;            // in the file now, and pending
  std::vector<std::uint8_t> pending_;  // recorded, not yet written
};

// A runner handle that owns sessions: its key, the connection it is
// attached to (0: detached, its sessions held for it), and a pidfd of its
// process, whose exit ends them.
struct Owner {
  std::uint32_t id = 0;
  OwnerKey key;
  base::UniqueFd pidfd;
  bool pidfd_armed = false;  // a poll on pidfd is outstanding (the Server arms it)
  std::uint32_t client = 0;
  base::IdSet sessions;  // charged against sessions_per_client
};

// The runner handles that own sessions, by id (ids never reused) and by key.
// A registry only: it opens no pidfd and ends no session (the Server does).
//
// Thread-safety: one thread.
class Owners {
 public:
  using Map = std::map<std::uint32_t, Owner>;
  Owner* find(std::uint32_t id);
  const Owner* find(std::uint32_t id) const;
  Owner* find(const OwnerKey& key);
  // A new handle for `key`, which has none, with a fresh id.
  Owner& add(const OwnerKey& key);
  // Forgets handle `id` (both indexes); nothing if unknown.
  void erase(std::uint32_t id);
  // Detached handles of uid `uid` but those of process `pid` (the one
  // connecting): they count against its clients_per_uid.
  std::size_t held(uid_t uid, pid_t pid) const;
  std::size_t detached() const;
  std::size_t size() const { return by_id_.size(); }
  Map::iterator begin() { return by_id_.begin(); }
  Map::iterator end() { return by_id_.end(); }
  Map::const_iterator begin() const { return by_id_.begin(); }
  Map::const_iterator end() const { return by_id_.end(); }

 private:
  Map by_id_;
  std::map<OwnerKey, std::uint32_t> by_key_;
  std::uint32_t next_ = 1;
};

// Sessions that ended remembered as tombstones.
inline constexpr std::size_t kTombstones = 16384;

// What tandemd remembers of sessions beyond what the policy's table holds:
// which ones ended and why (tombstones, the newest kTombstones: an engine's
// snapshot cannot bring one back, nor a runner's one an operator's kill),
// and, through the OwnerJournal, who owns each live one, so that a
// restarted tandemd holds it for its runner. Pure bookkeeping: it kills,
// tells and closes nothing (the Server does); its only I/O is the journal.
//
// Thread-safety: one thread.
class SessionLedger {
 public:
  // No journal: tombstones only (tests). The tombstone table is sized for
  // its bound at once (32,768 slots of 24 bytes: 768 KiB), so it never
  // grows (rehashing every entry at once) while sessions churn.
  SessionLedger() { closed_.reserve(kTombstones); }
  // The journal in the runtime dir `dirfd`, read back: what it says ended
  // becomes tombstones; loaded() keeps what it says is owned.
  static base::Result<SessionLedger> open(int dirfd);

  const JournalState& loaded() const { return journal_.loaded(); }
  // Session `id` is owned by the handle `key` (journal).
  void owned(std::uint64_t id, const OwnerKey& key) { journal_.owned(id, key); }
  // Session `id` ended, `why`: a tombstone, and the journal's record.
  void ended(std::uint64_t id, Closed why);
  // Session `id` ended without a tombstone (it finished, or its engine's
  // last word closed it): the journal stops holding it for its runner,
  // unless a tombstone already said why it ended.
  void released(std::uint64_t id);
  // Session `id` is live again (opened anew): its tombstone goes.
  void revive(std::uint64_t id) { closed_.erase(id); }
  std::optional<Closed> tombstone(std::uint64_t id) const;
  std::size_t tombstones() const { return closed_.size(); }
  // Writes what the journal recorded since the last flush (one write).
  void flush() { journal_.flush(); }

 private:
  void remember(std::uint64_t id, Closed why);  // the tombstone alone

  // Why and when, in one word: the sequence number above the reason's
  // byte (a 24-byte slot; a pair took 32).
  static std::uint64_t stamp(Closed why, std::uint64_t seq) { return seq << 8 | static_cast<std::uint8_t>(why); }
  base::IdMap<std::uint64_t> closed_;                          // stamp(why, sequence)
  std::deque<std::pair<std::uint64_t, std::uint64_t>> order_;  // id, sequence: oldest first
  std::uint64_t seq_ = 0;
  OwnerJournal journal_;
};

}  // namespace tandem::daemon
