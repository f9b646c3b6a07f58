// KindTable: what a scheduler learns per tool kind, with a bound on the
// number of kinds.
//
// A kind is a hash of a name a client chose (an agent runner's tool name in
// tandemd, a request's `tool` field in an engine), so without a bound a
// client naming ever new tools would grow the table without end. Each kind
// has an owner, the principal that reported it (tandemd: the runner's uid,
// whose kinds are its own, daemon/events.h; elsewhere 0). At the bound, a
// new kind first makes the quarter of the kinds of the owner holding the
// most, those not used for longest, forget what was learnt of them, at once:
// a stream of new kinds costs one pass over the table per quarter, not per
// kind, and an owner naming ever new tools forgets its own kinds, not those
// of owners holding fewer. A forgotten kind is answered as one never seen
// until it is used again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "sched/types.h"

namespace tandem::sched {

// The bound every scheduler's table of tool kinds uses by default: a node
// runs tens of tool kinds.
inline constexpr std::size_t kMaxToolKinds = 1024;

// Thread-safety: one thread.
template <class V>
class KindTable {
 public:
  explicit KindTable(std::size_t max_kinds) : max_kinds_(std::max<std::size_t>(1, max_kinds)) {}

  // The state of `kind`, made (value-initialised, owned by `owner`) if
  // absent, marked as used now. May forget other kinds (above); references
  // to them are invalidated.
  V& use(ToolKind kind, std::uint32_t owner = 0) {
    auto it = map_.find(kind);
    if (it == map_.end()) {
      if (map_.size() >= max_kinds_) forget_oldest_quarter_of_largest_owner();
      it = map_.try_emplace(kind).first;
      it->second.owner = owner;
      ++owned_[owner];
    }
    it->second.last_used = ++uses_;
    return it->second.value;
  }
  // nullptr: `kind` was never used, or has been forgotten.
  const V* find(ToolKind kind) const {
    auto it = map_.find(kind);
    return it == map_.end() ? nullptr : &it->second.value;
  }
  std::size_t size() const { return map_.size(); }
  // Kinds `owner` holds.
  std::size_t owned_by(std::uint32_t owner) const {
    auto it = owned_.find(owner);
    return it == owned_.end() ? 0 : it->second;
  }

 private:
  struct Entry {
    V value{};
    std::uint64_t last_used = 0;
    std::uint32_t owner = 0;
  };
  void forget_oldest_quarter_of_largest_owner() {
    // The owner holding the most; of equals, the smallest id (deterministic).
    std::uint32_t owner = 0;
    std::size_t held = 0;
    for (const auto& [o, n] : owned_) {
      if (n > held || (n == held && o < owner)) {
        owner = o;
        held = n;
      }
    }
    std::vector<std::uint64_t> last;
    last.reserve(held);
    for (const auto& [k, e] : map_) {
      if (e.owner == owner) last.push_back(e.last_used);
    }
    const std::size_t drop = std::max<std::size_t>(1, last.size() / 4);
    std::nth_element(last.begin(), last.begin() + static_cast<std::ptrdiff_t>(drop - 1), last.end());
    const std::uint64_t cutoff = last[drop - 1];  // use stamps are unique
    std::erase_if(map_, [&](const auto& e) { return e.second.owner == owner && e.second.last_used <= cutoff; });
    if ((owned_[owner] -= drop) == 0) owned_.erase(owner);
  }

  std::size_t max_kinds_;
  std::unordered_map<ToolKind, Entry> map_;
  std::unordered_map<std::uint32_t, std::size_t> owned_;  // owner → kinds it holds (never 0)
  std::uint64_t uses_ = 0;
};

}  // namespace tandem::sched
