// The layer streamer's C ABI (tandem_gpu.h, "layer streamer"): a
// tandem_layer_streamer wraps a gpu::LayerStreamer on a tandem_gpu's device.
// Native streams from the engine map back to the device's stream ids with
// DeviceApi::stream_for_native, so any stream the tandem_gpu created works.
//
// Like gpu_api.cc: every function is noexcept and catches everything
// (std::bad_alloc → -ENOMEM, anything else → -EIO); messages name the
// function and the field and go to the tandem_gpu's last error.
// Thread-safety: the tandem_gpu's (one thread at a time).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>

#include <fmt/format.h>

#include "gpu/layer_streamer.h"
#include "libclient/c_abi.h"
#include "libclient/gpu_handle.h"
#include "tandem/tandem_gpu.h"

namespace gpu = tandem::gpu;
using tandem::client::read_sized;
using tandem::client::run_guarded;
using tandem::client::write_sized;

struct tandem_layer_streamer {
  tandem_gpu* gpu;  // outlives the streamer (tandem_gpu.h)
  std::unique_ptr<gpu::LayerStreamer> streamer;
};

namespace {

// Runs `f` for the C function `function` on a live streamer; exceptions
// become -errno with a message on the streamer's tandem_gpu.
template <class S, class F>
int guarded(S* s, const char* function, F&& f) noexcept {
  if (s == nullptr || s->gpu == nullptr) return -EINVAL;
  return run_guarded(
      function, [&](int code, std::string message) { return s->gpu->fail(code, std::move(message)); },
      [&] { return std::forward<F>(f)(*s); });
}

// The device's stream id for the engine's native stream.
tandem::base::Result<gpu::StreamId> stream_id(tandem_gpu& g, void* stream) {
  if (stream == nullptr) {
    return tandem::base::make_error(
        EINVAL, "stream is NULL: pass a stream of this tandem_gpu (tandem_gpu_stream), not the default stream");
  }
  auto id = g.device().stream_for_native(stream);
  if (!id) {
    return tandem::base::make_error(
        EINVAL, fmt::format("stream {} is not a live stream of this tandem_gpu ({})", stream, id.error().context()));
  }
  return *id;
}

int create(tandem_gpu* gpu, const tandem_streamer_options* options, const void* const* host_layers,
           tandem_layer_streamer** ret_streamer) {
  constexpr const char* kFn = "tandem_streamer_create";
  if (gpu == nullptr) return -EINVAL;
  const auto bad = [&](const std::string& why) { return gpu->fail(EINVAL, fmt::format("{}: {}", kFn, why)); };
  if (options == nullptr) return bad("options is NULL");
  if (host_layers == nullptr) return bad("host_layers is NULL");
  if (ret_streamer == nullptr) return bad("ret_streamer is NULL");
  // A caller's sized struct: every field is required (there is no older
  // version); a newer, longer one is read up to ours.
  tandem_streamer_options o{};
  if (!read_sized(options, sizeof o, o)) {
    return bad(fmt::format("options->sz {} is too small (at least {})", options->sz, sizeof o));
  }
  if (o.reserved != 0) return bad("options->reserved must be 0");
  if (o.layer_compute_us == 0) return bad("options->layer_compute_us must be > 0");

  gpu::LayerStreamerConfig config{.layers = o.layers,
                                  .slots = o.slots,
                                  .layer_bytes = o.layer_bytes,
                                  .layer_compute_s = static_cast<double>(o.layer_compute_us) * 1e-6,
                                  .link_bytes_per_s = o.link_bytes_per_s};
  // create() checks the count against `layers` before reading any pointer.
  std::span<const void* const> layers(host_layers, o.layers);
  // A library has no logger of its own: warnings go to stderr (and
  // tandem_streamer_info_get says whether the copies are hidden).
  auto streamer = gpu::LayerStreamer::create(gpu->device(), config, layers, [](std::string_view m) {
    std::fprintf(stderr, "libtandem: warning: %.*s\n", static_cast<int>(m.size()), m.data());
  });
  if (!streamer) {
    return gpu->fail(streamer.error().code(), fmt::format("{}: {}", kFn, streamer.error().context()));
  }
  auto handle = std::make_unique<tandem_layer_streamer>();
  handle->gpu = gpu;
  handle->streamer = std::move(*streamer);
  *ret_streamer = handle.release();
  return 0;
}

}  // namespace

