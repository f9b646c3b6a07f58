/* libtandem: the client library inference engines and agent runtimes link to
 * talk to tandemd (docs/architecture.md "Wire records", "Trust model").
 *
 * Conventions
 *   - Opaque handles. Every function that can fail returns 0 or a negative
 *     errno value (-EINVAL, -ENOTCONN, ...); tandem_last_error() gives a
 *     message naming the problem for the last failed call on a handle.
 *   - Option structs start with `sz`, the caller's sizeof(struct): a struct
 *     from an older header is read up to its size, newer fields default.
 *     Out-parameters come last, are named ret_*, and are untouched on failure.
 *   - Session ids are xxh64 of the session name (tandem_session_id()); every
 *     process that knows the name derives the same id. 0 is never a session.
 *   - Times are CLOCK_MONOTONIC nanoseconds.
 *
 * Fail-open. No call blocks on the daemon beyond tandem_poll()'s timeout:
 * connecting and the handshake are non-blocking and advance inside calls.
 * While the daemon is unreachable (not started, restarting, killed) every
 * call that reports to it succeeds and is dropped, and sessions are runnable
 * under a local cap (tandem_options.fallback_cap). The library reconnects
 * with exponential backoff and, once welcomed, resyncs: it sends the
 * daemon a snapshot of its live sessions, so a restarted daemon rebuilds its
 * session table. An engine never stalls on the daemon.
 *
 * Errors are not disconnects. When tandemd refuses one request (a session
 * over its limit, a name it will not take) the library keeps the
 * connection: the call returns the error when the library can tell at once
 * (it applies the daemon's limits, sent in its Welcome), else the session is
 * marked refused and later calls on it return the daemon's error. Names are
 * 1 to 256 bytes of valid UTF-8 without control characters, on both sides:
 * -ENAMETOOLONG beyond 256 bytes, -EINVAL otherwise.
 *
 * Thread-safety: a handle is used by one thread at a time (the engine's
 * scheduling loop, the runner's event loop); different handles are
 * independent. tandem_session_id() is thread-safe.
 */
#ifndef TANDEM_TANDEM_H
#define TANDEM_TANDEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TANDEM_BUILDING_LIBRARY)
#define TANDEM_API __attribute__((visibility("default")))
#else
#define TANDEM_API
#endif

/* No function throws; C++ sees that in the type (docs/contributing.md). */
#ifdef __cplusplus
#define TANDEM_NOEXCEPT noexcept
#else
#define TANDEM_NOEXCEPT
#endif

/* Bumps on any incompatible change to this header. */
#define TANDEM_API_VERSION 1

typedef struct tandem_client tandem_client;

/* ---- connecting ------------------------------------------------------- */

typedef struct tandem_options {
  size_t sz;               /* sizeof(tandem_options) */
  const char* runtime_dir; /* NULL: $TANDEM_RUNTIME_DIR, else "/run/tandem" */
  const char* name;        /* shown in tandemctl; NULL: "<role>-<pid>" */
  /* Sessions runnable at once while the daemon is away. 0: 64. */
  uint32_t fallback_cap;
  /* First reconnect delay and its cap, milliseconds. 0: 50 and 2000. */
  uint32_t reconnect_min_ms;
  uint32_t reconnect_max_ms;
} tandem_options;

typedef struct tandem_engine_params {
  size_t sz;                  /* sizeof(tandem_engine_params) */
  int32_t gpu_index;          /* -1: none / unknown */
  uint32_t block_size;        /* tokens per KV block, > 0 */
  uint32_t total_blocks;      /* KV blocks in the pool, > 0 */
  uint32_t max_seqs;          /* running sequences per step, > 0 */
  uint32_t token_budget;      /* tokens per step, > 0 */
  uint32_t saturating_tokens; /* step size from which a step is compute-bound; 0 = unknown */
  uint32_t max_model_len;     /* longest context; 0 = unknown */
} tandem_engine_params;

/* Opens a handle for an inference engine / an agent runtime. The handle is
 * usable at once, connected or not (fail-open); the first connection attempt
 * happens inside this call. Errors: -EINVAL (bad options or params; nothing
 * is created), -ENOMEM. */
