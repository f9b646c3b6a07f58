// The layer streamer: Nova's slot rotation over DeviceApi copies and events.
// Thread-safety: layer_streamer.h's (one mutex per streamer).
#include "gpu/layer_streamer.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

namespace tandem::gpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// B may equal the bound up to rounding (a caller computing the same
// expression in another order).
constexpr double kTolerance = 1e-12;

}  // namespace

StreamerBandwidth check_bandwidth(std::uint64_t layer_bytes, double layer_compute_s, std::uint32_t layers,
                                  std::uint32_t slots, double link_bytes_per_s) {
  const double s = static_cast<double>(layer_bytes);
  const double t = layer_compute_s;
  const double b = link_bytes_per_s;
  if (slots >= layers && layers > 0) return StreamerBandwidth{.ok = true};  // everything resident
  if (layer_bytes == 0) return StreamerBandwidth{.ok = !(b < 0) && !std::isnan(b)};
  if (layers < 3 || slots < 2 || !(t > 0) || std::isnan(b) || b < 0) {
    return StreamerBandwidth{
        .required_bytes_per_s = kInf, .back_to_back_bytes_per_s = kInf, .ok = false, .slowdown_s_per_pass = kInf};
  }
  const double streamed = layers - slots;  // L − K copies per pass
  const double window = layers - 2;        // (L − 2)·T to hide them in
  StreamerBandwidth out;
  out.back_to_back_bytes_per_s = s / t;
  out.required_bytes_per_s = s / t * streamed / window;
  out.ok = b >= out.required_bytes_per_s * (1 - kTolerance);
  if (!out.ok) {
    out.slowdown_s_per_pass = b > 0 ? std::max(0.0, (streamed * s / b) - (window * t)) : kInf;
  }
  return out;
}

LayerStreamer::LayerStreamer(DeviceApi& device, LayerStreamerConfig config)
    : device_(device),
      config_(config),
      bandwidth_(check_bandwidth(config.layer_bytes, config.layer_compute_s, config.layers, config.slots,
                                 config.link_bytes_per_s)) {}

