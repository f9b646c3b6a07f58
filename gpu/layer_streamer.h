// LayerStreamer: layer-wise weight offload (Nova; docs/architecture.md "GPU plane"). A model's L
// layers of S bytes each live in pinned host memory; only K device slots of S
// bytes are resident, and while the engine computes layer i the copy engine
// brings layer i+K into the slot layer i frees. The device keeps K·S bytes of
// weights instead of L·S; the (L−K)·S bytes freed go to the KV cache.
//
// Protocol, per forward pass, for i = 0..L−1 in order:
//
//   DevicePtr w = acquire(i, compute)   // compute waits until layer i is loaded
//   ... enqueue layer i's kernels on `compute`, reading w ...
//   release(i, compute)                 // once those kernels end, reload the slot
//
// acquire makes `compute` wait the slot's "loaded" event and returns the
// slot's address; release records the slot's "consumed" event on `compute`,
// makes the copy stream wait it, copies layer (i + K) mod L into the slot and
// records the slot's "loaded" event. create() prefetches layers 0..K−1.
// Layers cycle through the slots in acquisition order: the n-th acquisition
// since create() (counting across passes) uses slot n mod K, which is i mod K
// when K divides L. Up to K layers may be held (acquired, not yet released)
// at once; acquisitions and releases each go in layer order, wrapping from
// L−1 to 0. Anything else — a layer ≥ L, acquiring out of order or with all
// K slots held, releasing a layer that is not the oldest held — is EINVAL
// naming the layer and what was expected, and changes nothing. A device call
// that fails midway leaves the slots in an unknown state: the streamer then
// refuses every later acquire/release (EIO, naming the first failure).
//
// Bandwidth (Nova). A pass starting with layers 0..K−1 loaded hides every
// copy when
//
//   B ≥ S/T · (L−K)/(L−2)
//
// (B the host→device link's bytes per second, T one layer's compute time):
// the L−K copies of layers K..L−1 run back to back on the one copy engine
// from the end of layer 0's compute (the first slot to free) and the last
// must land before layer L−2's compute ends, a window of (L−2)·T. Below the
// bound the pass is longer by (L−K)·S/B − (L−2)·T (check_bandwidth's
// slowdown). The bound leaves out the reload of layers 0..K−1 for the next
// pass (issued by the last K releases): it must finish in the gap between
// passes. Passes issued back to back with no gap move every layer once per
// L·T and need B ≥ S/T (back_to_back_bytes_per_s). K = 2 makes the two
// bounds equal.
//
// Thread-safety: every method locks one mutex; the streamer may be shared,
// but the protocol is one ordered sequence, so one engine thread drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "gpu/device.h"

namespace tandem::gpu {

// The most layers one streamer takes (WEIGHT_MODULE's layers is 16-bit too).
inline constexpr std::uint32_t kMaxLayers = 65535;

struct LayerStreamerConfig {
  std::uint32_t layers = 0;       // L, 3..kMaxLayers
  std::uint32_t slots = 0;        // K, 2 ≤ K < L
  std::uint64_t layer_bytes = 0;  // S > 0
  double layer_compute_s = 0;     // T > 0: one layer's compute time
  double link_bytes_per_s = 0;    // B; 0: the device's h2d_bytes_per_s()
};

// Where a streamer's warnings go (the bandwidth check at create, a failed
// release at teardown); empty: nowhere. tandem_gpu stays free of a logging
// library: libtandem passes stderr, a daemon would pass its logger.
using WarningSink = std::function<void(std::string_view)>;

struct StreamerBandwidth {
  // S/T · (L−K)/(L−2): the least B that hides the copies of one pass.
  double required_bytes_per_s = 0;
  // S/T: the least B that hides them when passes run back to back.
  double back_to_back_bytes_per_s = 0;
  bool ok = false;  // B ≥ required_bytes_per_s
  // How much longer a pass takes than L·T when !ok: (L−K)·S/B − (L−2)·T
  // (infinite when B is 0); 0 when ok.
  double slowdown_s_per_pass = 0;
};

// The Nova bandwidth check (see the file comment). Pure. K ≥ L streams
// nothing (required 0, ok). Outside the protocol's range — L < 3, K < 2,
// T ≤ 0 with S > 0, or a NaN/negative input — no copy can be hidden:
// required and slowdown are infinite and ok is false.
StreamerBandwidth check_bandwidth(std::uint64_t layer_bytes, double layer_compute_s, std::uint32_t layers,
                                  std::uint32_t slots, double link_bytes_per_s);

class LayerStreamer {
 public:
  // Allocates K device slots of S bytes, L pinned host copies of
  // `host_layers` (copied now: the caller may free them on return), one
  // plain copy stream at the lowest priority and two events per slot, then
  // prefetches layers 0..K−1. EINVAL naming the field for a bad config or a
  // host_layers span that is not L non-null pointers; a failed device call
  // propagates, with everything created so far released. Warns (`warn`)
  // naming the numbers when check_bandwidth fails.
  static base::Result<std::unique_ptr<LayerStreamer>> create(DeviceApi& device, LayerStreamerConfig config,
                                                             std::span<const void* const> host_layers,
                                                             WarningSink warn = {});
  // Waits for the copy stream, then releases every stream, event and buffer.
  // Errors are logged, never thrown.
  ~LayerStreamer();
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  // The slot holding `layer` once `compute` reaches this point.
  base::Result<DevicePtr> acquire(std::uint32_t layer, StreamId compute);
  // `layer`'s kernels are enqueued on `compute`; refill its slot after them.
  base::Result<void> release(std::uint32_t layer, StreamId compute);
  // Blocks until every copy issued so far is complete (stream_synchronize of
  // the copy stream).
  base::Result<void> synchronize();

  const LayerStreamerConfig& config() const { return config_; }  // B resolved
  StreamerBandwidth bandwidth() const { return bandwidth_; }
  std::uint64_t device_bytes() const;  // K·S, resident
  std::uint64_t freed_bytes() const;   // (L−K)·S, handed to the KV cache
  StreamId copy_stream() const { return copy_stream_; }
  // The layer the next acquire() expects, and how many layers are held.
  std::uint32_t next_layer() const;
  std::uint32_t held() const;

 private:
  LayerStreamer(DeviceApi& device, LayerStreamerConfig config);
  base::Result<void> fail(base::Error e);  // poisons the streamer
  base::Result<void> check_usable() const;

  DeviceApi& device_;
  const LayerStreamerConfig config_;
  WarningSink warn_;
  StreamerBandwidth bandwidth_;
  mutable std::mutex mu_;
  std::vector<void*> host_;        // L pinned copies
  std::vector<DevicePtr> slots_;   // K
  std::vector<EventId> loaded_;    // per slot: the slot's copy is complete
  std::vector<EventId> consumed_;  // per slot: the compute reading it is complete
  StreamId copy_stream_ = 0;
  bool have_copy_stream_ = false;
  std::uint64_t acquired_ = 0;  // acquisitions since create (the next one's sequence number)
  std::uint64_t released_ = 0;  // releases since create
  std::optional<base::Error> failed_;
};

}  // namespace tandem::gpu
