/* libtandem GPU plane (docs/architecture.md "GPU plane"): the engine's green-context pool, the
 * records that tell tandemd about it (partitions, stage profiles, weight
 * modules), and the daemon's answers read from the engine's status page (the
 * partition to run, the weight modules to offload).
 *
 * The daemon cannot create green contexts inside an engine, so the engine
 * opens a tandem_gpu at start-up: libtandem makes ONE split of the device's
 * SMs, pre-creates every partition's green contexts from its pieces (one per
 * stage) with one stream per (partition, stage), and switches between them by
 * index at forward-pass boundaries (tandem_gpu_begin_pass). The engine
 * launches a stage's kernels on tandem_gpu_stream(); the stream changes only
 * at tandem_gpu_begin_pass, and work stays ordered across a switch (the new
 * streams wait on events recorded on the old ones; no host sync).
 *
 * Conventions are tandem.h's: 0 or -errno, sz-versioned option structs,
 * ret_* out-parameters untouched on failure, nothing changes on error,
 * tandem_gpu_last_error() / tandem_last_error() name the problem.
 *
 * Thread-safety: a tandem_gpu is used by one thread at a time (the engine's
 * forward loop), like the tandem_client it was opened with; the client must
 * outlive it.
 */
#ifndef TANDEM_TANDEM_GPU_H
#define TANDEM_TANDEM_GPU_H

#include "tandem/tandem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tandem_gpu tandem_gpu;

/* ---- the green-context pool ------------------------------------------- */

#define TANDEM_GPU_MAX_STAGES 4
#define TANDEM_GPU_MAX_PARTITIONS 16 /* ipc::kMaxGpuPartitions */

/* One partition: the SMs each stage gets, in the order of
 * tandem_gpu_options.stages. A count must be feasible for the device's split
 * (a multiple of the block, 8 SMs on Hopper, optionally plus the split's
 * remainder: 8, 12, 16, 20, ... on an H100). 0 means "the rest": the SMs the
 * other stages leave, rounded down to a feasible count (at most one stage per
 * partition). */
typedef struct tandem_gpu_partition {
  uint32_t sms[TANDEM_GPU_MAX_STAGES];
} tandem_gpu_partition;

typedef struct tandem_gpu_options {
  size_t sz; /* sizeof(tandem_gpu_options) */
  /* NULL or "auto": CUDA when a driver and a device are there, else the
   * simulated device (only when CUDA is absent: a driver that is there and
   * fails is an error); "cuda": CUDA or fail; "sim": the simulated device. */
  const char* backend;
  int32_t ordinal; /* CUDA device ordinal, >= 0 */
  /* Stage names, 2..TANDEM_GPU_MAX_STAGES, distinct and non-empty. NULL:
   * {"prefill", "decode"}. The daemon's index contract is about the stage
   * named "decode" (partitions ordered by its SMs); without one, the last
   * stage plays that role. */
  const char* const* stages;
  uint32_t n_stages;
  /* Explicit partitions, 1..TANDEM_GPU_MAX_PARTITIONS, with the "decode"
   * stage's SMs strictly increasing. NULL (n_partitions 0): generated, see
   * below (two stages only). */
  const tandem_gpu_partition* partitions;
  uint32_t n_partitions;
  /* Generated pool (Nova / SGLang style): one partition per feasible decode
   * SM count in [decode_min_sms, decode_max_sms] that is a multiple of
   * decode_step_sms, the other stage getting the rest; 0s default to 16, 64
   * and 8. At most TANDEM_GPU_MAX_PARTITIONS (minus one with full_device). */
  uint32_t decode_min_sms;
  uint32_t decode_max_sms;
  uint32_t decode_step_sms;
  /* 1: append a last "no partition" entry where every stage runs on a plain
   * stream over all SMs (SGLang's group 0/7); its decode SMs are the
   * device's. */
  uint8_t full_device;
  /* Stream priority per stage (lower = higher, clamped to the device's
   * range, [-5, 0] on Hopper). NULL: the "decode" stage -5 (highest), the
   * others 0. */
  const int32_t* stage_priorities;
  /* Simulated backend only: the device's SM count; 0: 132 (H100/H200). */
  uint32_t sim_sms;
} tandem_gpu_options;