TANDEM_API int tandem_engine_open(const tandem_options* options, const tandem_engine_params* params,
                                  tandem_client** ret_client) TANDEM_NOEXCEPT;
TANDEM_API int tandem_runner_open(const tandem_options* options, tandem_client** ret_client) TANDEM_NOEXCEPT;
/* Closes the connection and frees the handle (NULL is ignored). The daemon
 * sees the client leave; a runner's sessions end with it. */
TANDEM_API void tandem_close(tandem_client* client) TANDEM_NOEXCEPT;

/* 1 if welcomed by the daemon now, 0 if running fail-open. */
TANDEM_API int tandem_connected(const tandem_client* client) TANDEM_NOEXCEPT;
/* The daemon's id for this client (engines: the id directives name in
 * RESTORE), 0 while never connected. */
TANDEM_API uint32_t tandem_client_id(const tandem_client* client) TANDEM_NOEXCEPT;
/* Message for the last failed call on `client`, "" if none. Valid until the
 * next call on the handle. */
TANDEM_API const char* tandem_last_error(const tandem_client* client) TANDEM_NOEXCEPT;

/* Counters, for logs and tests. */
typedef struct tandem_client_stats {
  size_t sz;                /* sizeof the struct */
  uint64_t connects;        /* successful handshakes */
  uint64_t disconnects;     /* connections lost */
  uint64_t records_sent;    /* ring records handed to the daemon */
  uint64_t records_dropped; /* dropped: ring and overflow full (resync flagged) or not connected */
  uint64_t directives;      /* directives received */
  uint64_t resyncs;         /* snapshots sent */
  uint64_t tools_spawned;   /* tandem_tool_spawn successes */
  uint64_t tools_unplaced;  /* ... of which started without a cgroup (TANDEM_TOOL_ALLOW_UNPLACED) */
  /* Appended (older callers' sz ends before them): */
  uint64_t daemon_errors;      /* requests tandemd refused; the connection stayed */
  uint64_t sessions_refused;   /* sessions tandemd did not take (over a limit, another runner's, ended) */
  uint64_t tools_placed_ahead; /* tandem_tool_spawn calls whose cgroup was asked ahead ([tools] ahead) */
} tandem_client_stats;
TANDEM_API int tandem_get_stats(const tandem_client* client, tandem_client_stats* ret_stats) TANDEM_NOEXCEPT;

/* ---- sessions --------------------------------------------------------- */

/* The session id for `name` (xxh64; never 0). */
TANDEM_API uint64_t tandem_session_id(const char* name) TANDEM_NOEXCEPT;
/* The tool-kind id for a tool name (xxh64; never 0). */
TANDEM_API uint64_t tandem_tool_kind(const char* name) TANDEM_NOEXCEPT;
/* Tells the daemon the name behind `session` (shown by tandemctl); sent once
 * per session and again after a reconnect. Either role. Errors: -EINVAL (a
 * name that is empty, not UTF-8, holds control characters, or does not hash
 * to `session`), -ENAMETOOLONG (over 256 bytes). */
TANDEM_API int tandem_session_name(tandem_client* client, uint64_t session, const char* name) TANDEM_NOEXCEPT;

/* ---- runner API ------------------------------------------------------- */

typedef struct tandem_session_hints {
  size_t sz;                /* sizeof the struct */
  uint8_t priority_class;   /* 0 (default) .. 3 (background) */
  uint32_t expected_rounds; /* 0 = unknown */
} tandem_session_hints;

enum tandem_close_reason { TANDEM_CLOSE_NORMAL = 0, TANDEM_CLOSE_ERROR = 1, TANDEM_CLOSE_CANCELLED = 2 };

/* Opens session `name` (hints may be NULL) and stores its id in *ret_session.
 * The session belongs to this handle: tandemd gives it to no other client,
 * keeps it (and its tools) while the connection is down, and gives it back
 * when this handle reconnects; it ends with tandem_session_close(),
 * tandem_close(), or the process's exit. Errors: -EINVAL (empty name, not
 * UTF-8 or with control characters, bad hints), -ENAMETOOLONG (name over 256
 * bytes), -EEXIST (already open on this handle), -EPERM (not a runner
 * handle), -ENOSPC (as many sessions open as the daemon's
 * limits.sessions_per_client, or 2^20 without a daemon). */
