// The event log `tandemctl events` reads (docs/tandemctl.md): session
// lifecycle, rounds, tools, KV moves, the policy's actions and operators'
// commands, the newest kSize of them.
//
// Logged in the hot path as numbers; the text is made only when `tandemctl
// events` asks (describe()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "sched/types.h"

namespace tandem::daemon {

// Thread-safety: one thread (tandemd's loop).
class EventLog {
 public:
  enum class Kind : std::uint8_t {
    kSessionOpen,      // v: —
    kSessionTakeover,  // a runner's SESSION_OPEN after its engine's first round
    kSessionClose,
    kRoundSubmit,  // v: round, engine, prompt tokens, cached tokens
    kRoundEnd,     // v: round, output tokens, tool follows
    kToolStart,    // v: call
    kToolEnd,      // v: call, exit code, wall ns
    kKv,           // v: sched::KvChange, blocks
    kAdmit,        // v: engine
    kPause,
    kRestore,  // v: engine
    kPin,      // v: ns pinned for
    kUnpin,
    kDrop,
    kOffload,
    kKillTools,
    kDrain,
    kUndrain,
    kEvict,
    kKill,
    kSmPartition,  // session 0; v: engine, partition index, its decode SMs, SM_dec
    kOffloadPlan,  // session 0; v: engine, plan bits, freed bytes, pressure in thousandths
  };
  // One cache line: each event the daemon logs (8,000 a second under
  // daemon_bench's churn) writes one line, the ring's oldest, which has
  // long left the cache. A name, which few entries have, lives in names_.
  struct alignas(64) Entry {
    std::uint64_t seq;
    double t;  // seconds since the log's origin (tandemd's start)
    sched::SessionId session;
    std::array<std::int64_t, 4> v;
    Kind kind;
    std::uint16_t name_slot;  // in names_, or kNoName
  };
  static constexpr std::size_t kSize = 4096;
  static_assert(sizeof(Entry) == 64);

  explicit EventLog(base::Time origin = {}) : origin_(origin) {}

  // Appends an entry (the oldest goes when the log is full). It is written
  // in place over the oldest: no entry or string is built per event, and a
  // name fits its slot's own buffer after the first lap.
  void add(base::Time now, Kind kind, sched::SessionId session, std::array<std::int64_t, 4> v = {},
           std::string_view name = {});
  // The entries held, oldest first: at(0) .. at(size() - 1).
  std::size_t size() const { return ring_.size(); }
  const Entry& at(std::size_t i) const { return ring_[(head_ + i) % ring_.size()]; }
  // The sequence number the next entry gets (entries are numbered from 1).
  std::uint64_t next_seq() const { return next_; }
  // Entries after `since` that fell out of the window before being read.
  std::uint64_t lost_after(std::uint64_t since) const;
  // The session's name an entry kept: only where the name was about to go
  // (a close, a kill); empty otherwise.
  std::string_view name(const Entry& e) const {
    return e.name_slot == kNoName ? std::string_view() : std::string_view(names_[e.name_slot]);
  }

  // An entry's kind as `tandemctl events` names it, and its text.
  static std::pair<std::string_view, std::string> describe(const Entry& e);

 private:
  base::Time origin_;
  // A ring: it grows to kSize, then each entry overwrites the oldest, at
  // head_ (no allocation per entry, as a deque's blocks cost).
  std::vector<Entry> ring_;
  std::size_t head_ = 0;
  std::uint64_t next_ = 1;
  // The names entries kept, a ring of its own written only by named
  // entries. A slot is reused kSize named entries later, when the entry
  // that pointed at it has been overwritten (the entries' ring turns at
  // least as fast).
  static constexpr std::uint16_t kNoName = 0xFFFF;
  static_assert(kSize < kNoName);
  std::vector<std::string> names_;
  std::size_t names_head_ = 0;
};

}  // namespace tandem::daemon
