// tandem_gpu.hpp: a thin, header-only C++ wrapper over the C ABI of
// tandem_gpu.h, as tandem.hpp is over tandem.h (one wrapper header per C
// header, so an engine without a GPU plane never includes it).
//
// tandem::Gpu owns one tandem_gpu* and tandem::LayerStreamer one
// tandem_layer_streamer*; both are move-only and free their handle in the
// destructor. Methods mirror the C calls one for one and return what they
// return (0 or -errno); nothing throws. Open with Gpu::open() /
// LayerStreamer::create(), which leave `ret` untouched on failure, like the
// C calls. The engine records (tandem_gpu_profile, tandem_weight_module,
// tandem_offload_plan) are free functions on a tandem::Client.
//
// Lifetimes are C's: a Client must outlive its Gpu, a Gpu its streamers.
// Declare them in that order (Client, Gpu, LayerStreamer) and the
// destructors run in the right one.
//
// Thread-safety: that of the handles: one thread at a time per Gpu, with its
// streamers and its Client.
#ifndef TANDEM_TANDEM_GPU_HPP
#define TANDEM_TANDEM_GPU_HPP

#include <cstdint>
#include <span>
#include <utility>

#include "tandem/tandem.hpp"
#include "tandem/tandem_gpu.h"

namespace tandem {

class Gpu {
 public:
  Gpu() noexcept = default;
  // Adopts `handle` (may be nullptr).
  explicit Gpu(tandem_gpu* handle) noexcept : handle_(handle) {}
  ~Gpu() { tandem_gpu_close(handle_); }

  Gpu(Gpu&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Gpu& operator=(Gpu&& other) noexcept {
    if (this != &other) {
      tandem_gpu_close(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  // `client`: an engine handle, or nullptr for a pool the daemon does not
  // see. `options` may be nullptr (every default). On failure the message
  // is Gpu::open_error() (and the client's last_error()).
  static int open(tandem_client* client, const tandem_gpu_options* options, Gpu& ret) noexcept {
    tandem_gpu* h = nullptr;
    int r = tandem_gpu_open(client, options, &h);
    if (r == 0) ret = Gpu(h);
    return r;
  }
  static int open(Client& engine, const tandem_gpu_options* options, Gpu& ret) noexcept {
    return open(engine.get(), options, ret);
  }
  // Why this thread's last Gpu::open failed.
  static const char* open_error() noexcept { return tandem_gpu_last_error(nullptr); }

  tandem_gpu* get() const noexcept { return handle_; }
  // Gives up ownership without closing.
  [[nodiscard]] tandem_gpu* release() noexcept { return std::exchange(handle_, nullptr); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  // "cuda" or "sim".
  const char* backend() const noexcept { return tandem_gpu_backend(handle_); }
  // The last failed call on this pool or its streamers, "" if none.
  const char* last_error() const noexcept { return handle_ != nullptr ? tandem_gpu_last_error(handle_) : ""; }

  int stage(const char* name, std::uint32_t& ret_stage) const noexcept {
    return tandem_gpu_stage(handle_, name, &ret_stage);
  }
  // A CUstream with the cuda backend, an opaque token with sim.
  int stream(std::uint32_t stage, void*& ret_stream) noexcept { return tandem_gpu_stream(handle_, stage, &ret_stream); }
  int context(std::uint32_t stage, void*& ret_context) noexcept {
    return tandem_gpu_context(handle_, stage, &ret_context);
  }
  int begin_pass(std::uint32_t* ret_partition = nullptr) noexcept {
    return tandem_gpu_begin_pass(handle_, ret_partition);
  }
  int set_partition(std::uint32_t partition) noexcept { return tandem_gpu_set_partition(handle_, partition); }
  int info(tandem_gpu_info& ret) const noexcept {
    ret.sz = sizeof ret;
    return tandem_gpu_info_get(handle_, &ret);
  }
  int partition_sms(std::uint32_t partition, std::uint32_t stage, std::uint32_t& ret_sms) const noexcept {
    return tandem_gpu_partition_sms(handle_, partition, stage, &ret_sms);
  }

 private:
  tandem_gpu* handle_ = nullptr;
};

class LayerStreamer {
 public:
  LayerStreamer() noexcept = default;
  // Adopts `handle` (may be nullptr).
  explicit LayerStreamer(tandem_layer_streamer* handle) noexcept : handle_(handle) {}
  ~LayerStreamer() { tandem_streamer_destroy(handle_); }

  LayerStreamer(LayerStreamer&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  LayerStreamer& operator=(LayerStreamer&& other) noexcept {
    if (this != &other) {
      tandem_streamer_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  // `host_layers`: options.layers pointers to options.layer_bytes bytes
  // each, copied during the call. Errors: gpu.last_error().
  static int create(Gpu& gpu, const tandem_streamer_options& options, const void* const* host_layers,
                    LayerStreamer& ret) noexcept {
    tandem_layer_streamer* h = nullptr;
    int r = tandem_streamer_create(gpu.get(), &options, host_layers, &h);
    if (r == 0) ret = LayerStreamer(h);
    return r;
  }

  tandem_layer_streamer* get() const noexcept { return handle_; }
  // Gives up ownership without destroying.
  [[nodiscard]] tandem_layer_streamer* release() noexcept { return std::exchange(handle_, nullptr); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  // `stream`: from Gpu::stream() of the same pool.
  int acquire(std::uint32_t layer, void* stream, std::uint64_t& ret_device_ptr) noexcept {
    return tandem_streamer_acquire(handle_, layer, stream, &ret_device_ptr);
  }
  int release(std::uint32_t layer, void* stream) noexcept { return tandem_streamer_release(handle_, layer, stream); }
  int info(tandem_streamer_info& ret) const noexcept {
    ret.sz = sizeof ret;
    return tandem_streamer_info_get(handle_, &ret);
  }

 private:
  tandem_layer_streamer* handle_ = nullptr;
};

// ---- engine records (tandem_gpu.h), on an engine Client ----------------------

// `stage`: TANDEM_GPU_STAGE_DECODE or TANDEM_GPU_STAGE_PREFILL.
inline int gpu_profile(Client& engine, int stage, std::span<const tandem_profile_row> rows) noexcept {
  // More rows than a uint32_t counts are out of the library's range anyway.
  const auto count = rows.size() > 0xffffffffu ? 0xffffffffu : static_cast<std::uint32_t>(rows.size());
  return tandem_gpu_profile(engine.get(), stage, rows.data(), count);
}
inline int weight_module(Client& engine, const tandem_weight_module_info& module) noexcept {
  return tandem_weight_module(engine.get(), &module);
}
inline int offload_plan(Client& engine, std::uint64_t& ret_plan, std::uint64_t& ret_freed_bytes) noexcept {
  return tandem_offload_plan(engine.get(), &ret_plan, &ret_freed_bytes);
}

}  // namespace tandem

#endif  // TANDEM_TANDEM_GPU_HPP