base::Result<std::unique_ptr<LayerStreamer>> LayerStreamer::create(DeviceApi& device, LayerStreamerConfig config,
                                                                   std::span<const void* const> host_layers,
                                                                   WarningSink warn) {
  const std::uint32_t l = config.layers;
  const std::uint32_t k = config.slots;
  const std::uint64_t s = config.layer_bytes;
  if (l < 3 || l > kMaxLayers) {
    return base::make_error(EINVAL, fmt::format("layer streamer: layers {} must be in 3..{}", l, kMaxLayers));
  }
  if (k < 2 || k >= l) {
    return base::make_error(EINVAL, fmt::format("layer streamer: slots {} must be in 2..{} (layers - 1)", k, l - 1));
  }
  if (s == 0) return base::make_error(EINVAL, "layer streamer: layer_bytes must be > 0");
  if (s > std::numeric_limits<std::uint64_t>::max() / l) {
    return base::make_error(EINVAL, fmt::format("layer streamer: {} layers of {} bytes overflow", l, s));
  }
  if (!std::isfinite(config.layer_compute_s) || config.layer_compute_s <= 0) {
    return base::make_error(
        EINVAL, fmt::format("layer streamer: layer_compute_s {} must be finite and > 0", config.layer_compute_s));
  }
  if (!std::isfinite(config.link_bytes_per_s) || config.link_bytes_per_s < 0) {
    return base::make_error(
        EINVAL, fmt::format("layer streamer: link_bytes_per_s {} must be finite and >= 0 (0: the device's rating)",
                            config.link_bytes_per_s));
  }
  if (host_layers.size() != l) {
    return base::make_error(EINVAL,
                            fmt::format("layer streamer: {} host layers given for {} layers", host_layers.size(), l));
  }
  for (std::uint32_t i = 0; i < l; ++i) {
    if (host_layers[i] == nullptr) {
      return base::make_error(EINVAL, fmt::format("layer streamer: host layer {} is NULL", i));
    }
  }
  if (config.link_bytes_per_s == 0) config.link_bytes_per_s = device.h2d_bytes_per_s();

  // From here on the destructor releases whatever was made.
  std::unique_ptr<LayerStreamer> st(new LayerStreamer(device, config));
  st->warn_ = std::move(warn);
  const auto step = [](std::string_view what, base::Error e) {
    return base::propagate(std::move(e), fmt::format("layer streamer: {}", what));
  };
  for (std::uint32_t i = 0; i < l; ++i) {
    auto h = device.alloc_pinned_host(s);
    if (!h) return step(fmt::format("pinned copy of layer {}", i), std::move(h.error()));
    st->host_.push_back(*h);
    std::memcpy(*h, host_layers[i], s);
  }
  for (std::uint32_t i = 0; i < k; ++i) {
    auto p = device.alloc_device(s);
    if (!p) return step(fmt::format("device slot {}", i), std::move(p.error()));
    st->slots_.push_back(*p);
    for (auto* events : {&st->loaded_, &st->consumed_}) {
      auto e = device.create_event();
      if (!e) return step(fmt::format("event of slot {}", i), std::move(e.error()));
      events->push_back(*e);
    }
  }
  // The lowest priority: both backends clamp to the device's range.
  auto cs = device.create_plain_stream(std::numeric_limits<int>::max());
  if (!cs) return step("copy stream", std::move(cs.error()));
  st->copy_stream_ = *cs;
  st->have_copy_stream_ = true;
  for (std::uint32_t i = 0; i < k; ++i) {
    if (auto c = device.copy_h2d_async(st->slots_[i], st->host_[i], s, *cs); !c) {
      return step(fmt::format("prefetch of layer {}", i), std::move(c.error()));
    }
    if (auto r = device.record_event(st->loaded_[i], *cs); !r) {
      return step(fmt::format("prefetch of layer {}", i), std::move(r.error()));
    }
  }

  const StreamerBandwidth& bw = st->bandwidth_;
  if (!bw.ok && st->warn_) {
    st->warn_(fmt::format(
        "layer streamer: link {:.6g} GB/s is below the {:.6g} GB/s needed to hide {} of {} layers of {} bytes behind "
        "{:.6g} ms of compute each with {} slots; each pass will take {:.6g} ms longer",
        config.link_bytes_per_s / 1e9, bw.required_bytes_per_s / 1e9, l - k, l, s, config.layer_compute_s * 1e3, k,
        bw.slowdown_s_per_pass * 1e3));
  }
  return st;
}

LayerStreamer::~LayerStreamer() {
  std::lock_guard lock(mu_);
  const auto log = [this](std::string_view what, const base::Result<void>& r) noexcept {
    if (r || !warn_) return;
    try {
      warn_(fmt::format("layer streamer teardown: {}: {}", what, r.error().message()));
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; the release goes on
    }
  };
  // In-flight copies read the pinned buffers and write the slots: let them end.
  if (have_copy_stream_) {
    log("copy stream synchronize", device_.stream_synchronize(copy_stream_));
    log("copy stream destroy", device_.destroy_stream(copy_stream_));
  }
  for (EventId e : loaded_) log("event destroy", device_.destroy_event(e));
  for (EventId e : consumed_) log("event destroy", device_.destroy_event(e));
  for (DevicePtr p : slots_) log("slot free", device_.free_device(p));
  for (void* h : host_) log("pinned free", device_.free_pinned_host(h));
}

base::Result<void> LayerStreamer::fail(base::Error e) {
  failed_ = e;
  return base::propagate(std::move(e));
}

base::Result<void> LayerStreamer::check_usable() const {
  if (failed_) {
    return base::make_error(
        EIO, fmt::format("layer streamer: unusable after an earlier device failure: {}", failed_->message()));
  }
  return {};
}

