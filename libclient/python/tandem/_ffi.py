"""ctypes declarations of libtandem's C ABI (libclient/include/tandem/tandem.h
and tandem_gpu.h).

Every Structure here mirrors its C struct field for field, in order, with the
same fixed-width types, so ctypes lays it out exactly as the C compiler does.
tests/python/test_tandem.py checks each size and field offset against a C++
helper compiled from the header, so the two cannot drift apart silently.

The library is loaded on first use (load()), not at import, so that
`import tandem` works on a machine without libtandem and the error names
what was tried.
"""

import ctypes
import ctypes.util
import errno
import os
import threading

c_size_t = ctypes.c_size_t
c_char_p = ctypes.c_char_p
c_double = ctypes.c_double
c_int = ctypes.c_int
c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_uint8 = ctypes.c_uint8
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_void_p = ctypes.c_void_p
POINTER = ctypes.POINTER

# tandem_gpu.h's array bounds.
GPU_MAX_STAGES = 4
GPU_MAX_PARTITIONS = 16


class _Sized(ctypes.Structure):
    """A struct whose first field is `size_t sz` = sizeof(struct)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sz = ctypes.sizeof(self)


class Options(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("runtime_dir", c_char_p),
        ("name", c_char_p),
        ("fallback_cap", c_uint32),
        ("reconnect_min_ms", c_uint32),
        ("reconnect_max_ms", c_uint32),
    ]


class EngineParams(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("gpu_index", c_int32),
        ("block_size", c_uint32),
        ("total_blocks", c_uint32),
        ("max_seqs", c_uint32),
        ("token_budget", c_uint32),
        ("saturating_tokens", c_uint32),
        ("max_model_len", c_uint32),
    ]


class ClientStats(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("connects", c_uint64),
        ("disconnects", c_uint64),
        ("records_sent", c_uint64),
        ("records_dropped", c_uint64),
        ("directives", c_uint64),
        ("resyncs", c_uint64),
        ("tools_spawned", c_uint64),
        ("tools_unplaced", c_uint64),
        ("daemon_errors", c_uint64),
        ("sessions_refused", c_uint64),
        ("tools_placed_ahead", c_uint64),
    ]


class SessionHints(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("priority_class", c_uint8),
        ("expected_rounds", c_uint32),
    ]


class ToolUsage(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("wall_ns", c_uint64),
        ("cpu_ns", c_uint64),
        ("peak_memory_bytes", c_uint64),
    ]


class ToolOptions(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("cpu_quota_us", c_uint32),
        ("cpu_period_us", c_uint32),
        ("memory_high", c_uint64),
        ("memory_max", c_uint64),
        ("pids_max", c_uint64),
        ("low_priority", c_uint8),
        ("stdin_fd", c_int),
        ("stdout_fd", c_int),
        ("stderr_fd", c_int),
        ("flags", c_uint32),
        ("uid", c_uint32),
        ("gid", c_uint32),
    ]


class ToolResultC(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("exit_code", c_int32),
        ("reason", c_int32),
        ("wall_ns", c_uint64),
        ("cpu_ns", c_uint64),
        ("peak_memory_bytes", c_uint64),
        ("cgroup_id", c_uint64),
        ("message", ctypes.c_char * 160),
        ("flags", c_uint32),
    ]


class ToolInfoC(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("session", c_uint64),
        ("cgroup_id", c_uint64),
        ("flags", c_uint32),
        ("uid", c_uint32),
        ("gid", c_uint32),
    ]


class Round(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("round", c_uint32),
        ("prompt_tokens", c_uint32),
        ("cached_tokens", c_uint32),
        ("projected_blocks", c_uint32),
        ("max_output_tokens", c_uint32),
    ]


class KvStats(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("blocks_total", c_uint32),
        ("blocks_free", c_uint32),
        ("blocks_pinned", c_uint32),
        ("blocks_offloaded", c_uint32),
        ("running_seqs", c_uint32),
        ("waiting_seqs", c_uint32),
        ("step_tokens", c_uint32),
        ("step_time_us", c_uint32),
        ("block_bytes", c_uint64),
    ]


class KvBlocks(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("op", c_int),
        ("medium", c_int),
        ("hashes", POINTER(c_uint64)),
        ("count", c_uint32),
        ("block_size", c_uint32),
        ("parent_hash", c_uint64),
        ("has_parent", c_int),
    ]


class CDirective(ctypes.Structure):
    _fields_ = [
        ("type", c_uint32),
        ("reserved", c_uint32),
        ("session", c_uint64),
        ("value", c_int64),
    ]


class StepRequestC(ctypes.Structure):
    _fields_ = [
        ("id", c_uint64),
        ("session", c_uint64),
        ("round", c_uint32),
        ("phase", c_uint32),
        ("prompt_tokens", c_uint32),
        ("max_output_tokens", c_uint32),
        ("computed_tokens", c_uint32),
        ("output_tokens", c_uint32),
        ("cached_tokens", c_uint32),
        ("blocks_held", c_uint32),
        ("arrival_ns", c_int64),
        ("last_scheduled_ns", c_int64),
        ("priority", c_uint8),
        ("last_round", c_uint8),
        ("reserved", c_uint8 * 6),
    ]


class PinnedKvC(ctypes.Structure):
    _fields_ = [
        ("session", c_uint64),
        ("blocks", c_uint32),
        ("reserved", c_uint32),
        ("pinned_at_ns", c_int64),
        ("until_ns", c_int64),
    ]


class StepInput(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("token_budget", c_uint32),
        ("max_seqs", c_uint32),
        ("block_size", c_uint32),
        ("free_blocks", c_uint32),
        ("max_model_len", c_uint32),
        ("saturating_tokens", c_uint32),
        ("requests", POINTER(StepRequestC)),
        ("n_requests", c_uint32),
        ("pinned", POINTER(PinnedKvC)),
        ("n_pinned", c_uint32),
        ("now_ns", c_int64),
    ]


class Chunk(ctypes.Structure):
    _fields_ = [
        ("request", c_uint32),
        ("tokens", c_uint32),
    ]


class StepPlanC(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("run", POINTER(Chunk)),
        ("n_run", c_uint32),
        ("preempt", POINTER(c_uint32)),
        ("n_preempt", c_uint32),
        ("unpin", POINTER(c_uint64)),
        ("n_unpin", c_uint32),
        ("swap", POINTER(c_uint32)),
        ("n_swap", c_uint32),
    ]


class RoundEndInfo(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("session", c_uint64),
        ("tool_follows", c_uint8),
        ("tool_kind", c_uint64),
        ("context_tokens", c_uint32),
        ("blocks", c_uint32),
        ("other_running_tokens", c_uint32),
        ("now_ns", c_int64),
    ]


# ---- tandem_gpu.h ----------------------------------------------------------


class GpuPartition(ctypes.Structure):
    _fields_ = [
        ("sms", c_uint32 * GPU_MAX_STAGES),
    ]


class GpuOptions(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("backend", c_char_p),
        ("ordinal", c_int32),
        ("stages", POINTER(c_char_p)),
        ("n_stages", c_uint32),
        ("partitions", POINTER(GpuPartition)),
        ("n_partitions", c_uint32),
        ("decode_min_sms", c_uint32),
        ("decode_max_sms", c_uint32),
        ("decode_step_sms", c_uint32),
        ("full_device", c_uint8),
        ("stage_priorities", POINTER(c_int32)),
        ("sim_sms", c_uint32),
    ]


class GpuInfoC(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("device_name", ctypes.c_char * 96),
        ("ordinal", c_int32),
        ("device_sms", c_uint32),
        ("total_memory", c_uint64),
        ("n_stages", c_uint32),
        ("n_partitions", c_uint32),
        ("active_partition", c_uint32),
        ("reserved0", c_uint32),
        ("switches", c_uint64),
        ("bad_indices", c_uint64),
        ("decode_sms", c_uint32 * GPU_MAX_PARTITIONS),
    ]


class ProfileRowC(ctypes.Structure):
    _fields_ = [
        ("sm_count", c_uint32),
        ("reserved", c_uint32),
        ("latency_s", c_double),
        ("throughput", c_double),
    ]


class WeightModuleInfo(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("index", c_uint32),
        ("slots", c_uint32),
        ("layers", c_uint32),
        ("layer_compute_us", c_uint32),
        ("bytes", c_uint64),
        ("name", c_char_p),
    ]


class StreamerOptions(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("layers", c_uint32),
        ("slots", c_uint32),
        ("layer_bytes", c_uint64),
        ("layer_compute_us", c_uint32),
        ("reserved", c_uint32),
        ("link_bytes_per_s", c_double),
    ]


class StreamerInfoC(_Sized):
    _fields_ = [
        ("sz", c_size_t),
        ("layers", c_uint32),
        ("slots", c_uint32),
        ("layer_bytes", c_uint64),
        ("device_bytes", c_uint64),
        ("freed_bytes", c_uint64),
        ("link_bytes_per_s", c_double),
        ("required_bytes_per_s", c_double),
        ("back_to_back_bytes_per_s", c_double),
        ("slowdown_s_per_pass", c_double),
        ("hidden", c_uint32),
        ("next_layer", c_uint32),
    ]


# Every struct the tests compare with the C layout, by its C name.
STRUCTS = {
    "tandem_options": Options,
    "tandem_engine_params": EngineParams,
    "tandem_client_stats": ClientStats,
    "tandem_session_hints": SessionHints,
    "tandem_tool_usage": ToolUsage,
    "tandem_tool_options": ToolOptions,
    "tandem_tool_result": ToolResultC,
    "tandem_tool_info": ToolInfoC,
    "tandem_round": Round,
    "tandem_kv_stats": KvStats,
    "tandem_kv_blocks": KvBlocks,
    "tandem_directive": CDirective,
    "tandem_step_request": StepRequestC,
    "tandem_pinned_kv": PinnedKvC,
    "tandem_step_input": StepInput,
    "tandem_chunk": Chunk,
    "tandem_step_plan": StepPlanC,
    "tandem_round_end_info": RoundEndInfo,
    "tandem_gpu_partition": GpuPartition,
    "tandem_gpu_options": GpuOptions,
    "tandem_gpu_info": GpuInfoC,
    "tandem_profile_row": ProfileRowC,
    "tandem_weight_module_info": WeightModuleInfo,
    "tandem_streamer_options": StreamerOptions,
    "tandem_streamer_info": StreamerInfoC,
}

_client_p = c_void_p  # tandem_client* (opaque)
_gpu_p = c_void_p  # tandem_gpu* (opaque)
_streamer_p = c_void_p  # tandem_layer_streamer* (opaque)

# name: (restype, argtypes)
_SIGNATURES = {
    "tandem_engine_open": (c_int, [POINTER(Options), POINTER(EngineParams), POINTER(_client_p)]),
    "tandem_runner_open": (c_int, [POINTER(Options), POINTER(_client_p)]),
    "tandem_close": (None, [_client_p]),
    "tandem_connected": (c_int, [_client_p]),
    "tandem_client_id": (c_uint32, [_client_p]),
    "tandem_last_error": (c_char_p, [_client_p]),
    "tandem_get_stats": (c_int, [_client_p, POINTER(ClientStats)]),
    "tandem_session_id": (c_uint64, [c_char_p]),
    "tandem_tool_kind": (c_uint64, [c_char_p]),
    "tandem_session_name": (c_int, [_client_p, c_uint64, c_char_p]),
    "tandem_session_open": (c_int, [_client_p, c_char_p, POINTER(SessionHints), POINTER(c_uint64)]),
    "tandem_session_close": (c_int, [_client_p, c_uint64, c_int]),
    "tandem_tool_begin": (c_int, [_client_p, c_uint64, c_char_p, c_uint32, c_int32]),
    "tandem_tool_end": (c_int, [_client_p, c_uint64, c_char_p, c_uint32, c_int32, POINTER(ToolUsage)]),
    "tandem_tool_spawn": (
        c_int,
        [_client_p, c_uint64, c_char_p, POINTER(c_char_p), POINTER(c_char_p), c_char_p, POINTER(ToolOptions),
         POINTER(c_int32)],
    ),
    "tandem_tool_wait": (c_int, [_client_p, c_int32, c_int, POINTER(ToolResultC)]),
    "tandem_tool_kill": (c_int, [_client_p, c_int32]),
    "tandem_tool_info_get": (c_int, [_client_p, c_int32, POINTER(ToolInfoC)]),
    "tandem_round_submit": (c_int, [_client_p, c_uint64, POINTER(Round)]),
    "tandem_round_first_token": (c_int, [_client_p, c_uint64, c_uint32, c_uint64, c_uint64]),
    "tandem_round_end": (c_int, [_client_p, c_uint64, c_uint32, c_uint32, c_uint32, c_int]),
    "tandem_kv_stats_report": (c_int, [_client_p, POINTER(KvStats)]),
    "tandem_kv_event": (c_int, [_client_p, c_uint64, c_int, c_uint32, c_uint32]),
    "tandem_kv_blocks_report": (c_int, [_client_p, c_uint64, POINTER(KvBlocks)]),
    "tandem_poll": (c_int, [_client_p, c_int, c_int, POINTER(CDirective)]),
    "tandem_session_runnable": (c_int, [_client_p, c_uint64]),
    "tandem_session_priority": (c_int, [_client_p, c_uint64]),
    "tandem_engine_plan_step": (c_int, [_client_p, POINTER(StepInput), POINTER(StepPlanC)]),
    "tandem_engine_keep_decision": (c_int, [_client_p, POINTER(RoundEndInfo), POINTER(c_int), POINTER(c_int64)]),
    "tandem_engine_policy": (c_char_p, [_client_p]),
    # tandem_gpu.h
    "tandem_gpu_open": (c_int, [_client_p, POINTER(GpuOptions), POINTER(_gpu_p)]),
    "tandem_gpu_close": (None, [_gpu_p]),
    "tandem_gpu_backend": (c_char_p, [_gpu_p]),
    "tandem_gpu_last_error": (c_char_p, [_gpu_p]),
    "tandem_gpu_stage": (c_int, [_gpu_p, c_char_p, POINTER(c_uint32)]),
    "tandem_gpu_stream": (c_int, [_gpu_p, c_uint32, POINTER(c_void_p)]),
    "tandem_gpu_context": (c_int, [_gpu_p, c_uint32, POINTER(c_void_p)]),
    "tandem_gpu_begin_pass": (c_int, [_gpu_p, POINTER(c_uint32)]),
    "tandem_gpu_set_partition": (c_int, [_gpu_p, c_uint32]),
    "tandem_gpu_info_get": (c_int, [_gpu_p, POINTER(GpuInfoC)]),
    "tandem_gpu_partition_sms": (c_int, [_gpu_p, c_uint32, c_uint32, POINTER(c_uint32)]),
    "tandem_gpu_profile": (c_int, [_client_p, c_int, POINTER(ProfileRowC), c_uint32]),
    "tandem_weight_module": (c_int, [_client_p, POINTER(WeightModuleInfo)]),
    "tandem_offload_plan": (c_int, [_client_p, POINTER(c_uint64), POINTER(c_uint64)]),
    "tandem_streamer_create": (c_int, [_gpu_p, POINTER(StreamerOptions), POINTER(c_void_p), POINTER(_streamer_p)]),
    "tandem_streamer_acquire": (c_int, [_streamer_p, c_uint32, c_void_p, POINTER(c_uint64)]),
    "tandem_streamer_release": (c_int, [_streamer_p, c_uint32, c_void_p]),
    "tandem_streamer_info_get": (c_int, [_streamer_p, POINTER(StreamerInfoC)]),
    "tandem_streamer_destroy": (None, [_streamer_p]),
}

_lock = threading.Lock()
_lib = None


def library_candidates():
    """Where load() looks, in order: $TANDEM_LIBRARY, find_library, the soname."""
    env = os.environ.get("TANDEM_LIBRARY")
    if env:
        return [env]
    found = ctypes.util.find_library("tandem")
    return [found] if found else ["libtandem.so.1"]


def load():
    """The loaded library with every function's signature declared.

    Raises OSError (errno ELIBACC) naming the path tried when it cannot be
    loaded or lacks a function of this binding.
    """
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_candidates()[0]
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(errno.ELIBACC,
                          f"cannot load libtandem from {path!r} ({e}); set TANDEM_LIBRARY to its full path") from e
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise OSError(errno.ELIBACC, f"{path} has no {name}: not the libtandem this binding expects") from e
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = lib
        return lib
