// SpscRing: a single-producer single-consumer ring of 64-byte slots in shared memory.
//
// Indices are io_uring's ([gpu_and_ipc] B.1): free-running u32 `tail`
// (producer-owned) and `head` (consumer-owned) on separate 128-byte blocks, a
// power-of-two slot count, slot = index & mask.
//
// Readiness travels in the slot itself. The upper 32 bits of a slot's first
// word are the ring's sequence ("turn") for the record in it:
// turn(index) = (index >> log2(capacity)) + 1 — never 0 (a zero-filled slot is
// never ready), and different on every lap. The producer writes the payload
// words, then store-releases word 0 with the turn; the consumer spins on the
// slot it wants next and copies it once word 0 carries the expected turn. Data
// and the "ready" signal thus cross cores in one cache-line transfer, which is
// what keeps a hand-off near the machine's cache-line ping-pong floor (a
// consumer polling `tail` first pays two dependent transfers). `tail` is still
// published after each push or batch, as a hint; no consumer trusts it.
//
// Two ways to consume, for two goals:
//   - try_pop() polls the next slot's turn: lowest latency, for a consumer that
//     busy-polls for one record at a time;
//   - pop_batch() and empty() read the tail hint first: a consumer that has
//     caught up then polls the tail line, which the producer writes once per
//     batch, instead of the slot it is filling (polling that steals the line
//     mid-write and halves streaming throughput). Every slot's turn is still
//     checked before it is read; the hint only sizes the batch.
//
// The consumer publishes `head` (which hands slots back) after every batch, on
// finding the ring empty, and every capacity/4 single pops; the producer reads
// it only when its cached copy says the ring is full.
//
// The ring owns bits 32..63 of slot word 0 (RecordHeader::ring_seq): push
// overwrites them and pop clears them in the copy it returns.
//
// A peer is untrusted. Each side keeps its own index privately and never reads
// it back. A head that implies more than `capacity` records in flight makes
// the producer treat the ring as full; a slot whose turn is neither the one
// expected nor the previous lap's, or a tail hint beyond capacity, is counted
// as corruption. Slots are copied word by word with relaxed atomics: a peer
// scribbling concurrently yields a garbage record (which validation rejects),
// never a data race in our process. No access ever leaves the ring.
//
// No syscall on any path here; waking a sleeping consumer is the Doorbell's job.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/result.h"
#include "ipc/abi.h"

namespace tandem::ipc {

namespace detail {

inline constexpr unsigned kTurnShift = 32;
inline constexpr std::uint64_t kPayloadMask0 = 0xffffffffull;  // record bits of word 0

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// A ring's geometry, as both ends see it. Everything here is private to the
// process: nothing is re-read from shared memory.
struct RingView {
  RingControl* control = nullptr;
  Slot* slots = nullptr;
  std::uint32_t capacity = 0;
  std::uint32_t mask = 0;  // capacity - 1
  unsigned shift = 0;      // log2(capacity)

  Slot& slot(std::uint32_t index) const { return slots[index & mask]; }
  // The turn a slot holds when it carries the record at `index`.
  std::uint32_t turn(std::uint32_t index) const { return (index >> shift) + 1; }
};

// Checks that `region` holds a ring of `slots` slots.
base::Result<RingView> view_ring(std::span<std::byte> region, std::uint32_t slots);

}  // namespace detail

// The producer end. Thread-safety: one producer thread at a time.
class RingProducer {
 public:
  RingProducer() = default;

  // A producer over `region` (a ring region of a segment). Starts at the
  // shared tail, which must be consistent with the shared head.
  static base::Result<RingProducer> attach(std::span<std::byte> region, std::uint32_t slots);

  // Appends one record; false if the ring is full.
  bool try_push(const Slot& record) {
    if (tail_ - cached_head_ >= ring_.capacity && !refresh_head()) return false;
    publish_slot(ring_.slot(tail_), record, ring_.turn(tail_));
    ++tail_;
    publish_tail();
    return true;
  }

  // Appends as many of `records` as fit; returns how many.
  std::size_t push_batch(std::span<const Slot> records) {
    std::uint32_t free_slots = ring_.capacity - (tail_ - cached_head_);
    if (free_slots < records.size()) {
      refresh_head();
      free_slots = ring_.capacity - (tail_ - cached_head_);
    }
    std::size_t n = records.size() < free_slots ? records.size() : free_slots;
    for (std::size_t i = 0; i < n; ++i) {
      publish_slot(ring_.slot(tail_), records[i], ring_.turn(tail_));
      ++tail_;
    }
    if (n > 0) publish_tail();
    return n;
  }

  // Records the consumer has not yet handed back, as of its last published head.
  std::uint32_t in_flight() {
    refresh_head();
    return tail_ - cached_head_;
  }
  std::uint32_t capacity() const { return ring_.capacity; }
  // Times the consumer's head was impossible (ahead of tail, or more than
  // `capacity` behind it).
  std::uint64_t corruption_count() const { return corruptions_; }
  // The doorbell flag of this ring (for Doorbell).
  std::uint32_t* consumer_waiting() const { return &ring_.control->consumer_waiting; }

 private:
  static void publish_slot(Slot& shared, const Slot& value, std::uint32_t turn) {
    for (std::size_t i = 1; i < std::size(value.words); ++i) {
      std::atomic_ref<std::uint64_t>(shared.words[i]).store(value.words[i], std::memory_order_relaxed);
    }
    std::uint64_t word0 = (value.words[0] & detail::kPayloadMask0) | (std::uint64_t{turn} << detail::kTurnShift);
    // SYNC: release orders the payload words above before the turn. Pairs
    // with the consumer's acquire load of word 0 in RingConsumer::take().
    std::atomic_ref<std::uint64_t>(shared.words[0]).store(word0, std::memory_order_release);
  }

