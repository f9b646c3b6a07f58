"""tandem: Python binding of libtandem, the client library of tandemd.

A thin ctypes layer over the C ABI in libclient/include/tandem/tandem.h and
tandem_gpu.h (docs/python.md): the same handles, calls and fail-open
behaviour, with Python types at the edge.

    import tandem
    with tandem.Engine(block_size=16, total_blocks=4096, max_seqs=256, token_budget=8192) as eng:
        sid = tandem.session_id("s1")
        eng.round_submit(sid, 0, prompt_tokens=1200)
        for d in eng.poll(timeout_ms=5):
            ...
        if eng.session_runnable(sid):
            ...

Errors: a call the C library fails (a negative errno) raises TandemError,
an OSError whose errno is that value and whose message is
tandem_last_error()'s (tandem_gpu_last_error()'s for Gpu and
LayerStreamer); for ETIMEDOUT it is TandemTimeoutError, also a
TimeoutError. Arguments this layer cannot pass to C (a negative
count, a value beyond the C type, a string with a NUL byte) raise TandemError
with EINVAL before any C call.

Sessions: wherever a call takes a session, an int is the id and a str is a
session name (hashed with session_id()). Tool kinds likewise.

GPU plane: Gpu(engine, backend=...) opens the green-context pool,
LayerStreamer(gpu, host_layers, ...) streams a module's layers through K
device slots; Engine.gpu_profile() / weight_module() / offload_plan() are the
engine's GPU records. Closing a handle first closes what depends on it (an
Engine its Gpu, a Gpu its streamers), as C requires.

Thread-safety: as in C, a handle is used by one thread at a time; different
handles are independent (a Gpu and its streamers count as its engine's). ctypes releases the GIL inside every C call, so
poll() with a timeout does not block other Python threads.

The library is found through $TANDEM_LIBRARY (a full path), else
ctypes.util.find_library("tandem"), else "libtandem.so.1"; it is loaded on
the first call that needs it.
"""

import collections
import ctypes
import enum
import errno
import numbers
import os
import time

from . import _ffi

__all__ = [
    "API_VERSION",
    "TandemError",
    "TandemTimeoutError",
    "Engine",
    "Runner",
    "Directive",
    "DirectiveType",
    "KvEventKind",
    "KvBlocksOp",
    "KvMedium",
    "CloseReason",
    "RequestPhase",
    "KeepDecision",
    "ToolExitReason",
    "ToolFlags",
    "ToolResult",
    "ToolInfo",
    "StepRequest",
    "PinnedKV",
    "Chunk",
    "StepPlan",
    "session_id",
    "tool_kind",
    "GPU_MAX_STAGES",
    "GPU_MAX_PARTITIONS",
    "GpuStageKind",
    "ProfileRow",
    "OffloadPlan",
    "GpuInfo",
    "StreamerInfo",
    "Gpu",
    "LayerStreamer",
]

# TANDEM_API_VERSION of the header this binding mirrors.
API_VERSION = 1

# tandem_gpu.h's bounds: stages per pool, partitions per pool.
GPU_MAX_STAGES = _ffi.GPU_MAX_STAGES
GPU_MAX_PARTITIONS = _ffi.GPU_MAX_PARTITIONS


class TandemError(OSError):
    """A libtandem call failed: errno is the positive error code, strerror
    the library's message (tandem_last_error()) or the code's description."""

    def __init__(self, code, message):
        super().__init__(code, message)


class TandemTimeoutError(TandemError, TimeoutError):
    """A libtandem call failed with ETIMEDOUT (Runner.tool_wait(): the tool
    is still running). Caught by `except TimeoutError` as well."""


def _error(code, message):
    return (TandemTimeoutError if code == errno.ETIMEDOUT else TandemError)(code, message)


class DirectiveType(enum.IntEnum):
    ADMIT = 32  # the session's rounds may run
    PAUSE = 33  # hold the session's next round
    RESTORE = 34  # run it again, on engine `value` (a client id)
    PRIORITY = 35  # MLFQ level `value`, 0 = highest
    PIN = 36  # hold its KV until `value` (CLOCK_MONOTONIC ns)
    UNPIN = 37
    DROP = 38  # free its KV now
    OFFLOAD = 39  # copy its KV to host memory
    PREFETCH = 40  # bring an offloaded KV back
    CLOSE = 41  # the session is over (its runner closed it, an operator killed it): free its KV


class KvEventKind(enum.IntEnum):
    EVICTED = 1
    RESTORED = 2
    OFFLOADED = 3
    DROPPED = 4


class KvBlocksOp(enum.IntEnum):
    STORED = 1
    REMOVED = 2


class KvMedium(enum.IntEnum):
    GPU = 0
    CPU = 1


class CloseReason(enum.IntEnum):
    NORMAL = 0
    ERROR = 1
    CANCELLED = 2


