// SpscRing: a single-producer single-consumer ring of 64-byte slots in shared memory.
//
// The protocol is io_uring's (gpu_and_ipc.md B.1): free-running u32 `tail`
// (producer-owned) and `head` (consumer-owned) on separate 128-byte blocks, a
// power-of-two slot count, slot = index & mask. The producer writes slots, then
// store-releases `tail`; the consumer load-acquires `tail`, copies slots out,
// then store-releases `head`, which hands the slots back.
//
// Each side keeps its own index privately and never reads it back from shared
// memory, and caches the other side's index so the common case touches no
// shared line but the slot (rigtorp's trick). A peer is untrusted: an index
// that implies more than `capacity` records in flight is counted as corruption
// and clamped (consumer) or treated as "full" (producer), so no access ever
// leaves the ring. Slots are copied word by word with relaxed atomics: a peer
// scribbling concurrently yields a garbage record (which validation rejects),
// never a data race in our process.
//
// No syscall on any path here; waking a sleeping consumer is the Doorbell's job.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/result.h"
#include "ipc/abi.h"

namespace tandem::ipc {

namespace detail {

inline void store_slot(Slot& shared, const Slot& value) {
  for (std::size_t i = 0; i < std::size(value.words); ++i) {
    std::atomic_ref<std::uint64_t>(shared.words[i]).store(value.words[i], std::memory_order_relaxed);
  }
}

inline void load_slot(Slot& value, Slot& shared) {
  for (std::size_t i = 0; i < std::size(value.words); ++i) {
    value.words[i] = std::atomic_ref<std::uint64_t>(shared.words[i]).load(std::memory_order_relaxed);
  }
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

struct RingView {
  RingControl* control = nullptr;
  Slot* slots = nullptr;
  std::uint32_t capacity = 0;
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
    if (tail_ - cached_head_ >= capacity_ && !refresh_head()) return false;
    detail::store_slot(slots_[tail_ & mask_], record);
    ++tail_;
    // SYNC: release publishes the slot words stored above. Pairs with the
    // consumer's acquire load of tail in RingConsumer::refresh_tail().
    std::atomic_ref<std::uint32_t>(control_->tail).store(tail_, std::memory_order_release);
    return true;
  }

  // Appends as many of `records` as fit, publishing them with one tail store.
  // Returns how many were appended.
  std::size_t push_batch(std::span<const Slot> records) {
    std::uint32_t free_slots = capacity_ - (tail_ - cached_head_);
    if (free_slots < records.size()) {
      refresh_head();
      free_slots = capacity_ - (tail_ - cached_head_);
    }
    std::size_t n = records.size() < free_slots ? records.size() : free_slots;
    if (n == 0) return 0;
    for (std::size_t i = 0; i < n; ++i) detail::store_slot(slots_[(tail_ + i) & mask_], records[i]);
    tail_ += static_cast<std::uint32_t>(n);
    // SYNC: release, as in try_push(); pairs with RingConsumer::refresh_tail().
    std::atomic_ref<std::uint32_t>(control_->tail).store(tail_, std::memory_order_release);
    return n;
  }

  // Records the consumer has not yet taken, as of its last published head.
  std::uint32_t in_flight() {
    refresh_head();
    return tail_ - cached_head_;
  }
  std::uint32_t capacity() const { return capacity_; }
  // Times the consumer's head was impossible (ahead of tail, or more than
  // `capacity` behind it).
  std::uint64_t corruption_count() const { return corruptions_; }
  // The doorbell flag of this ring (for Doorbell).
  std::uint32_t* consumer_waiting() const { return &control_->consumer_waiting; }

 private:
  // Re-reads the consumer's head; returns whether a slot is free.
  bool refresh_head() {
    // SYNC: acquire pairs with the consumer's release store of head, so its
    // copies out of the slots are complete before we overwrite them.
    std::uint32_t head = std::atomic_ref<std::uint32_t>(control_->head).load(std::memory_order_acquire);
    if (tail_ - head > capacity_) {
      // The consumer claims to have taken records we never wrote. Keep our old
      // view of it; the ring looks full until it behaves.
      ++corruptions_;
      return false;
    }
    cached_head_ = head;
    return tail_ - head < capacity_;
  }

  RingControl* control_ = nullptr;
  Slot* slots_ = nullptr;
  std::uint32_t capacity_ = 0;
  std::uint32_t mask_ = 0;
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
    if (head_ == cached_tail_ && !refresh_tail()) return false;
    detail::load_slot(out, slots_[head_ & mask_]);
    ++head_;
    // SYNC: release orders the slot loads above before the producer may reuse
    // the slot. Pairs with the producer's acquire load of head in refresh_head().
    std::atomic_ref<std::uint32_t>(control_->head).store(head_, std::memory_order_release);
    return true;
  }

  // Copies up to out.size() records, releasing them with one head store.
  std::size_t pop_batch(std::span<Slot> out) {
    std::uint32_t ready = cached_tail_ - head_;
    if (ready < out.size()) {
      refresh_tail();
      ready = cached_tail_ - head_;
    }
    std::size_t n = out.size() < ready ? out.size() : ready;
    if (n == 0) return 0;
    for (std::size_t i = 0; i < n; ++i) detail::load_slot(out[i], slots_[(head_ + i) & mask_]);
    head_ += static_cast<std::uint32_t>(n);
    // SYNC: release, as in try_pop(); pairs with RingProducer::refresh_head().
    std::atomic_ref<std::uint32_t>(control_->head).store(head_, std::memory_order_release);
    return n;
  }

  // Records ready to pop (re-reads the producer's tail).
  std::uint32_t available() {
    refresh_tail();
    return cached_tail_ - head_;
  }
  bool empty() { return available() == 0; }
  std::uint32_t capacity() const { return capacity_; }
  // Times the producer's tail implied more than `capacity` records in flight.
  std::uint64_t corruption_count() const { return corruptions_; }
  std::uint32_t* consumer_waiting() const { return &control_->consumer_waiting; }

 private:
  // Re-reads the producer's tail; returns whether a record is ready.
  bool refresh_tail() {
    // SYNC: acquire pairs with the producer's release store of tail, making
    // the slot words it wrote visible to load_slot().
    std::uint32_t tail = std::atomic_ref<std::uint32_t>(control_->tail).load(std::memory_order_acquire);
    if (tail - head_ > capacity_) {
      // Impossible occupancy: clamp as io_uring does ("userspace may cheat
      // modifying the tail, be safe and do min"); records read this way are
      // garbage that record validation will reject.
      ++corruptions_;
      tail = head_ + capacity_;
    }
    cached_tail_ = tail;
    return tail != head_;
  }

  RingControl* control_ = nullptr;
  Slot* slots_ = nullptr;
  std::uint32_t capacity_ = 0;
  std::uint32_t mask_ = 0;
  std::uint32_t head_ = 0;         // private: the truth about what we consumed
  std::uint32_t cached_tail_ = 0;  // last tail we validated (clamped)
  std::uint64_t corruptions_ = 0;
};

}  // namespace tandem::ipc