/* Opens the device and builds the pool (every context, every stream). With
 * an engine `client` (may be NULL) libtandem sends the daemon the partitions
 * (GpuPartitions: decode SMs per partition) now and after every reconnect,
 * and tandem_gpu_begin_pass follows the daemon's choice. Errors: -EINVAL (bad
 * options; the field is named), -EPERM (client is not an engine handle),
 * -EBUSY (client already has an open pool), -ENODEV (backend "cuda" without
 * a driver or device), -EIO (the device split or sized a context differently
 * than planned), -ENOMEM, or the driver's error; nothing is left created.
 * The message: tandem_gpu_last_error(NULL) (this thread's last failed open)
 * and, with a client, tandem_last_error(client). */
TANDEM_API int tandem_gpu_open(tandem_client* client, const tandem_gpu_options* options,
                               tandem_gpu** ret_gpu) TANDEM_NOEXCEPT;
/* Destroys every stream and context (streams first) and frees the handle
 * (NULL is ignored). Work queued on its streams must have finished. */
TANDEM_API void tandem_gpu_close(tandem_gpu* gpu) TANDEM_NOEXCEPT;
/* "cuda" or "sim": the backend this handle really uses. */
TANDEM_API const char* tandem_gpu_backend(const tandem_gpu* gpu) TANDEM_NOEXCEPT;
/* Message for the last failed call on `gpu`, "" if none; for NULL, why this
 * thread's last tandem_gpu_open failed. */
TANDEM_API const char* tandem_gpu_last_error(const tandem_gpu* gpu) TANDEM_NOEXCEPT;

/* The index of stage `name`. -ENOENT if no such stage. */
TANDEM_API int tandem_gpu_stage(const tandem_gpu* gpu, const char* name, uint32_t* ret_stage) TANDEM_NOEXCEPT;
/* The stream to launch stage `stage`'s kernels on now: a CUstream with the
 * cuda backend, an opaque non-NULL token with sim. Stable until the next
 * tandem_gpu_begin_pass that switches. -EINVAL for a bad stage. */
TANDEM_API int tandem_gpu_stream(tandem_gpu* gpu, uint32_t stage, void** ret_stream) TANDEM_NOEXCEPT;
/* The CUcontext of stage `stage` in the active partition (cuCtxFromGreenCtx:
 * a context with the partition's SMs; the primary context on a full-device
 * partition), for runtime-API code that must make the partition current
 * (cuCtxPushCurrent / cuCtxPopCurrent) to create streams of its own or run
 * library calls that use the current context. An opaque non-NULL token with
 * sim. Changes with the stream at tandem_gpu_begin_pass. -EINVAL for a bad
 * stage. */
TANDEM_API int tandem_gpu_context(tandem_gpu* gpu, uint32_t stage, void** ret_context) TANDEM_NOEXCEPT;
/* Call at each forward-pass boundary, before launching the pass: reads the
 * partition index the daemon published on the status page and switches to
 * it (the new streams wait for the old ones' queued work). While not
 * connected (fail-open) or before the daemon published anything, the current
 * partition stays; the pool starts on the last partition (the most decode
 * SMs). An index out of range keeps the current partition and returns
 * -ERANGE (counted in info.bad_indices; the engine may log and go on).
 * *ret_partition (may be NULL) gets the partition the pass runs on. */
TANDEM_API int tandem_gpu_begin_pass(tandem_gpu* gpu, uint32_t* ret_partition) TANDEM_NOEXCEPT;
/* Switches to `partition` now, whatever the daemon says (tests, engines
 * running without tandemd). -ERANGE if out of range. */
TANDEM_API int tandem_gpu_set_partition(tandem_gpu* gpu, uint32_t partition) TANDEM_NOEXCEPT;