TANDEM_API int tandem_session_open(tandem_client* client, const char* name, const tandem_session_hints* hints,
                                   uint64_t* ret_session) TANDEM_NOEXCEPT;
TANDEM_API int tandem_session_close(tandem_client* client, uint64_t session, int reason) TANDEM_NOEXCEPT;
/* A tool call of `session` began / ended. `call` is unique within the
 * session; `pid` is the tool's process (0 if none). */
TANDEM_API int tandem_tool_begin(tandem_client* client, uint64_t session, const char* tool_name, uint32_t call,
                                 int32_t pid) TANDEM_NOEXCEPT;
typedef struct tandem_tool_usage {
  size_t sz; /* sizeof the struct */
  uint64_t wall_ns;
  uint64_t cpu_ns;
  uint64_t peak_memory_bytes;
} tandem_tool_usage;
/* `exit_code` as from waitpid: >= 0 exit status, < 0 minus the signal.
 * `usage` may be NULL (wall time is then measured from tandem_tool_begin). */
TANDEM_API int tandem_tool_end(tandem_client* client, uint64_t session, const char* tool_name, uint32_t call,
                               int32_t exit_code, const tandem_tool_usage* usage) TANDEM_NOEXCEPT;

/* ---- tool processes (runner API) -------------------------------------- */

/* Limits and stdio of a tool call. Zero fields mean "not set": tandemd's
 * [tools] defaults apply, and a runner's limits can only tighten them. */
typedef struct tandem_tool_options {
  size_t sz;              /* sizeof the struct */
  uint32_t cpu_quota_us;  /* CPU time per period (cgroup cpu.max); 0 = none */
  uint32_t cpu_period_us; /* 0 = 100000 */
  uint64_t memory_high;   /* bytes: throttled above this (v1: allocations stall here) */
  uint64_t memory_max;    /* bytes: the kernel's OOM killer acts above this */
  uint64_t pids_max;      /* processes and threads */
  uint8_t low_priority;   /* frozen first under memory pressure */
  int stdin_fd;           /* the tool's stdin/stdout/stderr; 0 = inherit the caller's */
  int stdout_fd;
  int stderr_fd;
  /* Appended (older callers' sz ends before them; then 0): */
  uint32_t flags; /* TANDEM_TOOL_ALLOW_UNPLACED */
  uint32_t uid;   /* run the tool as this uid (0: the runner's own); needs CAP_SETUID */
  uint32_t gid;   /* ... and this gid (0 with a uid: the uid's number; supplementary groups are dropped) */
} tandem_tool_options;

/* tandem_tool_options.flags */
enum tandem_tool_option_flags {
  /* Start the tool even when it cannot be placed in a cgroup (tandemd not
   * reachable, not answering, without cgroups, refusing): without this flag
   * tandem_tool_spawn fails instead, and nothing is started. */
  TANDEM_TOOL_ALLOW_UNPLACED = 1
};

/* How a tool runs (tandem_tool_info.flags, tandem_tool_result.flags). */
enum tandem_tool_flags {
  TANDEM_TOOL_UNPLACED = 1,    /* started without a cgroup (TANDEM_TOOL_ALLOW_UNPLACED) */
  TANDEM_TOOL_CGROUP_NS = 2,   /* in a cgroup namespace of its own: its cgroup is its root */
  TANDEM_TOOL_UID_CHANGED = 4, /* runs as tandem_tool_options.uid/gid */
  TANDEM_TOOL_DAEMON_LOST = 8  /* tandemd went away while it ran (the result may lack its reason) */
};