base::Result<DevicePtr> LayerStreamer::acquire(std::uint32_t layer, StreamId compute) {
  std::lock_guard lock(mu_);
  if (auto u = check_usable(); !u) return base::propagate(std::move(u.error()));
  const std::uint32_t l = config_.layers;
  const std::uint32_t k = config_.slots;
  const auto expected = static_cast<std::uint32_t>(acquired_ % l);
  if (layer >= l) {
    return base::make_error(
        EINVAL, fmt::format("layer streamer: acquire layer {}: the model has {} layers (0..{})", layer, l, l - 1));
  }
  if (layer != expected) {
    return base::make_error(
        EINVAL, fmt::format("layer streamer: acquire layer {} out of order: layer {} is next", layer, expected));
  }
  if (acquired_ - released_ >= k) {
    return base::make_error(EINVAL, fmt::format("layer streamer: acquire layer {}: all {} slots are held; release "
                                                "layer {} first",
                                                layer, k, static_cast<std::uint32_t>(released_ % l)));
  }
  const std::size_t slot = acquired_ % k;
  if (auto w = device_.stream_wait_event(compute, loaded_[slot]); !w) {
    // A bad stream id changes nothing: the wait never happened.
    return base::propagate(std::move(w.error()), fmt::format("layer streamer: acquire layer {}", layer));
  }
  ++acquired_;
  return slots_[slot];
}

base::Result<void> LayerStreamer::release(std::uint32_t layer, StreamId compute) {
  std::lock_guard lock(mu_);
  if (auto u = check_usable(); !u) return u;
  const std::uint32_t l = config_.layers;
  const std::uint32_t k = config_.slots;
  if (layer >= l) {
    return base::make_error(
        EINVAL, fmt::format("layer streamer: release layer {}: the model has {} layers (0..{})", layer, l, l - 1));
  }
  if (released_ == acquired_) {
    return base::make_error(EINVAL, fmt::format("layer streamer: release layer {} without acquire: no layer is "
                                                "held (layer {} is next to acquire)",
                                                layer, static_cast<std::uint32_t>(acquired_ % l)));
  }
  const auto expected = static_cast<std::uint32_t>(released_ % l);
  if (layer != expected) {
    return base::make_error(EINVAL, fmt::format("layer streamer: release layer {} out of order: layer {} is the "
                                                "oldest held",
                                                layer, expected));
  }
  const std::size_t slot = released_ % k;
  const std::uint32_t next = static_cast<std::uint32_t>((layer + k) % l);
  const auto where = [&] { return fmt::format("layer streamer: release layer {}", layer); };
  // The first call fails cleanly on a bad stream id; after it, state changed.
  if (auto r = device_.record_event(consumed_[slot], compute); !r) {
    return base::propagate(std::move(r.error()), where());
  }
  if (auto w = device_.stream_wait_event(copy_stream_, consumed_[slot]); !w) {
    return fail(base::propagate(std::move(w.error()), where()).error());
  }
  if (auto c = device_.copy_h2d_async(slots_[slot], host_[next], config_.layer_bytes, copy_stream_); !c) {
    return fail(base::propagate(std::move(c.error()), fmt::format("{}: copy of layer {}", where(), next)).error());
  }
  if (auto r = device_.record_event(loaded_[slot], copy_stream_); !r) {
    return fail(base::propagate(std::move(r.error()), where()).error());
  }
  ++released_;
  return {};
}

base::Result<void> LayerStreamer::synchronize() {
  std::lock_guard lock(mu_);
  if (auto s = device_.stream_synchronize(copy_stream_); !s) {
    return base::propagate(std::move(s.error()), "layer streamer: synchronize");
  }
  return {};
}

std::uint64_t LayerStreamer::device_bytes() const {
  return static_cast<std::uint64_t>(config_.slots) * config_.layer_bytes;
}

std::uint64_t LayerStreamer::freed_bytes() const {
  return static_cast<std::uint64_t>(config_.layers - config_.slots) * config_.layer_bytes;
}

std::uint32_t LayerStreamer::next_layer() const {
  std::lock_guard lock(mu_);
  return static_cast<std::uint32_t>(acquired_ % config_.layers);
}

std::uint32_t LayerStreamer::held() const {
  std::lock_guard lock(mu_);
  return static_cast<std::uint32_t>(acquired_ - released_);
}

}  // namespace tandem::gpu