typedef struct tandem_gpu_info {
  size_t sz;            /* sizeof the struct */
  char device_name[96]; /* NUL-terminated, truncated */
  int32_t ordinal;
  uint32_t device_sms;
  uint64_t total_memory; /* bytes */
  uint32_t n_stages;
  uint32_t n_partitions;
  uint32_t active_partition;
  uint32_t reserved0;
  uint64_t switches;                              /* partition changes so far */
  uint64_t bad_indices;                           /* begin_pass calls that saw an index out of range */
  uint32_t decode_sms[TANDEM_GPU_MAX_PARTITIONS]; /* per partition, strictly increasing; 0 past n_partitions */
} tandem_gpu_info;
TANDEM_API int tandem_gpu_info_get(const tandem_gpu* gpu, tandem_gpu_info* ret_info) TANDEM_NOEXCEPT;
/* SMs stage `stage` gets in partition `partition`. -EINVAL if out of range. */
TANDEM_API int tandem_gpu_partition_sms(const tandem_gpu* gpu, uint32_t partition, uint32_t stage,
                                        uint32_t* ret_sms) TANDEM_NOEXCEPT;

/* ---- engine records, independent of a pool ----------------------------- */

enum tandem_gpu_stage_kind { TANDEM_GPU_STAGE_DECODE = 0, TANDEM_GPU_STAGE_PREFILL = 1 };

/* One row of a stage's Nova profile: with `sm_count` SMs a step takes
 * `latency_s` and does `throughput` work per second. */
typedef struct tandem_profile_row {
  uint32_t sm_count; /* > 0 */
  uint32_t reserved;
  double latency_s;  /* finite, > 0 */
  double throughput; /* finite, >= 0 */
} tandem_profile_row;

/* Sends the profile of stage `stage` (tandem_gpu_stage_kind): `count` rows
 * (1..64), sm_count strictly increasing. Replaces the stage's previous
 * profile; remembered and sent again after a reconnect. Errors: -EPERM (not
 * an engine handle), -EINVAL (the row and field are named). */
TANDEM_API int tandem_gpu_profile(tandem_client* client, int stage, const tandem_profile_row* rows,
                                  uint32_t count) TANDEM_NOEXCEPT;

typedef struct tandem_weight_module_info {
  size_t sz;                 /* sizeof the struct */
  uint32_t index;            /* < 64: bit `index` of the offload plan */
  uint32_t slots;            /* K device slots when offloaded, 2 <= K < layers */
  uint32_t layers;           /* L, 3..65535 */
  uint32_t layer_compute_us; /* T, > 0 */
  uint64_t bytes;            /* the whole module on the device, > 0 */
  const char* name;          /* printable ASCII, 1..23 characters */
} tandem_weight_module_info;

/* Announces a weight module the daemon may ask to offload (replacing one
 * with the same index); remembered and sent again after a reconnect.
 * Errors: -EPERM (not an engine handle), -EINVAL (the field is named). */
TANDEM_API int tandem_weight_module(tandem_client* client, const tandem_weight_module_info* module) TANDEM_NOEXCEPT;

/* The daemon's current offload plan from the status page: bit i set asks
 * for weight module i to be offloaded, and *ret_freed_bytes is the device
 * memory that frees (the engine may grow its KV pool by it). 0 and 0 while
 * not connected. Either out-parameter may be NULL. -EPERM if not an engine. */
TANDEM_API int tandem_offload_plan(tandem_client* client, uint64_t* ret_plan,
                                   uint64_t* ret_freed_bytes) TANDEM_NOEXCEPT;

/* ---- layer streamer ---- */

