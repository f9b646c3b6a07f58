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
  auto resolved = c.resolve_regions();
  if (!resolved) return base::propagate(std::move(resolved.error()), "create channel");
  return c;
}

base::Result<Channel> Channel::attach(base::UniqueFd segment, base::UniqueFd event_bell,
                                      base::UniqueFd directive_bell) {
  if (!event_bell || !directive_bell) return base::make_error(EBADF, "attach channel: missing doorbell fd");
  auto seg = ShmSegment::attach(std::move(segment));
  if (!seg) return base::propagate(std::move(seg.error()), "attach channel");
  Channel c;
  c.segment_ = std::move(*seg);
  c.event_bell_ = std::move(event_bell);
  c.directive_bell_ = std::move(directive_bell);
  auto resolved = c.resolve_regions();
  if (!resolved) return base::propagate(std::move(resolved.error()), "attach channel");
  return c;
}

base::Result<void> Channel::resolve_regions() {
  const SegmentLayout& layout = segment_.layout();
  const Region* events = layout.find(RegionKind::kEventRing);
  const Region* directives = layout.find(RegionKind::kDirectiveRing);
  const Region* status = layout.find(RegionKind::kStatusPage);
  if (events == nullptr || directives == nullptr || status == nullptr) {
    return base::make_error(EINVAL, "segment lacks an event ring, directive ring or status page");
  }
  if (status->param != sizeof(EngineStatus)) {
    return base::make_error(
        EPROTO, fmt::format("status page holds {} bytes, expected {}", status->param, sizeof(EngineStatus)));
  }
  event_slots_ = events->param;
  directive_slots_ = directives->param;
  event_region_ = segment_.region(*events);
  directive_region_ = segment_.region(*directives);
  status_region_ = segment_.region(*status);
  return {};
}

base::Result<RingConsumer> Channel::event_consumer() { return RingConsumer::attach(event_region_, event_slots_); }
base::Result<RingProducer> Channel::event_producer() { return RingProducer::attach(event_region_, event_slots_); }
base::Result<RingConsumer> Channel::directive_consumer() {
  return RingConsumer::attach(directive_region_, directive_slots_);
}
base::Result<RingProducer> Channel::directive_producer() {
  return RingProducer::attach(directive_region_, directive_slots_);
}
base::Result<StatusWriter<EngineStatus>> Channel::status_writer() {
  return StatusWriter<EngineStatus>::attach(status_region_);
}
base::Result<StatusReader<EngineStatus>> Channel::status_reader() {
  return StatusReader<EngineStatus>::attach(status_region_);
}

Doorbell Channel::event_doorbell() const {
  return Doorbell(&reinterpret_cast<RingControl*>(event_region_.data())->consumer_waiting, event_bell_.get());
}

Doorbell Channel::directive_doorbell() const {
  return Doorbell(&reinterpret_cast<RingControl*>(directive_region_.data())->consumer_waiting, directive_bell_.get());
}

bool EventSender::send(const Slot& record) {
  // Order is kept: nothing new enters the ring while older records wait in
  // the overflow queue.
  flush();
  if (overflow_.empty() && ring_.try_push(record)) {
    ++pushed_;
    bell_.notify_if([this] { return ring_.in_flight(); });
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
    ++pushed_;
    pushed = true;
  }
  if (pushed) bell_.notify_if([this] { return ring_.in_flight(); });
}

}  // namespace tandem::ipc