int tandem_streamer_create(tandem_gpu* gpu, const tandem_streamer_options* options, const void* const* host_layers,
                           tandem_layer_streamer** ret_streamer) noexcept {
  try {
    return create(gpu, options, host_layers, ret_streamer);
  } catch (const std::bad_alloc&) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

int tandem_streamer_acquire(tandem_layer_streamer* streamer, uint32_t layer, void* stream,
                            uint64_t* ret_device_ptr) noexcept {
  return guarded(streamer, "tandem_streamer_acquire", [&](tandem_layer_streamer& s) {
    tandem_gpu& g = *s.gpu;
    if (ret_device_ptr == nullptr) return g.fail(EINVAL, "tandem_streamer_acquire: ret_device_ptr is NULL");
    auto id = stream_id(g, stream);
    if (!id) return g.fail(EINVAL, fmt::format("tandem_streamer_acquire: {}", id.error().context()));
    auto ptr = s.streamer->acquire(layer, *id);
    if (!ptr) return g.fail(ptr.error().code(), fmt::format("tandem_streamer_acquire: {}", ptr.error().context()));
    *ret_device_ptr = *ptr;
    return 0;
  });
}

int tandem_streamer_release(tandem_layer_streamer* streamer, uint32_t layer, void* stream) noexcept {
  return guarded(streamer, "tandem_streamer_release", [&](tandem_layer_streamer& s) {
    tandem_gpu& g = *s.gpu;
    auto id = stream_id(g, stream);
    if (!id) return g.fail(EINVAL, fmt::format("tandem_streamer_release: {}", id.error().context()));
    auto r = s.streamer->release(layer, *id);
    if (!r) return g.fail(r.error().code(), fmt::format("tandem_streamer_release: {}", r.error().context()));
    return 0;
  });
}

int tandem_streamer_info_get(const tandem_layer_streamer* streamer, tandem_streamer_info* ret_info) noexcept {
  return guarded(streamer, "tandem_streamer_info_get", [&](const tandem_layer_streamer& s) {
    const tandem_gpu& g = *s.gpu;
    if (ret_info == nullptr) return g.fail(EINVAL, "tandem_streamer_info_get: ret_info is NULL");
    if (ret_info->sz < sizeof(std::size_t)) {
      return g.fail(EINVAL, "tandem_streamer_info_get: ret_info->sz is too small");
    }
    const gpu::LayerStreamer& ls = *s.streamer;
    const gpu::StreamerBandwidth bw = ls.bandwidth();
    tandem_streamer_info out{};
    out.sz = sizeof out;
    out.layers = ls.config().layers;
    out.slots = ls.config().slots;
    out.layer_bytes = ls.config().layer_bytes;
    out.device_bytes = ls.device_bytes();
    out.freed_bytes = ls.freed_bytes();
    out.link_bytes_per_s = ls.config().link_bytes_per_s;
    out.required_bytes_per_s = bw.required_bytes_per_s;
    out.back_to_back_bytes_per_s = bw.back_to_back_bytes_per_s;
    out.slowdown_s_per_pass = bw.slowdown_s_per_pass;
    out.hidden = bw.ok ? 1 : 0;
    out.next_layer = ls.next_layer();
    write_sized(ret_info, out);
    return 0;
  });
}

void tandem_streamer_destroy(tandem_layer_streamer* streamer) noexcept {
  delete streamer;  // the LayerStreamer waits for its copies, then frees everything
}