class RequestPhase(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2


class KeepDecision(enum.IntEnum):
    RELEASE = 0
    PIN = 1
    OFFLOAD = 2
    DROP = 3


class ToolExitReason(enum.IntEnum):
    """Why a tool call ended (enum tandem_tool_exit_reason)."""

    EXITED = 0  # it exited by itself (exit_code >= 0)
    SIGNALED = 1  # a signal tandem did not send
    OOM_KILLED = 2  # the kernel's OOM killer, at its memory_max
    KILLED_MEMORY = 3  # tandemd: stalled at its memory limit too long
    KILLED_POLICY = 4  # tandemd: the scheduling policy
    KILLED_SESSION = 5  # tandemd: its session ended, or an operator killed it


class ToolFlags(enum.IntFlag):
    """How a tool runs (enum tandem_tool_flags): ToolResult.flags, ToolInfo.flags."""

    UNPLACED = 1  # started without a cgroup (tool_spawn(..., allow_unplaced=True))
    CGROUP_NS = 2  # in a cgroup namespace of its own: its cgroup is its root
    UID_CHANGED = 4  # runs as tool_spawn's uid/gid
    DAEMON_LOST = 8  # tandemd went away while it ran (the result may lack its reason)


# One directive from the daemon. `type` is a DirectiveType (a plain int for
# a type this binding does not know).
Directive = collections.namedtuple("Directive", ["type", "session", "value"])

# One request of an engine step (tandem_step_request); the last nine fields
# default to 0 / False.
StepRequest = collections.namedtuple(
    "StepRequest",
    [
        "id",
        "session",
        "round",
        "phase",
        "prompt_tokens",
        "max_output_tokens",
        "computed_tokens",
        "output_tokens",
        "cached_tokens",
        "blocks_held",
        "arrival_ns",
        "last_scheduled_ns",
        "priority",
        "last_round",
    ],
    defaults=(0, 0, 0, 0, 0, 0, 0, 0, False),
)

# A session whose KV is pinned (tandem_pinned_kv).
PinnedKV = collections.namedtuple("PinnedKV", ["session", "blocks", "pinned_at_ns", "until_ns"])

# tandem_chunk: run `tokens` of requests[request] this step.
Chunk = collections.namedtuple("Chunk", ["request", "tokens"])

# What plan_step() decided: chunks to run, request indices to preempt,
# sessions whose pins to release.
StepPlan = collections.namedtuple("StepPlan", ["run", "preempt", "unpin", "swap"])

# How a tool call started by Runner.tool_spawn() ended (tandem_tool_result).
# exit_code: >= 0 the exit status, < 0 minus the signal; reason: a
# ToolExitReason (a plain int for one this binding does not know);
# cgroup_id: 0 if the tool ran without a cgroup (allow_unplaced); message:
# what happened, for reasons other than EXITED ("" otherwise); flags: ToolFlags.
ToolResult = collections.namedtuple(
    "ToolResult",
    ["exit_code", "reason", "wall_ns", "cpu_ns", "peak_memory_bytes", "cgroup_id", "message", "flags"],
    defaults=(0,),
)

# How a running tool was started (tandem_tool_info): its session, its cgroup
# (0: unplaced), ToolFlags, and the uid and gid it runs as.
ToolInfo = collections.namedtuple("ToolInfo", ["session", "cgroup_id", "flags", "uid", "gid"])

class GpuStageKind(enum.IntEnum):
    """The stage a Nova profile describes (enum tandem_gpu_stage_kind)."""

    DECODE = 0
    PREFILL = 1


# One row of a stage's Nova profile (tandem_profile_row): with `sm_count`
# SMs a step takes `latency_s` seconds and does `throughput` work per second.
ProfileRow = collections.namedtuple("ProfileRow", ["sm_count", "latency_s", "throughput"])


class OffloadPlan(collections.namedtuple("OffloadPlan", ["plan", "freed_bytes"])):
    """The daemon's offload plan (tandem_offload_plan): bit i of `plan` asks
    for weight module i to be offloaded, which frees `freed_bytes` of device
    memory. 0 and 0 while not connected."""

    __slots__ = ()

    @property
    def modules(self):
        """The indices of the modules to offload, ascending."""
        return [i for i in range(64) if self.plan >> i & 1]


# A green-context pool (tandem_gpu_info). decode_sms: the decode stage's SMs
# per partition (a tuple of n_partitions values, strictly increasing).
GpuInfo = collections.namedtuple(
    "GpuInfo",
    [
        "device_name",
        "ordinal",
        "device_sms",
        "total_memory",
        "n_stages",
        "n_partitions",
        "active_partition",
        "switches",
        "bad_indices",
        "decode_sms",
    ],
)

# A layer streamer (tandem_streamer_info); `hidden` is a bool.
StreamerInfo = collections.namedtuple(
    "StreamerInfo",
    [
        "layers",
        "slots",
        "layer_bytes",
        "device_bytes",
        "freed_bytes",
        "link_bytes_per_s",
        "required_bytes_per_s",
        "back_to_back_bytes_per_s",
        "slowdown_s_per_pass",
        "hidden",
        "next_layer",
    ],
)

_LIMITS = {
    "u8": (0, 2**8 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
}


def _int(name, value, kind):
    """`value` checked to fit the C type `kind`; TandemError(EINVAL) if not."""
    if isinstance(value, enum.IntEnum):
        value = int(value)
    if not isinstance(value, int):
        raise TandemError(errno.EINVAL, f"{name}: expected an integer, got {type(value).__name__}")
    lo, hi = _LIMITS[kind]
    if not lo <= value <= hi:
        raise TandemError(errno.EINVAL, f"{name}: {value} is out of range [{lo}, {hi}]")
    return value


def _float(name, value):
    """A real number as a C double; TandemError(EINVAL) if not one."""
    if not isinstance(value, numbers.Real):
        raise TandemError(errno.EINVAL, f"{name}: expected a number, got {type(value).__name__}")
    return float(value)


def _sequence(name, value):
    """`value` as a list if it is a sequence of items (not a string)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TandemError(errno.EINVAL, f"{name}: expected a sequence, got {type(value).__name__}")
    return list(value)


def _bytes(name, value, allow_none=False):
    """A str (UTF-8) or bytes as a C string; None stays NULL if allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes):
        raise TandemError(errno.EINVAL, f"{name}: expected a string, got {type(value).__name__}")
    if b"\0" in value:
        raise TandemError(errno.EINVAL, f"{name}: contains a NUL byte")
    return value


def _path(name, value, allow_none=False):
    """A str, bytes or os.PathLike as a C string (see _bytes)."""
    if value is not None and not isinstance(value, (str, bytes)):
        try:
            value = os.fspath(value)
        except TypeError:
            pass  # _bytes names the type
    return _bytes(name, value, allow_none)


def _string_array(name, items):
    """A NULL-terminated char*[] of `items` (strs, bytes or paths)."""
    items = [_path(f"{name}[{i}]", item) for i, item in enumerate(items)]
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def _fd(name, value):
    """A stdio argument of tool_spawn() as the C int: None is 0 (inherit);
    an int is the fd; anything else must have fileno()."""
    if value is None:
        return 0
    if not isinstance(value, int) and hasattr(value, "fileno"):
        value = value.fileno()
    if isinstance(value, bool):
        raise TandemError(errno.EINVAL, f"{name}: expected a file descriptor, got bool")
    value = _int(name, value, "i32")
    if value == 0 and name != "stdin":
        # C reads 0 as "inherit the caller's": the tool would not get fd 0.
        raise TandemError(errno.EINVAL, f"{name}: fd 0 means 'inherit' in tandem_tool_options; pass os.dup(0)")
    return value


def session_id(name):
    """The session id for `name`: xxh64 of its UTF-8 bytes, never 0."""
    return _ffi.load().tandem_session_id(_bytes("name", name))


def tool_kind(name):
    """The tool-kind id for a tool name: xxh64, never 0."""
    return _ffi.load().tandem_tool_kind(_bytes("name", name))


def _session(value, name="session"):
    if isinstance(value, (str, bytes)):
        return session_id(value)
    return _int(name, value, "u64")


def _tool_kind(value):
    if isinstance(value, (str, bytes)):
        return tool_kind(value)
    return _int("tool_kind", value, "u64")


def _options(runtime_dir, name, fallback_cap, reconnect_min_ms, reconnect_max_ms):
    if runtime_dir is not None:
        runtime_dir = os.fspath(runtime_dir)
    return _ffi.Options(
        runtime_dir=_bytes("runtime_dir", runtime_dir, allow_none=True),
        name=_bytes("name", name, allow_none=True),
        fallback_cap=_int("fallback_cap", fallback_cap, "u32"),
        reconnect_min_ms=_int("reconnect_min_ms", reconnect_min_ms, "u32"),
        reconnect_max_ms=_int("reconnect_max_ms", reconnect_max_ms, "u32"),
    )


class _Closing:
    """close() on leaving a ``with`` block and on collection; subclasses
    define close() (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the module may be half gone
            pass


class _Client(_Closing):
    """What engine and runner handles share. Not thread-safe (one thread at
    a time per handle, as in C)."""

    _role = "client"

    def __init__(self):
        self._dependents = []  # _Handles closed before this one (an engine's Gpu)
        self._lib = _ffi.load()
        self._handle = ctypes.c_void_p()
        self._directives = None  # reused poll() buffer

    def _open_failed(self, rc, what):
        # No handle exists after a failed open, so there is no last_error.
        raise _error(-rc, f"{what}: {os.strerror(-rc)}")

    def _h(self):
        if not self._handle:
            raise TandemError(errno.EBADF, f"this {self._role} handle is closed")
        return self._handle

    def _check(self, rc, what):
        if rc >= 0:
            return rc
        message = self.last_error() or os.strerror(-rc)
        raise _error(-rc, f"{what}: {message}" if not message.startswith(what) else message)

    # ---- lifetime -------------------------------------------------------

    def close(self):
        """Closes the connection and frees the handle; idempotent. A Gpu
        opened with this handle is closed first (C requires it)."""
        for dep in reversed(self._dependents[:]):
            dep.close()
        handle, self._handle = self._handle, ctypes.c_void_p()
        if handle:
            self._lib.tandem_close(handle)

    @property
    def closed(self):
        return not self._handle

    # ---- state ----------------------------------------------------------

    def connected(self):
        """True if welcomed by the daemon now, False while running fail-open."""
        return bool(self._lib.tandem_connected(self._h()))

    def client_id(self):
        """The daemon's id for this client; 0 while never connected."""
        return self._lib.tandem_client_id(self._h())

    def last_error(self):
        """The message of the last failed call on this handle ("" if none)."""
        if not self._handle:
            return ""
        msg = self._lib.tandem_last_error(self._handle)
        return msg.decode(errors="replace") if msg else ""

    def stats(self):
        """The handle's counters as a dict (tandem_client_stats)."""
        s = _ffi.ClientStats()
        self._check(self._lib.tandem_get_stats(self._h(), ctypes.byref(s)), "tandem_get_stats")
        return {name: getattr(s, name) for name, _ in _ffi.ClientStats._fields_ if name != "sz"}

    # ---- either role ----------------------------------------------------

    def session_name(self, session, name):
        """Tells the daemon the name behind `session` (shown by tandemctl)."""
        self._check(
            self._lib.tandem_session_name(self._h(), _session(session), _bytes("name", name)), "tandem_session_name"
        )

    def poll(self, timeout_ms=0, max=64):  # noqa: A002 (mirrors the C parameter)
        """Drives the connection and returns the directives received since the
        last call (at most `max`), waiting up to `timeout_ms` for one when none
        is queued. The library has already applied them to session_runnable()
        and session_priority(). Call it at least once per engine step."""
        timeout_ms = _int("timeout_ms", timeout_ms, "i32")
        max = _int("max", max, "i32")
        if timeout_ms < 0:
            raise TandemError(errno.EINVAL, f"timeout_ms: {timeout_ms} is negative")
        if max < 0:
            raise TandemError(errno.EINVAL, f"max: {max} is negative")
        if max == 0:
            buf = None
        else:
            if self._directives is None or len(self._directives) < max:
                self._directives = (_ffi.CDirective * max)()
            buf = self._directives
        n = self._check(self._lib.tandem_poll(self._h(), timeout_ms, max, buf), "tandem_poll")
        out = []
        for i in range(min(n, max)):
            d = buf[i]
            try:
                kind = DirectiveType(d.type)
            except ValueError:
                kind = d.type
            out.append(Directive(kind, d.session, d.value))
        return out

    def __repr__(self):
        state = "closed" if self.closed else ("connected" if self.connected() else "fail-open")
        return f"<tandem.{type(self).__name__} {state}>"


class Engine(_Client):
    """An inference engine's handle (tandem_engine_open). Usable at once,
    connected or not (fail-open)."""

    _role = "engine"

    def __init__(
        self,
        runtime_dir=None,
        name=None,
        gpu_index=-1,
        block_size=0,
        total_blocks=0,
        max_seqs=0,
        token_budget=0,
        saturating_tokens=0,
        max_model_len=0,
        fallback_cap=0,
        reconnect_min_ms=0,
        reconnect_max_ms=0,
    ):
        super().__init__()
        opts = _options(runtime_dir, name, fallback_cap, reconnect_min_ms, reconnect_max_ms)
        self._params = _ffi.EngineParams(
            gpu_index=_int("gpu_index", gpu_index, "i32"),
            block_size=_int("block_size", block_size, "u32"),
            total_blocks=_int("total_blocks", total_blocks, "u32"),
            max_seqs=_int("max_seqs", max_seqs, "u32"),
            token_budget=_int("token_budget", token_budget, "u32"),
            saturating_tokens=_int("saturating_tokens", saturating_tokens, "u32"),
            max_model_len=_int("max_model_len", max_model_len, "u32"),
        )
        rc = self._lib.tandem_engine_open(ctypes.byref(opts), ctypes.byref(self._params), ctypes.byref(self._handle))
        if rc < 0:
            self._open_failed(rc, "tandem_engine_open")

    # ---- rounds ---------------------------------------------------------

    def round_submit(self, session, round, prompt_tokens, cached_tokens=0, projected_blocks=0, max_output_tokens=0):
        """A round of `session` entered the engine's queue; it is runnable once
        the daemon admits it (fail-open: within the local cap)."""
        r = _ffi.Round(
            round=_int("round", round, "u32"),
            prompt_tokens=_int("prompt_tokens", prompt_tokens, "u32"),
            cached_tokens=_int("cached_tokens", cached_tokens, "u32"),
            projected_blocks=_int("projected_blocks", projected_blocks, "u32"),
            max_output_tokens=_int("max_output_tokens", max_output_tokens, "u32"),
        )
        self._check(self._lib.tandem_round_submit(self._h(), _session(session), ctypes.byref(r)), "tandem_round_submit")

    def round_first_token(self, session, round, queue_delay_ns=0, prefill_ns=0):
        self._check(
            self._lib.tandem_round_first_token(
                self._h(),
                _session(session),
                _int("round", round, "u32"),
                _int("queue_delay_ns", queue_delay_ns, "u64"),
                _int("prefill_ns", prefill_ns, "u64"),
            ),
            "tandem_round_first_token",
        )

    def round_end(self, session, round, output_tokens, blocks_held, tool_follows=False):
        """The round finished with `output_tokens`; the session holds
        `blocks_held` KV blocks now; a tool call follows if `tool_follows`."""
        self._check(
            self._lib.tandem_round_end(
                self._h(),
                _session(session),
                _int("round", round, "u32"),
                _int("output_tokens", output_tokens, "u32"),
                _int("blocks_held", blocks_held, "u32"),
                1 if tool_follows else 0,
            ),
            "tandem_round_end",
        )

    def kv_stats(
        self,
        blocks_total,
        blocks_free,
        blocks_pinned=0,
        blocks_offloaded=0,
        running_seqs=0,
        waiting_seqs=0,
        step_tokens=0,
        step_time_us=0,
        block_bytes=0,
    ):
        """Reports the KV pool and the last step (tandem_kv_stats_report);
        `block_bytes`: device bytes of one KV block, 0 = unknown."""
        s = _ffi.KvStats(
            blocks_total=_int("blocks_total", blocks_total, "u32"),
            blocks_free=_int("blocks_free", blocks_free, "u32"),
            blocks_pinned=_int("blocks_pinned", blocks_pinned, "u32"),
            blocks_offloaded=_int("blocks_offloaded", blocks_offloaded, "u32"),
            running_seqs=_int("running_seqs", running_seqs, "u32"),
            waiting_seqs=_int("waiting_seqs", waiting_seqs, "u32"),
            step_tokens=_int("step_tokens", step_tokens, "u32"),
            step_time_us=_int("step_time_us", step_time_us, "u32"),
            block_bytes=_int("block_bytes", block_bytes, "u64"),
        )
        self._check(self._lib.tandem_kv_stats_report(self._h(), ctypes.byref(s)), "tandem_kv_stats_report")

    def kv_event(self, session, kind, blocks, round=0):
        """Blocks of `session` were evicted / restored / offloaded / dropped
        (`kind`: a KvEventKind)."""
        self._check(
            self._lib.tandem_kv_event(
                self._h(),
                _session(session),
                _int("kind", kind, "i32"),
                _int("blocks", blocks, "u32"),
                _int("round", round, "u32"),
            ),
            "tandem_kv_event",
        )

    def kv_blocks(self, session, op, hashes, medium=KvMedium.GPU, block_size=0, parent=None):
        """Block hashes of the prefix cache stored in or removed from `medium`
        (tandem_kv_blocks_report), published by tandemd as vLLM KV events;
        `parent`: the block before hashes[0] of a STORED chain, or None."""
        hashes = [_int("hashes", h, "u64") for h in hashes]
        arr = (ctypes.c_uint64 * max(1, len(hashes)))(*hashes)
        b = _ffi.KvBlocks(
            op=_int("op", op, "i32"),
            medium=_int("medium", medium, "i32"),
            hashes=arr,
            count=len(hashes),
            block_size=_int("block_size", block_size, "u32"),
            parent_hash=0 if parent is None else _int("parent", parent, "u64"),
            has_parent=0 if parent is None else 1,
        )
        self._check(
            self._lib.tandem_kv_blocks_report(self._h(), _session(session), ctypes.byref(b)), "tandem_kv_blocks_report"
        )

    # ---- gating ---------------------------------------------------------

    def session_runnable(self, session):
        """True if the engine may schedule the session's queued round now."""
        return bool(
            self._check(self._lib.tandem_session_runnable(self._h(), _session(session)), "tandem_session_runnable")
        )

    def session_priority(self, session):
        """The session's MLFQ level from the last PRIORITY directive (0 if none)."""
        return self._check(self._lib.tandem_session_priority(self._h(), _session(session)), "tandem_session_priority")

    # ---- in-process step scheduling ---------------------------------------

    @property
    def policy(self):
        """The name of the policy plan_step() runs now."""
        name = self._lib.tandem_engine_policy(self._h())
        return name.decode(errors="replace") if name else ""

    def plan_step(
        self,
        requests,
        free_blocks,
        pinned=(),
        now_ns=None,
        token_budget=None,
        max_seqs=None,
        block_size=None,
        max_model_len=None,
        saturating_tokens=None,
    ):
        """Plans one engine step with the daemon's policy.

        `requests`: StepRequest values (or tuples in its field order), running
        ones in running order, then waiting and preempted ones in arrival
        order. `pinned`: PinnedKV values. The step limits default to the ones
        the engine was opened with; `now_ns` to time.monotonic_ns().
        Returns a StepPlan whose chunk, preempt and swap entries index
        `requests` (swap: preempt with the KV copied to host memory first).
        """
        reqs = [r if isinstance(r, StepRequest) else StepRequest(*r) for r in requests]
        pins = [p if isinstance(p, PinnedKV) else PinnedKV(*p) for p in pinned]
        creqs = (_ffi.StepRequestC * max(len(reqs), 1))()
        for i, r in enumerate(reqs):
            c = creqs[i]
            c.id = _int("id", r.id, "u64")
            c.session = _session(r.session)
            c.round = _int("round", r.round, "u32")
            c.phase = _int("phase", r.phase, "u32")
            c.prompt_tokens = _int("prompt_tokens", r.prompt_tokens, "u32")
            c.max_output_tokens = _int("max_output_tokens", r.max_output_tokens, "u32")
            c.computed_tokens = _int("computed_tokens", r.computed_tokens, "u32")
            c.output_tokens = _int("output_tokens", r.output_tokens, "u32")
            c.cached_tokens = _int("cached_tokens", r.cached_tokens, "u32")
            c.blocks_held = _int("blocks_held", r.blocks_held, "u32")
            c.arrival_ns = _int("arrival_ns", r.arrival_ns, "i64")
            c.last_scheduled_ns = _int("last_scheduled_ns", r.last_scheduled_ns, "i64")
            c.priority = _int("priority", r.priority, "u8")
            c.last_round = 1 if r.last_round else 0
        cpins = (_ffi.PinnedKvC * max(len(pins), 1))()
        for i, p in enumerate(pins):
            c = cpins[i]
            c.session = _session(p.session)
            c.blocks = _int("blocks", p.blocks, "u32")
            c.pinned_at_ns = _int("pinned_at_ns", p.pinned_at_ns, "i64")
            c.until_ns = _int("until_ns", p.until_ns, "i64")

        def limit(name, value, default):
            return _int(name, default if value is None else value, "u32")

        inp = _ffi.StepInput(
            token_budget=limit("token_budget", token_budget, self._params.token_budget),
            max_seqs=limit("max_seqs", max_seqs, self._params.max_seqs),
            block_size=limit("block_size", block_size, self._params.block_size),
            free_blocks=_int("free_blocks", free_blocks, "u32"),
            max_model_len=limit("max_model_len", max_model_len, self._params.max_model_len),
            saturating_tokens=limit("saturating_tokens", saturating_tokens, self._params.saturating_tokens),
            requests=creqs,
            n_requests=len(reqs),
            pinned=cpins,
            n_pinned=len(pins),
            now_ns=_int("now_ns", time.monotonic_ns() if now_ns is None else now_ns, "i64"),
        )
        run = (_ffi.Chunk * max(len(reqs), 1))()
        preempt = (ctypes.c_uint32 * max(len(reqs), 1))()
        unpin = (ctypes.c_uint64 * max(len(pins), 1))()
        swap = (ctypes.c_uint32 * max(len(reqs), 1))()
        plan = _ffi.StepPlanC(run=run, preempt=preempt, unpin=unpin, swap=swap)
        self._check(
            self._lib.tandem_engine_plan_step(self._h(), ctypes.byref(inp), ctypes.byref(plan)),
            "tandem_engine_plan_step",
        )
        # The counts come from C: clamp them to the arrays we gave it.
        n_run = min(plan.n_run, len(reqs))
        n_preempt = min(plan.n_preempt, len(reqs))
        n_unpin = min(plan.n_unpin, len(pins))
        n_swap = min(plan.n_swap, len(reqs))
        return StepPlan(
            run=[Chunk(run[i].request, run[i].tokens) for i in range(n_run)],
            preempt=[preempt[i] for i in range(n_preempt)],
            unpin=[unpin[i] for i in range(n_unpin)],
            swap=[swap[i] for i in range(n_swap)],
        )

    def keep_decision(
        self, session, tool_follows, tool_kind=0, context_tokens=0, blocks=0, other_running_tokens=0, now_ns=None
    ):
        """What to do with a finished round's KV while its tool runs: returns
        (KeepDecision, until_ns); until_ns is the pin's deadline for PIN."""
        info = _ffi.RoundEndInfo(
            session=_session(session),
            tool_follows=1 if tool_follows else 0,
            tool_kind=_tool_kind(tool_kind),
            context_tokens=_int("context_tokens", context_tokens, "u32"),
            blocks=_int("blocks", blocks, "u32"),
            other_running_tokens=_int("other_running_tokens", other_running_tokens, "u32"),
            now_ns=_int("now_ns", time.monotonic_ns() if now_ns is None else now_ns, "i64"),
        )
        decision = ctypes.c_int()
        until = ctypes.c_int64()
        self._check(
            self._lib.tandem_engine_keep_decision(
                self._h(), ctypes.byref(info), ctypes.byref(decision), ctypes.byref(until)
            ),
            "tandem_engine_keep_decision",
        )
        try:
            kind = KeepDecision(decision.value)
        except ValueError:
            kind = decision.value
        return kind, until.value


    # ---- GPU plane (tandem_gpu.h) -----------------------------------------

    def gpu_profile(self, stage, rows):
        """Sends the Nova profile of stage `stage` (a GpuStageKind):
        ProfileRow values (or (sm_count, latency_s, throughput) tuples),
        1..64 of them, sm_count strictly increasing. Replaces the stage's
        previous profile; sent again after every reconnect."""
        rows = [r if isinstance(r, ProfileRow) else ProfileRow(*r) for r in _sequence("rows", rows)]
        crows = (_ffi.ProfileRowC * max(len(rows), 1))()
        for i, r in enumerate(rows):
            c = crows[i]
            c.sm_count = _int(f"rows[{i}].sm_count", r.sm_count, "u32")
            c.latency_s = _float(f"rows[{i}].latency_s", r.latency_s)
            c.throughput = _float(f"rows[{i}].throughput", r.throughput)
        self._check(
            self._lib.tandem_gpu_profile(self._h(), _int("stage", stage, "i32"), crows, len(rows)),
            "tandem_gpu_profile",
        )

    def weight_module(self, index, name, layers, slots, layer_compute_us, bytes):  # noqa: A002 (the C field)
        """Announces weight module `index` (< 64: bit `index` of the offload
        plan) that the daemon may ask to offload: `layers` layers, `slots`
        device slots when offloaded, `layer_compute_us` per layer, `bytes`
        on the device in all; `name` 1..23 printable ASCII characters.
        Replaces a module with the same index; sent again after every
        reconnect."""
        name = _bytes("name", name)
        module = _ffi.WeightModuleInfo(
            index=_int("index", index, "u32"),
            slots=_int("slots", slots, "u32"),
            layers=_int("layers", layers, "u32"),
            layer_compute_us=_int("layer_compute_us", layer_compute_us, "u32"),
            bytes=_int("bytes", bytes, "u64"),
            name=name,
        )
        self._check(self._lib.tandem_weight_module(self._h(), ctypes.byref(module)), "tandem_weight_module")

    def offload_plan(self):
        """The daemon's current OffloadPlan(plan, freed_bytes) from the status
        page; (0, 0) while not connected."""
        plan = ctypes.c_uint64()
        freed = ctypes.c_uint64()
        self._check(
            self._lib.tandem_offload_plan(self._h(), ctypes.byref(plan), ctypes.byref(freed)), "tandem_offload_plan"
        )
        return OffloadPlan(plan.value, freed.value)


class Runner(_Client):
    """An agent runtime's handle (tandem_runner_open): sessions and tools.
    Usable at once, connected or not (fail-open)."""

    _role = "runner"

    def __init__(self, runtime_dir=None, name=None, fallback_cap=0, reconnect_min_ms=0, reconnect_max_ms=0):
        super().__init__()
        opts = _options(runtime_dir, name, fallback_cap, reconnect_min_ms, reconnect_max_ms)
        rc = self._lib.tandem_runner_open(ctypes.byref(opts), ctypes.byref(self._handle))
        if rc < 0:
            self._open_failed(rc, "tandem_runner_open")

    def session_open(self, name, priority_class=0, expected_rounds=0):
        """Opens session `name` and returns its id (= session_id(name))."""
        hints = _ffi.SessionHints(
            priority_class=_int("priority_class", priority_class, "u8"),
            expected_rounds=_int("expected_rounds", expected_rounds, "u32"),
        )
        sid = ctypes.c_uint64()
        self._check(
            self._lib.tandem_session_open(self._h(), _bytes("name", name), ctypes.byref(hints), ctypes.byref(sid)),
            "tandem_session_open",
        )
        return sid.value

    def session_close(self, session, reason=CloseReason.NORMAL):
        self._check(
            self._lib.tandem_session_close(self._h(), _session(session), _int("reason", reason, "i32")),
            "tandem_session_close",
        )

    def tool_begin(self, session, tool_name, call, pid=0):
        """A tool call of `session` began; `call` is unique within the session,
        `pid` the tool's process (0 if none)."""
        self._check(
            self._lib.tandem_tool_begin(
                self._h(),
                _session(session),
                _bytes("tool_name", tool_name),
                _int("call", call, "u32"),
                _int("pid", pid, "i32"),
            ),
            "tandem_tool_begin",
        )

    def tool_end(self, session, tool_name, call, exit_code, wall_ns=None, cpu_ns=None, peak_memory_bytes=None):
        """The tool call ended. `exit_code` as from waitpid (< 0: minus the
        signal). Without any usage figure the library measures the wall time
        from tool_begin(); with any, the missing ones are 0."""
        usage = None
        if wall_ns is not None or cpu_ns is not None or peak_memory_bytes is not None:
            usage = ctypes.byref(
                _ffi.ToolUsage(
                    wall_ns=_int("wall_ns", wall_ns or 0, "u64"),
                    cpu_ns=_int("cpu_ns", cpu_ns or 0, "u64"),
                    peak_memory_bytes=_int("peak_memory_bytes", peak_memory_bytes or 0, "u64"),
                )
            )
        self._check(
            self._lib.tandem_tool_end(
                self._h(),
                _session(session),
                _bytes("tool_name", tool_name),
                _int("call", call, "u32"),
                _int("exit_code", exit_code, "i32"),
                usage,
            ),
            "tandem_tool_end",
        )

    # ---- tool processes -------------------------------------------------

    def tool_spawn(
        self,
        session,
        tool_name,
        argv,
        env=None,
        cwd=None,
        *,
        cpu_quota_us=0,
        cpu_period_us=0,
        memory_high=0,
        memory_max=0,
        pids_max=0,
        low_priority=False,
        stdin=None,
        stdout=None,
        stderr=None,
        allow_unplaced=False,
        uid=0,
        gid=0,
    ):
        """Starts a tool call of `session` (open on this handle) and returns
        the tool's pid; tool_wait() reaps it.

        tandemd creates the call's cgroup with the limits (0: its [tools]
        defaults) and the tool starts inside it, in a cgroup namespace of its
        own when this process may make one. When the tool cannot be placed
        in a cgroup (tandemd not reachable within a second, without cgroups,
        refusing) nothing is started and TandemError is raised (ENOTCONN,
        ETIMEDOUT, ENOTSUP, ...), unless `allow_unplaced`: then it starts
        without one, and tool_info() / the result say ToolFlags.UNPLACED.
        `uid`/`gid` (0: this process's): run the tool as these ids.

        `argv`: a sequence of str / bytes / paths; argv[0] is searched in
        `env`'s PATH. `env`: a mapping of the tool's whole environment, None
        to inherit this process's (os.environ as the C library sees it).
        `cwd`: None to inherit. `stdin`/`stdout`/`stderr`: None to inherit,
        an fd, or an object with fileno() (a file, a socket); the caller keeps
        them open and owns them.
        """
        if isinstance(argv, (str, bytes)) or not hasattr(argv, "__iter__"):
            raise TandemError(errno.EINVAL, f"argv: expected a sequence of strings, got {type(argv).__name__}")
        c_argv = _string_array("argv", argv)
        c_env = None
        if env is not None:
            if not hasattr(env, "items"):
                raise TandemError(errno.EINVAL, f"env: expected a mapping, got {type(env).__name__}")
            entries = []
            for key, value in env.items():
                key, value = _path("env key", key), _path(f"env[{key!r}]", value)
                if not key or b"=" in key:
                    raise TandemError(errno.EINVAL, f"env: bad variable name {key!r}")
                entries.append(key + b"=" + value)
            c_env = _string_array("env", entries)
        opts = _ffi.ToolOptions(
            cpu_quota_us=_int("cpu_quota_us", cpu_quota_us, "u32"),
            cpu_period_us=_int("cpu_period_us", cpu_period_us, "u32"),
            memory_high=_int("memory_high", memory_high, "u64"),
            memory_max=_int("memory_max", memory_max, "u64"),
            pids_max=_int("pids_max", pids_max, "u64"),
            low_priority=1 if low_priority else 0,
            stdin_fd=_fd("stdin", stdin),
            stdout_fd=_fd("stdout", stdout),
            stderr_fd=_fd("stderr", stderr),
            flags=1 if allow_unplaced else 0,
            uid=_int("uid", uid, "u32"),
            gid=_int("gid", gid, "u32"),
        )
        pid = ctypes.c_int32()
        self._check(
            self._lib.tandem_tool_spawn(
                self._h(),
                _session(session),
                _bytes("tool_name", tool_name),
                c_argv,
                c_env,
                _path("cwd", cwd, allow_none=True),
                ctypes.byref(opts),
                ctypes.byref(pid),
            ),
            "tandem_tool_spawn",
        )
        return pid.value

    def tool_wait(self, pid, timeout_ms=-1):
        """Waits up to `timeout_ms` (< 0: forever, 0: don't block) for tool
        `pid` from tool_spawn(), records its end, reaps it and returns a
        ToolResult. Raises TandemTimeoutError (a TimeoutError; errno
        ETIMEDOUT) while it is still running, and ECHILD for a pid that is
        no tool of this handle (or one already waited for)."""
        res = _ffi.ToolResultC()
        self._check(
            self._lib.tandem_tool_wait(
                self._h(), _int("pid", pid, "i32"), _int("timeout_ms", timeout_ms, "i32"), ctypes.byref(res)
            ),
            "tandem_tool_wait",
        )
        try:
            reason = ToolExitReason(res.reason)
        except ValueError:
            reason = res.reason
        return ToolResult(
            exit_code=res.exit_code,
            reason=reason,
            wall_ns=res.wall_ns,
            cpu_ns=res.cpu_ns,
            peak_memory_bytes=res.peak_memory_bytes,
            cgroup_id=res.cgroup_id,
            message=res.message.decode(errors="replace"),
            flags=ToolFlags(res.flags),
        )

    def tool_kill(self, pid):
        """Kills tool `pid` and every process of its cgroup (daemonised ones
        too); tool_wait() then reports it. ECHILD if no such tool."""
        self._check(self._lib.tandem_tool_kill(self._h(), _int("pid", pid, "i32")), "tandem_tool_kill")

    def tool_info(self, pid):
        """How running tool `pid` was started: a ToolInfo (its cgroup, 0 if
        unplaced, its ToolFlags, uid and gid). ECHILD if no such tool."""
        info = _ffi.ToolInfoC()
        self._check(
            self._lib.tandem_tool_info_get(self._h(), _int("pid", pid, "i32"), ctypes.byref(info)),
            "tandem_tool_info_get",
        )
        return ToolInfo(info.session, info.cgroup_id, ToolFlags(info.flags), info.uid, info.gid)


# ---- GPU plane (tandem_gpu.h) -------------------------------------------------


class _Handle:
    """One C handle and its destroy function, plus the handles that must be
    destroyed before it (a Gpu's streamers). Kept apart from the Python
    object that wraps it so that an owner can close it whatever the order in
    which the garbage collector finalizes the wrappers."""

    __slots__ = ("ptr", "dependents", "_destroy", "_registry")

    def __init__(self, destroy):
        self.ptr = ctypes.c_void_p()
        self.dependents = []
        self._destroy = destroy
        self._registry = None  # the owner's dependents list, once registered

    def register_with(self, registry):
        registry.append(self)
        self._registry = registry

    def close(self):
        for dep in reversed(self.dependents[:]):
            dep.close()
        ptr, self.ptr = self.ptr, ctypes.c_void_p()
        if ptr:
            self._destroy(ptr)
        registry, self._registry = self._registry, None
        if registry is not None and self in registry:
            registry.remove(self)


class _Wrapper(_Closing):
    """What Gpu and LayerStreamer share: a _Handle, context management and
    error checks against tandem_gpu_last_error() of the pool."""

    _what = "handle"

    def _h(self):
        if not self._res.ptr:
            raise TandemError(errno.EBADF, f"this {self._what} handle is closed")
        return self._res.ptr

    def _gpu_error(self):
        raise NotImplementedError

    def _check(self, rc, what):
        if rc >= 0:
            return rc
        message = self._gpu_error() or os.strerror(-rc)
        raise _error(-rc, message if message.startswith(what) else f"{what}: {message}")

    def close(self):
        """Frees the handle (and first everything that depends on it);
        idempotent."""
        res = getattr(self, "_res", None)
        if res is not None:
            res.close()

    @property
    def closed(self):
        return not self._res.ptr


class Gpu(_Wrapper):
    """A green-context pool on one device (tandem_gpu_open): one split of
    the device's SMs into partitions, each with one green context and one
    stream per stage; the engine launches a stage's kernels on stream() and
    calls begin_pass() at each forward-pass boundary.

    `engine`: an Engine (or None): the pool is announced to the daemon and
    begin_pass() follows its choice; the engine must stay open, and closing
    it closes the pool first. Options as tandem_gpu_options:

    - backend: None/"auto" (CUDA if a driver and device are there, else the
      simulated device), "cuda", or "sim"; ordinal: the CUDA device.
    - stages: stage names, 2..GPU_MAX_STAGES (None: ("prefill", "decode")).
    - partitions: explicit partitions, each a sequence of SM counts, one per
      stage in `stages` order (0: the rest); None: a generated two-stage pool
      of decode SMs decode_min_sms..decode_max_sms by decode_step_sms (0s:
      16, 64, 8).
    - full_device: append a last partition where every stage runs on all SMs.
    - stage_priorities: one stream priority per stage (None: decode -5, the
      others 0).
    - sim_sms: the simulated device's SM count (0: 132).

    Bad options raise TandemError(EINVAL) naming the field. Not thread-safe:
    one thread at a time, with its engine.
    """

    _what = "tandem_gpu"

    def __init__(
        self,
        engine=None,
        *,
        backend=None,
        ordinal=0,
        stages=None,
        partitions=None,
        decode_min_sms=0,
        decode_max_sms=0,
        decode_step_sms=0,
        full_device=False,
        stage_priorities=None,
        sim_sms=0,
    ):
        self._lib = _ffi.load()
        self._res = _Handle(self._lib.tandem_gpu_close)
        if engine is not None and not isinstance(engine, _Client):
            raise TandemError(errno.EINVAL, f"engine: expected a tandem.Engine, got {type(engine).__name__}")
        self._engine = engine  # must outlive the pool
        c_stages = None
        n_stages = 2  # C's default ("prefill", "decode")
        if stages is not None:
            names = [_bytes(f"stages[{i}]", name) for i, name in enumerate(_sequence("stages", stages))]
            n_stages = len(names)
            c_stages = (ctypes.c_char_p * max(n_stages, 1))(*names)
        c_parts = None
        n_parts = 0
        if partitions is not None:
            parts = _sequence("partitions", partitions)
            n_parts = len(parts)
            c_parts = (_ffi.GpuPartition * max(n_parts, 1))()
            for i, part in enumerate(parts):
                sms = _sequence(f"partitions[{i}]", part)
                if len(sms) > GPU_MAX_STAGES:
                    raise TandemError(
                        errno.EINVAL, f"partitions[{i}]: {len(sms)} SM counts, at most {GPU_MAX_STAGES} (one per stage)"
                    )
                for j, n in enumerate(sms):
                    c_parts[i].sms[j] = _int(f"partitions[{i}][{j}]", n, "u32")
        c_prios = None
        if stage_priorities is not None:
            prios = _sequence("stage_priorities", stage_priorities)
            # C reads one per stage: a shorter array would be read past its end.
            if len(prios) != n_stages:
                raise TandemError(
                    errno.EINVAL, f"stage_priorities: {len(prios)} values for {n_stages} stages (one per stage)"
                )
            c_prios = (ctypes.c_int32 * max(n_stages, 1))(
                *(_int(f"stage_priorities[{i}]", p, "i32") for i, p in enumerate(prios))
            )
        opts = _ffi.GpuOptions(
            backend=_bytes("backend", backend, allow_none=True),
            ordinal=_int("ordinal", ordinal, "i32"),
            stages=c_stages,
            n_stages=n_stages if stages is not None else 0,
            partitions=c_parts,
            n_partitions=n_parts,
            decode_min_sms=_int("decode_min_sms", decode_min_sms, "u32"),
            decode_max_sms=_int("decode_max_sms", decode_max_sms, "u32"),
            decode_step_sms=_int("decode_step_sms", decode_step_sms, "u32"),
            full_device=1 if full_device else 0,
            stage_priorities=c_prios,
            sim_sms=_int("sim_sms", sim_sms, "u32"),
        )
        client = engine._h() if engine is not None else None
        rc = self._lib.tandem_gpu_open(client, ctypes.byref(opts), ctypes.byref(self._res.ptr))
        if rc < 0:
            # This thread's last failed open; read before anything else can fail.
            msg = self._lib.tandem_gpu_last_error(None)
            msg = msg.decode(errors="replace") if msg else ""
            raise _error(-rc, msg or f"tandem_gpu_open: {os.strerror(-rc)}")
        if engine is not None:
            self._res.register_with(engine._dependents)

    def _gpu_error(self):
        return self.last_error()

    @property
    def engine(self):
        """The Engine the pool reports to, or None."""
        return self._engine

    @property
    def backend(self):
        """"cuda" or "sim": the backend the pool really uses."""
        return self._lib.tandem_gpu_backend(self._h()).decode()

    def last_error(self):
        """The message of the last failed call on this pool or its
        streamers ("" if none)."""
        if not self._res.ptr:
            return ""
        msg = self._lib.tandem_gpu_last_error(self._res.ptr)
        return msg.decode(errors="replace") if msg else ""

    def stage(self, name):
        """The index of stage `name`; ENOENT if the pool has none."""
        index = ctypes.c_uint32()
        self._check(
            self._lib.tandem_gpu_stage(self._h(), _bytes("name", name), ctypes.byref(index)), "tandem_gpu_stage"
        )
        return index.value

    def _stage(self, stage):
        """A stage given by index or by name, as its index."""
        if isinstance(stage, (str, bytes)):
            return self.stage(stage)
        return _int("stage", stage, "u32")

    def stream(self, stage):
        """The stream to launch stage `stage`'s kernels on now (an index or a
        name), as an int: the CUstream's address with the cuda backend
        (torch.cuda.ExternalStream(gpu.stream("decode")), cupy's
        ExternalStream), an opaque non-zero token with sim. Stable until a
        begin_pass() or set_partition() that switches."""
        stream = ctypes.c_void_p()
        self._check(
            self._lib.tandem_gpu_stream(self._h(), self._stage(stage), ctypes.byref(stream)), "tandem_gpu_stream"
        )
        return stream.value

    def context(self, stage):
        """The CUcontext of stage `stage` in the active partition (an index or
        a name), as an int: a context with the partition's SMs
        (cuCtxFromGreenCtx; the primary context on a full-device partition),
        for code that must make the partition current to create streams of
        its own. An opaque non-zero token with sim. Changes with stream()."""
        context = ctypes.c_void_p()
        self._check(
            self._lib.tandem_gpu_context(self._h(), self._stage(stage), ctypes.byref(context)), "tandem_gpu_context"
        )
        return context.value

    def begin_pass(self):
        """Call at each forward-pass boundary: switches to the partition the
        daemon chose (fail-open: the current one stays) and returns the
        partition the pass runs on. An index out of range raises ERANGE and
        keeps the partition (counted in info().bad_indices)."""
        partition = ctypes.c_uint32()
        self._check(self._lib.tandem_gpu_begin_pass(self._h(), ctypes.byref(partition)), "tandem_gpu_begin_pass")
        return partition.value

    def set_partition(self, partition):
        """Switches to `partition` now, whatever the daemon says; ERANGE if
        out of range."""
        self._check(
            self._lib.tandem_gpu_set_partition(self._h(), _int("partition", partition, "u32")),
            "tandem_gpu_set_partition",
        )

    def info(self):
        """The device and the pool as a GpuInfo."""
        i = _ffi.GpuInfoC()
        self._check(self._lib.tandem_gpu_info_get(self._h(), ctypes.byref(i)), "tandem_gpu_info_get")
        n = min(i.n_partitions, GPU_MAX_PARTITIONS)
        return GpuInfo(
            device_name=i.device_name.decode(errors="replace"),
            ordinal=i.ordinal,
            device_sms=i.device_sms,
            total_memory=i.total_memory,
            n_stages=i.n_stages,
            n_partitions=i.n_partitions,
            active_partition=i.active_partition,
            switches=i.switches,
            bad_indices=i.bad_indices,
            decode_sms=tuple(i.decode_sms[:n]),
        )

    def partition_sms(self, partition, stage):
        """The SMs stage `stage` (an index or a name) gets in partition
        `partition`; EINVAL if either is out of range."""
        sms = ctypes.c_uint32()
        self._check(
            self._lib.tandem_gpu_partition_sms(
                self._h(), _int("partition", partition, "u32"), self._stage(stage), ctypes.byref(sms)
            ),
            "tandem_gpu_partition_sms",
        )
        return sms.value

    def streamer(self, host_layers, slots, layer_compute_us, link_bytes_per_s=0.0):
        """A LayerStreamer on this pool (see there)."""
        return LayerStreamer(self, host_layers, slots, layer_compute_us, link_bytes_per_s)

    def close(self):
        """Destroys the pool's streamers, then its streams and contexts, and
        frees the handle; idempotent. Work queued on its streams must have
        finished."""
        super().close()

    def __repr__(self):
        if self.closed:
            return "<tandem.Gpu closed>"
        return f"<tandem.Gpu {self.backend} partition {self.info().active_partition}>"


def _host_buffer(name, obj, keep):
    """(address, size) of the memory of bytes-like `obj` (C-contiguous),
    for C to read during one call. `keep` gets what must stay alive until
    then. bytes and writable buffers are read in place; other read-only
    buffers are copied first (ctypes can only point into writable ones)."""
    if isinstance(obj, bytes):
        p = ctypes.c_char_p(obj)  # points into the bytes object, no copy
        keep.append(p)
        return ctypes.cast(p, ctypes.c_void_p).value, len(obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TandemError(errno.EINVAL, f"{name}: expected a bytes-like object, got {type(obj).__name__}") from None
    if not view.c_contiguous:
        raise TandemError(errno.EINVAL, f"{name}: the buffer is not C-contiguous")
    view = view.cast("B")
    n = view.nbytes
    if view.readonly:
        arr = (ctypes.c_char * n).from_buffer_copy(view)
    else:
        arr = (ctypes.c_char * n).from_buffer(view)
    keep.append(arr)
    return ctypes.addressof(arr), n


class LayerStreamer(_Wrapper):
    """Nova's layer-wise weight offload on a Gpu's device
    (tandem_streamer_create; docs/gpu.md, "Layer streamer"): a module's
    layers live in pinned host memory, `slots` (K) of them on the device.
    Per forward pass, for each layer i in order:

        ptr = s.acquire(i, stream)   # `stream` waits until layer i is loaded
        ... launch layer i's kernels on `stream`, reading weights at ptr ...
        s.release(i, stream)         # refill the slot after those kernels

    `host_layers`: one bytes-like object per layer (L >= 3 of them), all of
    the same size S > 0; copied into pinned memory during the call, so the
    caller may drop or reuse them afterwards. `layer_compute_us`: one
    layer's compute time (T); `link_bytes_per_s`: the host-to-device
    bandwidth to plan with (0: the device's rating). `stream`: an int from
    Gpu.stream() of the same Gpu.

    The Gpu must stay open: closing it destroys its streamers first. Not
    thread-safe: the Gpu's thread.
    """

    _what = "tandem_layer_streamer"

    def __init__(self, gpu, host_layers, slots, layer_compute_us, link_bytes_per_s=0.0):
        if not isinstance(gpu, Gpu):
            raise TandemError(errno.EINVAL, f"gpu: expected a tandem.Gpu, got {type(gpu).__name__}")
        self._lib = gpu._lib
        self._res = _Handle(self._lib.tandem_streamer_destroy)
        self._gpu = gpu
        layers = _sequence("host_layers", host_layers)
        keep = []
        ptrs = (ctypes.c_void_p * max(len(layers), 1))()
        layer_bytes = None
        for i, layer in enumerate(layers):
            ptrs[i], n = _host_buffer(f"host_layers[{i}]", layer, keep)
            if layer_bytes is None:
                layer_bytes = n
            elif n != layer_bytes:
                # C reads S bytes of each: a shorter one would be read past its end.
                raise TandemError(
                    errno.EINVAL,
                    f"host_layers[{i}]: {n} bytes, but host_layers[0] has {layer_bytes} (all the same size)",
                )
        opts = _ffi.StreamerOptions(
            layers=_int("layers", len(layers), "u32"),
            slots=_int("slots", slots, "u32"),
            layer_bytes=layer_bytes or 0,
            layer_compute_us=_int("layer_compute_us", layer_compute_us, "u32"),
            link_bytes_per_s=_float("link_bytes_per_s", link_bytes_per_s),
        )
        rc = self._lib.tandem_streamer_create(gpu._h(), ctypes.byref(opts), ptrs, ctypes.byref(self._res.ptr))
        del keep  # the library copied the layers
        self._check(rc, "tandem_streamer_create")
        self._res.register_with(gpu._res.dependents)

    def _gpu_error(self):
        return self._gpu.last_error()

    @property
    def gpu(self):
        return self._gpu

    @staticmethod
    def _stream(stream):
        # 0 goes to C as NULL, which names it.
        return ctypes.c_void_p(_int("stream", stream, "u64") or None)

    def acquire(self, layer, stream):
        """Makes `stream` wait until layer `layer` is in its slot and returns
        the slot's device address (a CUdeviceptr, as an int)."""
        ptr = ctypes.c_uint64()
        self._check(
            self._lib.tandem_streamer_acquire(
                self._h(), _int("layer", layer, "u32"), self._stream(stream), ctypes.byref(ptr)
            ),
            "tandem_streamer_acquire",
        )
        return ptr.value

    def release(self, layer, stream):
        """Layer `layer`'s kernels are queued on `stream`: once they end, the
        slot is refilled with layer (layer + K) mod L."""
        self._check(
            self._lib.tandem_streamer_release(self._h(), _int("layer", layer, "u32"), self._stream(stream)),
            "tandem_streamer_release",
        )

    def info(self):
        """Sizes, bandwidths and position as a StreamerInfo."""
        i = _ffi.StreamerInfoC()
        self._check(self._lib.tandem_streamer_info_get(self._h(), ctypes.byref(i)), "tandem_streamer_info_get")
        return StreamerInfo(
            layers=i.layers,
            slots=i.slots,
            layer_bytes=i.layer_bytes,
            device_bytes=i.device_bytes,
            freed_bytes=i.freed_bytes,
            link_bytes_per_s=i.link_bytes_per_s,
            required_bytes_per_s=i.required_bytes_per_s,
            back_to_back_bytes_per_s=i.back_to_back_bytes_per_s,
            slowdown_s_per_pass=i.slowdown_s_per_pass,
            hidden=bool(i.hidden),
            next_layer=i.next_layer,
        )

    def close(self):
        """Waits for the copies in flight, then frees the slots and pinned
        copies; idempotent. Kernels reading the slots must have finished."""
        super().close()

    def __repr__(self):
        if self.closed:
            return "<tandem.LayerStreamer closed>"
        i = self.info()
        return f"<tandem.LayerStreamer {i.layers} layers, {i.slots} slots>"
