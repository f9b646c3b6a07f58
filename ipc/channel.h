// Channel: the per-client segment of docs/architecture.md "Wire records" and its two doorbells.
//
// One sealed memfd holds the event ring (client → daemon), the directive ring
// (daemon → client) and the status page (daemon → client); two eventfds wake
// the consumer of each ring. The daemon create()s a channel and sends the
// three fds in its Welcome (SCM_RIGHTS); the client attach()es them.
//
// Each side then takes the endpoints that belong to it:
//   daemon: events()        consumer, directives() producer, status() writer
//   client: events()        producer, directives() consumer, status() reader
// Endpoints point into the channel's mapping: the Channel must outlive them.
//
// Overflow: a full event ring must never silently lose a record. The client's
// EventSender keeps a small bounded overflow queue; when that fills too, it
// drops and sets kFlagResyncNeeded in the segment header, which tells the
// daemon to ask for a resync snapshot over the socket.
#pragma once

#include <cstdint>
#include <deque>

#include "base/result.h"
#include "base/unique_fd.h"
#include "ipc/doorbell.h"
#include "ipc/records.h"
#include "ipc/segment.h"
#include "ipc/spsc_ring.h"
#include "ipc/status_page.h"

namespace tandem::ipc {

// What the daemon publishes on a client's status page.
struct EngineStatus {
  std::uint64_t policy_epoch = 0;         // bumps on every policy (re)configuration
  std::int64_t updated_ns = 0;            // CLOCK_MONOTONIC of this snapshot
  std::uint32_t admission_window = 0;     // sessions this engine may run now; 0 = no limit set
  std::uint32_t sm_partition = 0;         // index into the engine's green-context partitions
  std::uint64_t offload_plan = 0;         // bit i: offload weight module i to host
  std::uint32_t flags = 0;                // kStatus* bits
  std::uint32_t sm_partition_pool = 0;    // the GPU_PARTITIONS pool_id sm_partition is for (with kStatusSmPartitionSet)
  std::uint64_t offload_freed_bytes = 0;  // device bytes offload_plan frees: the engine may grow its KV pool by this
  std::uint64_t reserved[2] = {};
};
static_assert(sizeof(EngineStatus) == 64);
inline constexpr std::uint32_t kStatusDraining = 1u << 0;  // admit nothing new
// sm_partition holds the daemon's choice for this engine's current pool (unset: the
// engine keeps its own partition; libtandem GreenContextPool).
inline constexpr std::uint32_t kStatusSmPartitionSet = 1u << 1;

struct ChannelConfig {
  std::uint32_t event_slots = 4096;      // power of two
  std::uint32_t directive_slots = 1024;  // power of two
};

// Thread-safety: set up by one thread; afterwards each endpoint belongs to the
// one thread that uses it.
class Channel {
 public:
  Channel() = default;

  // Daemon side: a new segment and two doorbell eventfds.
  static base::Result<Channel> create(const ChannelConfig& config, const std::string& name = "tandem-channel");
  // Client side: the three fds from Welcome, in that order.
  static base::Result<Channel> attach(base::UniqueFd segment, base::UniqueFd event_bell, base::UniqueFd directive_bell);

  const ShmSegment& segment() const { return segment_; }
  ShmSegment& segment() { return segment_; }
  int segment_fd() const { return segment_.fd(); }
  int event_bell_fd() const { return event_bell_.get(); }
  int directive_bell_fd() const { return directive_bell_.get(); }
  std::uint32_t event_slots() const { return event_slots_; }
  std::uint32_t directive_slots() const { return directive_slots_; }

  // Endpoints. Call each at most once per side.
  base::Result<RingConsumer> event_consumer();
  base::Result<RingProducer> event_producer();
  base::Result<RingConsumer> directive_consumer();
  base::Result<RingProducer> directive_producer();
  base::Result<StatusWriter<EngineStatus>> status_writer();
  base::Result<StatusReader<EngineStatus>> status_reader();
  Doorbell event_doorbell() const;
  Doorbell directive_doorbell() const;

 private:
  // Resolves the three regions of segment_ (once, at create or attach).
  base::Result<void> resolve_regions();

  ShmSegment segment_;
  std::span<std::byte> event_region_;
  std::span<std::byte> directive_region_;
  std::span<std::byte> status_region_;
  base::UniqueFd event_bell_;
  base::UniqueFd directive_bell_;
  std::uint32_t event_slots_ = 0;
  std::uint32_t directive_slots_ = 0;
};

// The client's sending end of the event ring: never blocks, never silently
// loses. Thread-safety: one producer thread.
class EventSender {
 public:
  static constexpr std::size_t kDefaultOverflow = 1024;

  EventSender(RingProducer ring, Doorbell bell, ShmSegment* segment, std::size_t overflow_capacity = kDefaultOverflow)
      : ring_(ring), bell_(std::move(bell)), segment_(segment), overflow_capacity_(overflow_capacity) {}

  // Queues a record and wakes the daemon if it sleeps. Returns false only if
  // the record was dropped (ring and overflow full); resync is then flagged.
  bool send(const Slot& record);
  // Moves overflowed records into the ring; call when the daemon catches up.
  void flush();

  std::size_t overflowed() const { return overflow_.size(); }
  std::uint64_t dropped() const { return dropped_; }
  // Records put on the ring so far, plus those queued for it: the ring
  // position of everything sent until now (Resync.ring_position).
  std::uint64_t position() const { return pushed_ + overflow_.size(); }

 private:
  RingProducer ring_;
  Doorbell bell_;
  ShmSegment* segment_;
  std::size_t overflow_capacity_;
  std::deque<Slot> overflow_;
  std::uint64_t dropped_ = 0;
  std::uint64_t pushed_ = 0;
};

}  // namespace tandem::ipc
