// Fuzz target: a ring consumer and producer over shared memory whose every
// byte (indices and slots) comes from the input, as a hostile peer would
// leave it. Neither side may read or write outside the ring (ASan checks),
// the consumer may never yield more than `capacity` records per refresh, and
// the producer may never accept more than the free slots it can prove.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ipc/spsc_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem::ipc;
  constexpr std::uint32_t kSlots = 8;
  constexpr std::size_t kBytes = ring_region_size(kSlots);
  // Exactly the ring region, 128-byte aligned, so ASan flags any overrun.
  auto* region = static_cast<std::byte*>(std::aligned_alloc(kIndexAlign, kBytes));
  std::memset(region, 0, kBytes);
  std::memcpy(region, data, size < kBytes ? size : kBytes);
  std::span<std::byte> span(region, kBytes);

  if (auto consumer = RingConsumer::attach(span, kSlots)) {
    std::vector<Slot> out(3 * kSlots);
    if (consumer->pop_batch(out) > kSlots) __builtin_trap();
    if (consumer->available() > kSlots) __builtin_trap();
    Slot one;
    for (std::uint32_t i = 0; i < 2 * kSlots && consumer->try_pop(one); ++i) {
    }
  }
  if (auto producer = RingProducer::attach(span, kSlots)) {
    std::vector<Slot> in(3 * kSlots);
    if (producer->push_batch(in) > kSlots) __builtin_trap();
    (void)producer->try_push(in[0]);
    if (producer->in_flight() > kSlots) __builtin_trap();
  }
  std::free(region);
  return 0;
}