/* Why a tool call ended (tandem_tool_result.reason). */
enum tandem_tool_exit_reason {
  TANDEM_TOOL_EXITED = 0,        /* it exited by itself (exit_code >= 0) */
  TANDEM_TOOL_SIGNALED = 1,      /* a signal tandem did not send */
  TANDEM_TOOL_OOM_KILLED = 2,    /* the kernel's OOM killer, at its memory_max */
  TANDEM_TOOL_KILLED_MEMORY = 3, /* tandemd: stalled at its memory limit too long */
  TANDEM_TOOL_KILLED_POLICY = 4, /* tandemd: the scheduling policy */
  TANDEM_TOOL_KILLED_SESSION = 5 /* tandemd: its session ended, or an operator killed it */
};

typedef struct tandem_tool_result {
  size_t sz;         /* sizeof the struct */
  int32_t exit_code; /* >= 0 exit status, < 0 minus the signal */
  int32_t reason;    /* enum tandem_tool_exit_reason */
  uint64_t wall_ns;
  uint64_t cpu_ns;            /* of every process of the call (its cgroup), else of the tool and its waited children */
  uint64_t peak_memory_bytes; /* of its cgroup, else the largest RSS */
  uint64_t cgroup_id;         /* 0: it ran without a cgroup (TANDEM_TOOL_ALLOW_UNPLACED) */
  char message[160];          /* for reasons other than EXITED: what happened, NUL-terminated */
  /* Appended (older callers' sz ends before it): */
  uint32_t flags; /* enum tandem_tool_flags */
} tandem_tool_result;

/* A running tool, as tandem_tool_info_get() describes it. */
typedef struct tandem_tool_info {
  size_t sz; /* sizeof the struct */
  uint64_t session;
  uint64_t cgroup_id; /* 0: unplaced */
  uint32_t flags;     /* enum tandem_tool_flags */
  uint32_t uid;       /* what it runs as */
  uint32_t gid;
} tandem_tool_info;

/* Starts a tool call of `session` (open on this runner handle): tandemd
 * creates the call's cgroup with `options`' limits, and the process starts
 * directly inside it (clone3 CLONE_INTO_CGROUP; v1 hierarchies joined before
 * exec), in a cgroup namespace of its own when the runner may create one
 * (CAP_SYS_ADMIN), so that its cgroup is its root; as options->uid/gid when
 * set. argv[0] is searched in envp's PATH; envp NULL inherits environ; cwd
 * NULL inherits. TOOL_START is recorded; *ret_pid gets the pid.
 * Sandboxing is never lost silently: when the tool cannot be placed in a
 * cgroup (tandemd not reachable within a second, without cgroups, refusing)
 * nothing is started and the call fails, unless options->flags has
 * TANDEM_TOOL_ALLOW_UNPLACED: then it starts without a cgroup, and
 * tandem_tool_info_get() and the result say TANDEM_TOOL_UNPLACED.
 * Errors: -EPERM (not a runner handle; the session belongs to another
 * client), -ENOENT (session not open here; or argv[0] not found, with the
 * path in tandem_last_error), -EINVAL (empty argv, bad options), -EACCES (not
 * executable, or no write access to the cgroup: the runner must run as root
 * or in tandemd's delegated subtree), -ENOTCONN (tandemd not reachable),
 * -ETIMEDOUT (no placement in time), -ENOTSUP (tandemd runs without
 * cgroups), -ENOSPC (the session's or the runner's tool cgroups are at
 * tandemd's limits.tools_per_session / tools_per_client). */
TANDEM_API int tandem_tool_spawn(tandem_client* client, uint64_t session, const char* tool_name,
                                 const char* const* argv, const char* const* envp, const char* cwd,
                                 const tandem_tool_options* options, int32_t* ret_pid) TANDEM_NOEXCEPT;
/* Waits up to timeout_ms (< 0: forever, 0: don't block) for tool `pid`
 * started by tandem_tool_spawn on this handle, records TOOL_END, reaps it
 * and fills *ret_result. While it waits it keeps the connection to tandemd
 * going (reconnecting and resyncing after a daemon restart), so the tool's
 * session is claimed back and the tool runs to its real exit. Errors:
 * -ETIMEDOUT (still running), -ECHILD (no such tool on this handle). */
