// Ring attach: checks the region and reads the starting indices once.
#include "ipc/spsc_ring.h"

#include <bit>

#include <fmt/format.h>

namespace tandem::ipc {
namespace detail {

base::Result<RingView> view_ring(std::span<std::byte> region, std::uint32_t slots) {
  if (slots < kMinRingSlots || slots > kMaxRingSlots || !std::has_single_bit(slots)) {
    return base::make_error(
        EINVAL, fmt::format("ring: {} slots is not a power of two in [{}, {}]", slots, kMinRingSlots, kMaxRingSlots));
  }
  if (region.size() < ring_region_size(slots)) {
    return base::make_error(EINVAL, fmt::format("ring: region of {} bytes cannot hold {} slots ({} bytes)",
                                                region.size(), slots, ring_region_size(slots)));
  }
  if (reinterpret_cast<std::uintptr_t>(region.data()) % kIndexAlign != 0) {
    return base::make_error(EINVAL, "ring: region is not 128-byte aligned");
  }
  auto* control = reinterpret_cast<RingControl*>(region.data());
  auto* first = reinterpret_cast<Slot*>(region.data() + sizeof(RingControl));
  return RingView{control, first, slots, slots - 1, static_cast<unsigned>(std::countr_zero(slots))};
}

}  // namespace detail

base::Result<RingProducer> RingProducer::attach(std::span<std::byte> region, std::uint32_t slots) {
  auto view = detail::view_ring(region, slots);
  if (!view) return base::propagate(std::move(view.error()));
  RingProducer p;
  p.ring_ = *view;
  // SYNC: acquire on head pairs with the consumer's release store (slots it
  // finished with are free); tail is ours, relaxed suffices.
  p.cached_head_ = std::atomic_ref<std::uint32_t>(view->control->head).load(std::memory_order_acquire);
  p.tail_ = std::atomic_ref<std::uint32_t>(view->control->tail).load(std::memory_order_relaxed);
  if (p.tail_ - p.cached_head_ > view->capacity) {
    return base::make_error(EINVAL, fmt::format("ring: tail {} and head {} are inconsistent", p.tail_, p.cached_head_));
  }
  return p;
}

base::Result<RingConsumer> RingConsumer::attach(std::span<std::byte> region, std::uint32_t slots) {
  auto view = detail::view_ring(region, slots);
  if (!view) return base::propagate(std::move(view.error()));
  RingConsumer c;
  c.ring_ = *view;
  c.publish_interval_ = view->capacity / 4 > 0 ? view->capacity / 4 : 1;
  c.head_ = std::atomic_ref<std::uint32_t>(view->control->head).load(std::memory_order_relaxed);
  c.published_head_ = c.head_;
  return c;
}

}  // namespace tandem::ipc