/* Nova's layer-wise weight offload (docs/gpu.md, "Layer streamer"): a
 * module's L layers of S bytes live in pinned host memory and only K device
 * slots are resident; while layer i computes, the copy engine brings layer
 * i+K into the slot layer i frees. Per forward pass, for i = 0..L-1 in order:
 *
 *   tandem_streamer_acquire(s, i, stream, &w);  // stream waits for layer i
 *   ... launch layer i's kernels on `stream`, reading weights at w ...
 *   tandem_streamer_release(s, i, stream);      // refill the slot after them
 *
 * `stream` is a stream of the same tandem_gpu: one tandem_gpu_stream()
 * returned (a CUstream with the cuda backend, a token with sim). NULL (the
 * legacy default stream) and streams libtandem did not create are -EINVAL.
 * The stream may change between calls (after a partition switch). Up to K
 * layers may be held at once; acquires and releases each go in layer order,
 * wrapping from L-1 to 0; anything else is -EINVAL and changes nothing.
 * Errors are explained by tandem_gpu_last_error() of the tandem_gpu the
 * streamer was created on; a failed device call midway (-EIO and others)
 * leaves the streamer unusable (every later call fails, naming it).
 *
 * Thread-safety: the tandem_gpu's (one thread at a time). The tandem_gpu
 * must outlive its streamers: destroy them before tandem_gpu_close. */
typedef struct tandem_layer_streamer tandem_layer_streamer;

typedef struct tandem_streamer_options {
  size_t sz;                 /* sizeof(tandem_streamer_options) */
  uint32_t layers;           /* L, 3..65535 */
  uint32_t slots;            /* K, 2 <= K < L */
  uint64_t layer_bytes;      /* S > 0, every layer the same size */
  uint32_t layer_compute_us; /* T > 0: one layer's compute time, microseconds */
  uint32_t reserved;         /* 0 */
  double link_bytes_per_s;   /* B >= 0; 0: the device's host-to-device rating */
} tandem_streamer_options;

/* Allocates the K slots and L pinned host copies of `host_layers` (L
 * pointers to S bytes each; copied now, the caller may free them on
 * return), a copy stream and events, and starts loading layers 0..K-1. When
 * B is below the bound that hides the copies, logs a warning and succeeds
 * (tandem_streamer_info says by how much each pass slows down). Errors:
 * -EINVAL (the field is named), -ENOMEM (device or pinned memory), or the
 * device call's; nothing is left created. */
TANDEM_API int tandem_streamer_create(tandem_gpu* gpu, const tandem_streamer_options* options,
                                      const void* const* host_layers,
                                      tandem_layer_streamer** ret_streamer) TANDEM_NOEXCEPT;
/* Makes `stream` wait until layer `layer` is in its slot and gives the
 * slot's device address (a CUdeviceptr). */
TANDEM_API int tandem_streamer_acquire(tandem_layer_streamer* streamer, uint32_t layer, void* stream,
                                       uint64_t* ret_device_ptr) TANDEM_NOEXCEPT;
/* Layer `layer`'s kernels are queued on `stream`: once they end, the slot
 * is refilled with layer (layer + K) mod L. */
TANDEM_API int tandem_streamer_release(tandem_layer_streamer* streamer, uint32_t layer, void* stream) TANDEM_NOEXCEPT;

typedef struct tandem_streamer_info {
  size_t sz;                       /* sizeof the struct */
  uint32_t layers;                 /* L */
  uint32_t slots;                  /* K */
  uint64_t layer_bytes;            /* S */
  uint64_t device_bytes;           /* K*S resident on the device */
  uint64_t freed_bytes;            /* (L-K)*S not resident: room for the KV cache */
  double link_bytes_per_s;         /* B in use (the device's rating if 0 was given) */
  double required_bytes_per_s;     /* S/T * (L-K)/(L-2): hides the copies of one pass */
  double back_to_back_bytes_per_s; /* S/T: hides them with passes back to back */
  double slowdown_s_per_pass;      /* (L-K)*S/B - (L-2)*T when not hidden, else 0 */
  uint32_t hidden;                 /* 1: B >= required_bytes_per_s */
  uint32_t next_layer;             /* the layer the next acquire expects */
} tandem_streamer_info;
TANDEM_API int tandem_streamer_info_get(const tandem_layer_streamer* streamer,
                                        tandem_streamer_info* ret_info) TANDEM_NOEXCEPT;
/* Waits for the copies in flight, then frees the slots, pinned copies,
 * stream and events (NULL is ignored). Work queued on the engine's streams
 * that reads the slots must have finished. */
TANDEM_API void tandem_streamer_destroy(tandem_layer_streamer* streamer) TANDEM_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_TANDEM_GPU_H */