TANDEM_API int tandem_tool_wait(tandem_client* client, int32_t pid, int timeout_ms,
                                tandem_tool_result* ret_result) TANDEM_NOEXCEPT;
/* Kills tool `pid` and every process of its cgroup (daemonised ones too);
 * tandem_tool_wait then reports it. -ECHILD if no such tool. */
TANDEM_API int tandem_tool_kill(tandem_client* client, int32_t pid) TANDEM_NOEXCEPT;
/* How running tool `pid` (of this handle) was started: its cgroup (0:
 * unplaced), flags, uid and gid. -ECHILD if no such tool. */
TANDEM_API int tandem_tool_info_get(tandem_client* client, int32_t pid, tandem_tool_info* ret_info) TANDEM_NOEXCEPT;

/* ---- engine API ------------------------------------------------------- */

typedef struct tandem_round {
  size_t sz;                  /* sizeof the struct */
  uint32_t round;             /* 0-based index within the session */
  uint32_t prompt_tokens;     /* whole context of the call */
  uint32_t cached_tokens;     /* prefix already in the KV cache, <= prompt_tokens */
  uint32_t projected_blocks;  /* KV blocks the round will hold at its end */
  uint32_t max_output_tokens; /* 0 = engine default */
} tandem_round;

/* A round of `session` entered the engine's queue. Until the daemon admits
 * it, tandem_session_runnable() says 0 (fail-open: 1 within the local cap).
 * Errors: -EPERM (not an engine handle), -EINVAL (bad fields), -EBUSY (a
 * round of this session is already in flight). */
TANDEM_API int tandem_round_submit(tandem_client* client, uint64_t session, const tandem_round* round) TANDEM_NOEXCEPT;
TANDEM_API int tandem_round_first_token(tandem_client* client, uint64_t session, uint32_t round,
                                        uint64_t queue_delay_ns, uint64_t prefill_ns) TANDEM_NOEXCEPT;
/* The round finished: it generated `output_tokens`, the session holds
 * `blocks_held` KV blocks now, and a tool call follows if `tool_follows`. */
TANDEM_API int tandem_round_end(tandem_client* client, uint64_t session, uint32_t round, uint32_t output_tokens,
                                uint32_t blocks_held, int tool_follows) TANDEM_NOEXCEPT;

typedef struct tandem_kv_stats {
  size_t sz; /* sizeof the struct */
  uint32_t blocks_total;
  uint32_t blocks_free; /* includes free-but-cached blocks */
  uint32_t blocks_pinned;
  uint32_t blocks_offloaded;
  uint32_t running_seqs;
  uint32_t waiting_seqs;
  uint32_t step_tokens;
  uint32_t step_time_us;
  /* Appended (older callers' sz ends before it; then 0): */
  uint64_t block_bytes; /* device bytes of one KV block, all layers; 0 = unknown */
} tandem_kv_stats;
TANDEM_API int tandem_kv_stats_report(tandem_client* client, const tandem_kv_stats* stats) TANDEM_NOEXCEPT;

enum tandem_kv_event_kind {
  TANDEM_KV_EVICTED = 1,
  TANDEM_KV_RESTORED = 2,
  TANDEM_KV_OFFLOADED = 3,
  TANDEM_KV_DROPPED = 4,
};
TANDEM_API int tandem_kv_event(tandem_client* client, uint64_t session, int kind, uint32_t blocks,
                               uint32_t round) TANDEM_NOEXCEPT;

/* Block hashes of the engine's prefix cache for routers: tandemd publishes
 * them as vLLM-format KV events when [kv_events] is configured
 * (docs/daemon.md "KV events for routers"). STORED: `count` blocks of a
 * chain now held in `medium`, hashes[0] following `parent_hash` when
 * `has_parent`; REMOVED: `count` blocks gone from `medium`. Moving blocks
 * between media is a REMOVED from one and a STORED in the other. Token ids
 * are not carried (the events' token_ids are empty). The call splits the
 * hashes into KV_BLOCKS records of 3 (count 4096 = 1366 event-ring slots);
 * with no daemon they are dropped like every record. */
