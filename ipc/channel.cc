// Channel setup and the client's overflow-safe event sender.
#include "ipc/channel.h"

#include <fmt/format.h>

namespace tandem::ipc {

base::Result<Channel> Channel::create(const ChannelConfig& config, const std::string& name) {
  const RegionSpec specs[] = {
      {RegionKind::kEventRing, config.event_slots},
      {RegionKind::kDirectiveRing, config.directive_slots},
      {RegionKind::kStatusPage, sizeof(EngineStatus)},
  };
  auto segment = ShmSegment::create(name, specs);
  if (!segment) return base::propagate(std::move(segment.error()), "create channel");
  auto event_bell = make_doorbell_fd();
  if (!event_bell) return base::propagate(std::move(event_bell.error()), "create channel");
  auto directive_bell = make_doorbell_fd();
  if (!directive_bell) return base::propagate(std::move(directive_bell.error()), "create channel");
  Channel c;
  c.segment_ = std::move(*segment);
  c.event_bell_ = std::move(*event_bell);
  c.directive_bell_ = std::move(*directive_bell);
  c.event_slots_ = config.event_slots;
  c.directive_slots_ = config.directive_slots;
  return c;
}

base::Result<Channel> Channel::attach(base::UniqueFd segment, base::UniqueFd event_bell,
                                      base::UniqueFd directive_bell) {
  if (!event_bell || !directive_bell) return base::make_error(EBADF, "attach channel: missing doorbell fd");
  auto seg = ShmSegment::attach(std::move(segment));
  if (!seg) return base::propagate(std::move(seg.error()), "attach channel");
  const SegmentLayout& layout = seg->layout();
  const Region* events = layout.find(RegionKind::kEventRing);
  const Region* directives = layout.find(RegionKind::kDirectiveRing);
  const Region* status = layout.find(RegionKind::kStatusPage);
  if (events == nullptr || directives == nullptr || status == nullptr) {
    return base::make_error(EINVAL, "attach channel: segment lacks an event ring, directive ring or status page");
  }
  if (status->param != sizeof(EngineStatus)) {
    return base::make_error(EPROTO, fmt::format("attach channel: status page holds {} bytes, expected {}",
                                                status->param, sizeof(EngineStatus)));
  }
  Channel c;
  c.event_slots_ = events->param;
  c.directive_slots_ = directives->param;
  c.segment_ = std::move(*seg);
  c.event_bell_ = std::move(event_bell);
  c.directive_bell_ = std::move(directive_bell);
  return c;
}

base::Result<std::span<std::byte>> Channel::region(RegionKind kind) const {
  const Region* r = segment_.layout().find(kind);
  if (r == nullptr) return base::make_error(ENOENT, "channel: region missing");
  return segment_.region(*r);
}

base::Result<RingConsumer> Channel::event_consumer() {
  auto r = region(RegionKind::kEventRing);
  if (!r) return base::propagate(std::move(r.error()));
  return RingConsumer::attach(*r, event_slots_);
}

base::Result<RingProducer> Channel::event_producer() {
  auto r = region(RegionKind::kEventRing);
  if (!r) return base::propagate(std::move(r.error()));
  return RingProducer::attach(*r, event_slots_);
}

base::Result<RingConsumer> Channel::directive_consumer() {
  auto r = region(RegionKind::kDirectiveRing);
  if (!r) return base::propagate(std::move(r.error()));
  return RingConsumer::attach(*r, directive_slots_);
}

base::Result<RingProducer> Channel::directive_producer() {
  auto r = region(RegionKind::kDirectiveRing);
  if (!r) return base::propagate(std::move(r.error()));
  return RingProducer::attach(*r, directive_slots_);
}

base::Result<StatusWriter<EngineStatus>> Channel::status_writer() {
  auto r = region(RegionKind::kStatusPage);
  if (!r) return base::propagate(std::move(r.error()));
  return StatusWriter<EngineStatus>::attach(*r);
}

base::Result<StatusReader<EngineStatus>> Channel::status_reader() {
  auto r = region(RegionKind::kStatusPage);
  if (!r) return base::propagate(std::move(r.error()));
  return StatusReader<EngineStatus>::attach(*r);
}

Doorbell Channel::event_doorbell() const {
  auto r = region(RegionKind::kEventRing);
  auto* control = reinterpret_cast<RingControl*>(r->data());
  return Doorbell(&control->consumer_waiting, event_bell_.get());
}

Doorbell Channel::directive_doorbell() const {
  auto r = region(RegionKind::kDirectiveRing);
  auto* control = reinterpret_cast<RingControl*>(r->data());
  return Doorbell(&control->consumer_waiting, directive_bell_.get());
}

bool EventSender::send(const Slot& record) {
  // Order is kept: nothing new enters the ring while older records wait in
  // the overflow queue.
  flush();
  if (overflow_.empty() && ring_.try_push(record)) {
    bell_.notify();
    return true;
  }
  if (overflow_.size() < overflow_capacity_) {
    overflow_.push_back(record);
    return true;
  }
  ++dropped_;
  segment_->set_flags(kFlagResyncNeeded);
  bell_.notify();
  return false;
}

void EventSender::flush() {
  bool pushed = false;
  while (!overflow_.empty() && ring_.try_push(overflow_.front())) {
    overflow_.pop_front();
    pushed = true;
  }
  if (pushed) bell_.notify();
}

}  // namespace tandem::ipc
