// IdMap: a hash map from 64-bit ids (sessions, tool calls) to small values,
// in one flat array.
//
// Why not std::unordered_map: tandemd looks sessions up several times per
// record, and a node-based map costs a division (the prime bucket count), a
// pointer chase to the node and an allocation per insert; in daemon_bench's
// profile those were a tenth of the daemon's CPU. Here a lookup is a
// multiply, a shift and (almost always) one cache line.
//
// Open addressing with linear probing and backward-shift deletion (no
// tombstones, so a long churn of inserts and erases does not slow lookups).
// The table grows at 1/2 full. Keys are mixed with a per-map random seed
// before they pick a slot: ids come from clients, and a client that chose
// ids to collide would otherwise make every probe walk its chain.
//
// Values are moved when the table grows or an entry is erased: hold no
// pointer or reference into the map across an insert or an erase.
// for_each visits the entries in slot order, which depends on the seed:
// nothing that needs a deterministic order can depend on it.
//
// Thread-safety: none; one thread, like the containers it replaces.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace tandem::base {

template <class V>
class IdMap {
 public:
  IdMap() : seed_(fresh_seed()) {}

  // The value for `key`, or nullptr.
  V* find(std::uint64_t key) {
    if (size_ == 0) return nullptr;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  const V* find(std::uint64_t key) const { return const_cast<IdMap*>(this)->find(key); }
  bool contains(std::uint64_t key) const { return find(key) != nullptr; }

  // The value for `key`, default-constructed if it was missing.
  V& operator[](std::uint64_t key) {
    if (V* v = find(key)) return *v;
    if ((size_ + 1) * 2 > slots_.size()) grow();
    std::size_t i = home(key);
    while (slots_[i].used) i = (i + 1) & mask_;
    slots_[i].used = true;
    slots_[i].key = key;
    slots_[i].value = V{};
    ++size_;
    return slots_[i].value;
  }

  // Removes `key`; false if it was not there.
  bool erase(std::uint64_t key) {
    if (size_ == 0) return false;
    std::size_t hole = home(key);
    for (;; hole = (hole + 1) & mask_) {
      if (!slots_[hole].used) return false;
      if (slots_[hole].key == key) break;
    }
    // Backward shift: pull each later entry of the run into the hole when
    // its home slot does not lie between the hole and where it sits.
    for (std::size_t j = (hole + 1) & mask_; slots_[j].used; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      if (((j - h) & mask_) >= ((j - hole) & mask_)) {
        slots_[hole].key = slots_[j].key;
        slots_[hole].value = std::move(slots_[j].value);
        hole = j;
      }
    }
    slots_[hole].used = false;
    slots_[hole].value = V{};
    --size_;
    return true;
  }

  // Room for `n` entries without growing (one allocation now instead of a
  // doubling series later, for a map whose bound is known): the table
  // grows when an insert would fill more than half of it.
  void reserve(std::size_t n) {
    while (n * 2 > slots_.size()) grow();
  }

  // Calls f(key, value) for every entry, in no defined order. f must not
  // insert into or erase from the map.
  template <class F>
  void for_each(F&& f) {
    for (Slot& s : slots_) {
      if (s.used) f(s.key, s.value);
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.used) f(s.key, s.value);
    }
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Slots in the table (entries it holds before it grows: half of them).
  std::size_t capacity() const { return slots_.size(); }
  void clear() {
    slots_.clear();
    size_ = 0;
    mask_ = 0;
    shift_ = 64;
  }

 private:
  struct Slot {
    std::uint64_t key = 0;
    V value{};
    bool used = false;
  };

  // Random where the system gives randomness; else the clock (random_device
  // may throw where no entropy source is reachable).
  static std::uint64_t fresh_seed() {
    try {
      std::random_device rd;
      return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    } catch (...) {
      return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) *
             0x9E3779B97F4A7C15ULL;
    }
  }
  // splitmix64's finalizer over key ^ seed; the top bits pick the slot.
  std::size_t home(std::uint64_t key) const {
    std::uint64_t z = key ^ seed_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<std::size_t>(z >> shift_);
  }
  void grow() {
    const std::size_t capacity = slots_.empty() ? 16 : slots_.size() * 2;
    std::vector<Slot> old = std::exchange(slots_, std::vector<Slot>(capacity));
    mask_ = capacity - 1;
    shift_ = 64 - std::countr_zero(capacity);
    for (Slot& s : old) {
      if (!s.used) continue;
      std::size_t i = home(s.key);
      while (slots_[i].used) i = (i + 1) & mask_;
      slots_[i].used = true;
      slots_[i].key = s.key;
      slots_[i].value = std::move(s.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::uint64_t seed_;
};

// IdSet: a set of 64-bit ids over IdMap (the same hashing, no iteration
// order).
//
// Thread-safety: none; one thread.
class IdSet {
 public:
  // False if `id` was there already.
  bool insert(std::uint64_t id) {
    const std::size_t before = map_.size();
    map_[id] = 1;  // one probe: operator[] finds it or adds it
    return map_.size() != before;
  }
  bool erase(std::uint64_t id) { return map_.erase(id); }
  bool contains(std::uint64_t id) const { return map_.contains(id); }
  std::size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  // Calls f(id) for every member, in no defined order; f must not change
  // the set.
  template <class F>
  void for_each(F&& f) const {
    map_.for_each([&](std::uint64_t id, const std::uint8_t&) { f(id); });
  }
  // The members, in ascending order (a copy, to change the set while
  // walking it).
  std::vector<std::uint64_t> ids() const {
    std::vector<std::uint64_t> out;
    out.reserve(map_.size());
    for_each([&](std::uint64_t id) { out.push_back(id); });
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  IdMap<std::uint8_t> map_;
};

}  // namespace tandem::base