enum tandem_kv_blocks_op {
  TANDEM_KV_BLOCKS_STORED = 1,
  TANDEM_KV_BLOCKS_REMOVED = 2,
};
enum tandem_kv_medium {
  TANDEM_KV_MEDIUM_GPU = 0, /* "GPU": the device's KV pool */
  TANDEM_KV_MEDIUM_CPU = 1, /* "CPU": host memory (an offload) */
};
#define TANDEM_KV_BLOCKS_MAX 4096
typedef struct tandem_kv_blocks {
  size_t sz;              /* sizeof the struct */
  int op;                 /* TANDEM_KV_BLOCKS_STORED or _REMOVED */
  int medium;             /* TANDEM_KV_MEDIUM_* */
  const uint64_t* hashes; /* `count` block hashes, in chain order */
  uint32_t count;         /* 1 .. TANDEM_KV_BLOCKS_MAX */
  uint32_t block_size;    /* STORED: tokens per block, 1 .. 2^20; REMOVED: 0 */
  uint64_t parent_hash;   /* STORED with has_parent: the block before hashes[0] */
  int has_parent;         /* STORED: 1 if hashes[0] has a parent; REMOVED: 0 */
} tandem_kv_blocks;
/* Errors: -EPERM (not an engine handle), -EINVAL (bad fields, named). */
TANDEM_API int tandem_kv_blocks_report(tandem_client* client, uint64_t session,
                                       const tandem_kv_blocks* blocks) TANDEM_NOEXCEPT;

/* ---- directives ------------------------------------------------------- */

enum tandem_directive_type {
  TANDEM_DIR_ADMIT = 32,    /* the session's rounds may run */
  TANDEM_DIR_PAUSE = 33,    /* hold the session's next round */
  TANDEM_DIR_RESTORE = 34,  /* run it again, on engine `value` (a client id) */
  TANDEM_DIR_PRIORITY = 35, /* MLFQ level `value`, 0 = highest */
  TANDEM_DIR_PIN = 36,      /* hold its KV until `value` (CLOCK_MONOTONIC ns) */
  TANDEM_DIR_UNPIN = 37,
  TANDEM_DIR_DROP = 38,     /* free its KV now */
  TANDEM_DIR_OFFLOAD = 39,  /* copy its KV to host memory */
  TANDEM_DIR_PREFETCH = 40, /* bring an offloaded KV back */
  TANDEM_DIR_CLOSE = 41,    /* the session is over (its runner closed it, an operator killed it): free its KV */
};

typedef struct tandem_directive {
  uint32_t type; /* tandem_directive_type */
  uint32_t reserved;
  uint64_t session;
  int64_t value;
} tandem_directive;

/* Drives the connection (reconnect, handshake, resync, overflow flush) and
 * stores up to `max` directives received since the last call in
 * ret_directives (may be NULL when max is 0) and returns how many.
 * Waits up to `timeout_ms` for one when none is queued (0: never waits;
 * bounded by the call, never by the daemon). The library has already applied
 * each directive to tandem_session_runnable()/tandem_session_priority().
 * Call it at least once per engine step. */
TANDEM_API int tandem_poll(tandem_client* client, int timeout_ms, int max,
                           tandem_directive* ret_directives) TANDEM_NOEXCEPT;

/* 1 if the engine may schedule the session's queued round now, 0 if the
 * daemon holds it (not yet admitted, or paused). Sessions this handle never
 * submitted are runnable. */
TANDEM_API int tandem_session_runnable(tandem_client* client, uint64_t session) TANDEM_NOEXCEPT;
/* The session's MLFQ level from the last PRIORITY directive (0 if none). */
TANDEM_API int tandem_session_priority(tandem_client* client, uint64_t session) TANDEM_NOEXCEPT;

/* ---- in-process step scheduling --------------------------------------- */

/* The policy's step half (sched::StepScheduler), run inside the engine so it
 * can delegate per-step ordering. The policy and its parameters come from the
 * daemon (PolicyConfig); before the first connection, and while running
 * fail-open, the last one received is used (initially "fcfs": vLLM V1). */

