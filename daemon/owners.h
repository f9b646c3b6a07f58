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

#include <compare>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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
std::vector<std::uint8_t> journal_record(std::uint64_t session, const OwnerKey& key, std::uint8_t closed_reason);

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
  // Records the owner of `session` / that it ended. A failed write is
  // reported once (the journal then stops; ownership still holds in memory
  // until the next restart).
  void owned(std::uint64_t session, const OwnerKey& key);
  void closed(std::uint64_t session, Closed why);
  bool ok() const { return fd_.get() >= 0 && !failed_; }
  std::size_t records() const { return records_; }

 private:
  void append(std::uint64_t session, const OwnerKey& key, std::uint8_t closed_reason);
  // Rewrites the file with what is live (renameat over the old one).
  void compact();

  int dirfd_ = -1;  // borrowed: the runtime dir's, held by the server
  std::string name_;
  base::UniqueFd fd_;
  bool failed_ = false;
  JournalState loaded_;
  std::unordered_map<std::uint64_t, OwnerKey> live_;
  std::deque<std::pair<std::uint64_t, Closed>> tombstones_;
  std::size_t records_ = 0;  // in the file now
};

}  // namespace tandem::daemon