  void publish_tail() {
    // SYNC: release, so a reader of the hint that sees tail = t also sees the
    // turns of every slot before t. Pairs with RingConsumer::available().
    std::atomic_ref<std::uint32_t>(ring_.control->tail).store(tail_, std::memory_order_release);
  }

  // Re-reads the consumer's head; returns whether a slot is free.
  bool refresh_head() {
    // SYNC: acquire pairs with the consumer's release store of head, so its
    // copies out of the slots are complete before we overwrite them.
    std::uint32_t head = std::atomic_ref<std::uint32_t>(ring_.control->head).load(std::memory_order_acquire);
    if (tail_ - head > ring_.capacity) {
      // The consumer claims to have taken records we never wrote. Keep our old
      // view of it; the ring looks full until it behaves.
      ++corruptions_;
      return false;
    }
    cached_head_ = head;
    return tail_ - head < ring_.capacity;
  }

  detail::RingView ring_;
  std::uint32_t tail_ = 0;         // private: the truth about what we produced
  std::uint32_t cached_head_ = 0;  // last head we validated
  std::uint64_t corruptions_ = 0;
};

// The consumer end. Thread-safety: one consumer thread at a time.
class RingConsumer {
 public:
  RingConsumer() = default;

  // A consumer over `region`, starting at the shared head.
  static base::Result<RingConsumer> attach(std::span<std::byte> region, std::uint32_t slots);

  // Copies the oldest record out; false if the ring is empty.
  bool try_pop(Slot& out) {
    if (!take(out)) {
      publish_head();  // caught up: hand everything back before spinning or sleeping
      return false;
    }
    ++head_;
    if (head_ - published_head_ >= publish_interval_) publish_head();
    return true;
  }

  // Copies up to out.size() records, then hands their slots back with one
  // head store. Returns how many. The batch is sized from the tail hint, so a
  // consumer that has caught up polls the tail line, not the slot the
  // producer is writing (which would steal that line mid-write); every slot's
  // turn is still checked before it is read.
  std::size_t pop_batch(std::span<Slot> out) {
    std::size_t want = std::min<std::size_t>(out.size(), available());
    std::size_t n = 0;
    while (n < want && take(out[n])) {
      ++head_;
      ++n;
    }
    publish_head();
    return n;
  }

  // Whether no record is ready. Reads the tail hint, and the next slot only
  // when the hint announces something, so a forged tail cannot make a loop on
  // !empty() spin without ever popping. The check to spin or sleep on
  // (Doorbell::wait).
  bool empty() {
    std::uint64_t word0;
    if (available() > 0 && next_ready(word0)) return false;
    publish_head();
    return true;
  }

  // Records the producer has announced through its tail hint (clamped to
  // capacity; an impossible hint counts as corruption).
  std::uint32_t available() {
    // SYNC: acquire pairs with the producer's release store in publish_tail().
    std::uint32_t tail = std::atomic_ref<std::uint32_t>(ring_.control->tail).load(std::memory_order_acquire);
    if (tail - head_ > ring_.capacity) {
      ++corruptions_;
      return ring_.capacity;
    }
    return tail - head_;
  }

  std::uint32_t capacity() const { return ring_.capacity; }
  // Times the producer left an impossible turn in a slot or tail hint.
  std::uint64_t corruption_count() const { return corruptions_; }
  std::uint32_t* consumer_waiting() const { return &ring_.control->consumer_waiting; }

 private:
  // Loads word 0 of slot[head_]; true if it holds the record for head_.
  bool next_ready(std::uint64_t& word0) {
    // SYNC: acquire pairs with the producer's release store of word 0 in
    // publish_slot(): once the turn matches, the payload words are visible.
    word0 = std::atomic_ref<std::uint64_t>(ring_.slot(head_).words[0]).load(std::memory_order_acquire);
    std::uint32_t seen = static_cast<std::uint32_t>(word0 >> detail::kTurnShift);
    if (seen == ring_.turn(head_)) return true;
    // Legitimately the slot is untouched (0) or holds the previous lap's
    // record; anything else is a peer writing nonsense. Counted once per
    // position, since a consumer may spin here.
    if (seen != 0 && seen != ring_.turn(head_ - ring_.capacity) && corrupt_at_ != head_) {
      ++corruptions_;
      corrupt_at_ = head_;
    }
    return false;
  }

  // Copies slot[head_] into `out` if it holds the record for head_.
  bool take(Slot& out) {
    std::uint64_t word0;
    if (!next_ready(word0)) return false;
    Slot& shared = ring_.slot(head_);
    out.words[0] = word0 & detail::kPayloadMask0;
    for (std::size_t i = 1; i < std::size(out.words); ++i) {
      out.words[i] = std::atomic_ref<std::uint64_t>(shared.words[i]).load(std::memory_order_relaxed);
    }
    return true;
  }

  void publish_head() {
    if (head_ == published_head_) return;
    published_head_ = head_;
    // SYNC: release orders our slot loads before the producer may reuse the
    // slots. Pairs with the producer's acquire load of head in refresh_head().
    std::atomic_ref<std::uint32_t>(ring_.control->head).store(head_, std::memory_order_release);
  }

  detail::RingView ring_;
  std::uint32_t publish_interval_ = 1;
  std::uint32_t head_ = 0;            // private: the truth about what we consumed
  std::uint32_t published_head_ = 0;  // what the producer has been told
  std::uint32_t corrupt_at_ = ~0u;    // position of the last corruption counted
  std::uint64_t corruptions_ = 0;
};

}  // namespace tandem::ipc