enum tandem_request_phase { TANDEM_REQ_WAITING = 0, TANDEM_REQ_RUNNING = 1, TANDEM_REQ_PREEMPTED = 2 };

typedef struct tandem_step_request {
  uint64_t id;
  uint64_t session;
  uint32_t round;
  uint32_t phase; /* tandem_request_phase */
  uint32_t prompt_tokens;
  uint32_t max_output_tokens;
  uint32_t computed_tokens;
  uint32_t output_tokens;
  uint32_t cached_tokens;
  uint32_t blocks_held;
  int64_t arrival_ns;
  int64_t last_scheduled_ns; /* 0 if never */
  uint8_t priority;          /* MLFQ level; tandem_session_priority() */
  uint8_t last_round;        /* 1 if no tool follows this round */
  uint8_t reserved[6];
} tandem_step_request;

typedef struct tandem_pinned_kv {
  uint64_t session;
  uint32_t blocks;
  uint32_t reserved;
  int64_t pinned_at_ns;
  int64_t until_ns;
} tandem_pinned_kv;

typedef struct tandem_step_input {
  size_t sz; /* sizeof the struct */
  uint32_t token_budget;
  uint32_t max_seqs;
  uint32_t block_size;
  uint32_t free_blocks; /* includes free-but-cached blocks; excludes pinned */
  uint32_t max_model_len;
  uint32_t saturating_tokens;
  /* Running requests in running order, then waiting and preempted ones in
   * arrival order; plan indices refer to this array. */
  const tandem_step_request* requests;
  uint32_t n_requests;
  const tandem_pinned_kv* pinned;
  uint32_t n_pinned;
  int64_t now_ns;
} tandem_step_input;

typedef struct tandem_chunk {
  uint32_t request; /* index into tandem_step_input.requests */
  uint32_t tokens;
} tandem_chunk;

/* Caller-owned output arrays; run and preempt need room for n_requests
 * entries, unpin for n_pinned. The call fills the counts. */
typedef struct tandem_step_plan {
  size_t sz; /* sizeof the struct */
  tandem_chunk* run;
  uint32_t n_run;
  uint32_t* preempt;
  uint32_t n_preempt;
  uint64_t* unpin;
  uint32_t n_unpin;
  /* Running requests to preempt by swapping: their KV goes to host memory
   * before its blocks are freed, and is reloaded when they run again. An
   * engine without host memory treats them as `preempt`. Sized like
   * `preempt`; a request is in at most one of the two. A caller whose struct
   * ends before this field, or whose `swap` is NULL, gets them in `preempt`:
   * a preemption is never dropped. */
  uint32_t* swap;
  uint32_t n_swap;
} tandem_step_plan;

/* Plans one step. Errors: -EPERM (not an engine), -EINVAL (bad input: NULL
 * arrays with non-zero counts, a phase out of range, ...). */
TANDEM_API int tandem_engine_plan_step(tandem_client* client, const tandem_step_input* input,
                                       tandem_step_plan* ret_plan) TANDEM_NOEXCEPT;

enum tandem_keep_decision {
  TANDEM_KEEP_RELEASE = 0,
  TANDEM_KEEP_PIN = 1,
  TANDEM_KEEP_OFFLOAD = 2,
  TANDEM_KEEP_DROP = 3
};

typedef struct tandem_round_end_info {
  size_t sz; /* sizeof the struct */
  uint64_t session;
  uint8_t tool_follows;
  uint64_t tool_kind;
  uint32_t context_tokens;
  uint32_t blocks;
  uint32_t other_running_tokens;
  int64_t now_ns;
} tandem_round_end_info;

/* What to do with a finished round's KV while its tool runs
 * (tandem_keep_decision); for PIN, `*ret_until_ns` is the deadline. */
TANDEM_API int tandem_engine_keep_decision(tandem_client* client, const tandem_round_end_info* info, int* ret_decision,
                                           int64_t* ret_until_ns) TANDEM_NOEXCEPT;
/* The name of the policy tandem_engine_plan_step() runs now. */
TANDEM_API const char* tandem_engine_policy(const tandem_client* client) TANDEM_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_TANDEM_H */
