// The C ABI of tandem.h: argument checks, role checks, sized-struct reads,
// and the exception wall. Everything else happens in Client.
//
// Every function here is noexcept and catches everything: std::bad_alloc
// becomes -ENOMEM, anything else -EIO (nothing else is expected to throw).
// Messages for tandem_last_error() name the function and the field.
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "base/ids.h"
#include "base/text.h"
#include "ipc/records.h"
#include "libclient/c_abi.h"
#include "libclient/client.h"
#include "tandem/tandem.h"

using tandem::client::Client;
using tandem::client::read_sized;
using tandem::client::Role;

namespace {

constexpr std::size_t kMaxClientName = tandem::base::kMaxNameBytes;

static_assert(static_cast<int>(tandem::sched::KeepDecision::kRelease) == TANDEM_KEEP_RELEASE);
static_assert(static_cast<int>(tandem::sched::KeepDecision::kPin) == TANDEM_KEEP_PIN);
static_assert(static_cast<int>(tandem::sched::KeepDecision::kOffload) == TANDEM_KEEP_OFFLOAD);
static_assert(static_cast<int>(tandem::sched::KeepDecision::kDrop) == TANDEM_KEEP_DROP);
static_assert(static_cast<int>(tandem::ipc::RecordType::kAdmit) == TANDEM_DIR_ADMIT);
static_assert(static_cast<int>(tandem::ipc::RecordType::kPrefetch) == TANDEM_DIR_PREFETCH);
static_assert(static_cast<int>(tandem::ipc::RecordType::kClose) == TANDEM_DIR_CLOSE);
static_assert(static_cast<int>(tandem::ipc::KvEventKind::kEvicted) == TANDEM_KV_EVICTED);
static_assert(static_cast<int>(tandem::ipc::KvEventKind::kDropped) == TANDEM_KV_DROPPED);
static_assert(static_cast<int>(tandem::ipc::CloseReason::kCancelled) == TANDEM_CLOSE_CANCELLED);

// Records `message` on the handle without letting an allocation failure out.
int failure(const tandem_client* c, int code, std::string_view message) noexcept {
  if (c != nullptr) {
    try {
      c->impl->fail(code, std::string(message));
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory for the message; the code still says it
    }
  }
  return -code;
}

// Runs `f` for a live handle: NULL handle → -EINVAL; exceptions → -errno.
template <class F>
int guarded(tandem_client* c, const char* function, F&& f) noexcept {
  if (c == nullptr) return -EINVAL;
  try {
    return std::forward<F>(f)(*c->impl);
  } catch (const std::bad_alloc&) {
    return failure(c, ENOMEM, fmt::format("{}: out of memory", function));
  } catch (...) {
    return failure(c, EIO, "internal error");
  }
}

int invalid(Client& c, const char* function, std::string_view what) {
  return c.fail(EINVAL, fmt::format("{}: {}", function, what));
}

int need_role(Client& c, Role role, const char* function) {
  if (c.role() == role) return 0;
  return c.fail(EPERM, fmt::format("{}: not {} handle", function, role == Role::kEngine ? "an engine" : "a runner"));
}

// A name argument: non-NULL, non-empty, at most `limit` bytes.
bool valid_name(const char* name, std::size_t limit) {
  if (name == nullptr) return false;
  const std::size_t n = ::strnlen(name, limit + 1);
  return n > 0 && n <= limit;
}

// A session or client name by the daemon's rule (base::name_problem): 0, or
// -ENAMETOOLONG / -EINVAL with the reason recorded on the handle.
int check_session_name(Client& c, const char* function, const char* field, const char* name) {
  if (name == nullptr) return invalid(c, function, fmt::format("{} is NULL", field));
  const std::size_t n = ::strnlen(name, tandem::base::kMaxNameBytes + 1);
  auto ok = tandem::base::check_name(std::string_view(name, n), field);
  if (ok) return 0;
  if (ok.error().code() == ENAMETOOLONG) {
    return c.fail(ENAMETOOLONG,
                  fmt::format("{}: {} is longer than {} bytes", function, field, tandem::base::kMaxNameBytes));
  }
  return c.fail(EINVAL, fmt::format("{}: {}", function, ok.error().context()));
}

int open_client(Role role, const tandem_options* options, const tandem_engine_params* params,
                tandem_client** ret_client) {
  if (ret_client == nullptr) return -EINVAL;
  tandem_options o{};
  o.sz = sizeof o;
  if (options != nullptr && !read_sized(options, sizeof(std::size_t), o)) return -EINVAL;

  tandem::client::Config config;
  config.role = role;
  std::string dir;
  if (o.runtime_dir != nullptr) {
    if (o.runtime_dir[0] == '\0') return -EINVAL;
    dir = o.runtime_dir;
  } else if (const char* env = ::secure_getenv("TANDEM_RUNTIME_DIR"); env != nullptr && env[0] != '\0') {
    dir = env;
  } else {
    dir = "/run/tandem";
  }
  config.socket_path = dir + "/tandemd.sock";
  if (config.socket_path.size() >= sizeof(sockaddr_un::sun_path)) return -EINVAL;  // NAME_MAX-ish: too long to bind

  if (o.name != nullptr) {
    if (!valid_name(o.name, kMaxClientName) || tandem::base::name_problem(o.name) != nullptr) return -EINVAL;
    config.name = o.name;
  } else {
    config.name = fmt::format("{}-{}", role == Role::kEngine ? "engine" : "runner", ::getpid());
  }
  config.fallback_cap = o.fallback_cap != 0 ? o.fallback_cap : 64;
  const std::uint32_t min_ms = o.reconnect_min_ms != 0 ? o.reconnect_min_ms : 50;
  const std::uint32_t max_ms = o.reconnect_max_ms != 0 ? o.reconnect_max_ms : 2000;
  if (min_ms > max_ms) return -EINVAL;
  config.reconnect_min = std::chrono::milliseconds(min_ms);
  config.reconnect_max = std::chrono::milliseconds(max_ms);

  if (role == Role::kEngine) {
    if (params == nullptr) return -EINVAL;
    tandem_engine_params p{};
    if (!read_sized(params, sizeof p, p)) return -EINVAL;
    if (p.gpu_index < -1 || p.block_size == 0 || p.total_blocks == 0 || p.max_seqs == 0 || p.token_budget == 0) {
      return -EINVAL;
    }
    tandem::ipc::EngineInfo info;
    info.gpu_index = p.gpu_index;
    info.block_size = p.block_size;
    info.total_blocks = p.total_blocks;
    info.max_seqs = p.max_seqs;
    info.token_budget = p.token_budget;
    info.saturating_tokens = p.saturating_tokens;
    info.max_model_len = p.max_model_len;
    config.engine = info;
  }

  auto client = Client::create(std::move(config));
  if (!client) return -client.error().code();
  auto handle = std::make_unique<tandem_client>();
  handle->impl = std::move(*client);
  handle->impl->start();
  *ret_client = handle.release();
  return 0;
}

int open_guarded(Role role, const tandem_options* options, const tandem_engine_params* params,
                 tandem_client** ret_client) noexcept {
  try {
    return open_client(role, options, params, ret_client);
  } catch (const std::bad_alloc&) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

}  // namespace

// ---- connecting ---------------------------------------------------------------

int tandem_engine_open(const tandem_options* options, const tandem_engine_params* params,
                       tandem_client** ret_client) noexcept {
  return open_guarded(Role::kEngine, options, params, ret_client);
}

int tandem_runner_open(const tandem_options* options, tandem_client** ret_client) noexcept {
  return open_guarded(Role::kRunner, options, nullptr, ret_client);
}

void tandem_close(tandem_client* client) noexcept {
  delete client;  // ~Client flushes and closes; it does not throw
}

int tandem_connected(const tandem_client* client) noexcept {
  return client != nullptr && client->impl->connected() ? 1 : 0;
}

uint32_t tandem_client_id(const tandem_client* client) noexcept {
  return client == nullptr ? 0 : client->impl->client_id();
}

const char* tandem_last_error(const tandem_client* client) noexcept {
  return client == nullptr ? "" : client->impl->last_error().c_str();
}

int tandem_get_stats(const tandem_client* client, tandem_client_stats* ret_stats) noexcept {
  if (client == nullptr || ret_stats == nullptr) return -EINVAL;
  if (ret_stats->sz < sizeof(std::size_t))
    return failure(client, EINVAL, "tandem_get_stats: ret_stats->sz is too small");
  const tandem_client_stats stats = client->impl->stats();
  // Write what the caller's struct has room for, past its sz.
  const std::size_t n = std::min(ret_stats->sz, sizeof stats);
  std::memcpy(reinterpret_cast<char*>(ret_stats) + sizeof(std::size_t),
              reinterpret_cast<const char*>(&stats) + sizeof(std::size_t), n - sizeof(std::size_t));
  return 0;
}

// ---- sessions -------------------------------------------------------------------

uint64_t tandem_session_id(const char* name) noexcept { return name == nullptr ? 0 : tandem::base::session_id(name); }

uint64_t tandem_tool_kind(const char* name) noexcept { return name == nullptr ? 0 : tandem::base::tool_kind_id(name); }

int tandem_session_name(tandem_client* client, uint64_t session, const char* name) noexcept {
  return guarded(client, "tandem_session_name", [&](Client& c) {
    if (session == 0) return invalid(c, "tandem_session_name", "session is 0");
    if (int r = check_session_name(c, "tandem_session_name", "name", name)) return r;
    if (tandem::base::session_id(name) != session) {
      return invalid(c, "tandem_session_name", "name is not the name of session (tandem_session_id(name) differs)");
    }
    return c.session_name(session, name);
  });
}

// ---- runner API -------------------------------------------------------------------

int tandem_session_open(tandem_client* client, const char* name, const tandem_session_hints* hints,
                        uint64_t* ret_session) noexcept {
  return guarded(client, "tandem_session_open", [&](Client& c) {
    const char* fn = "tandem_session_open";
    if (int r = need_role(c, Role::kRunner, fn)) return r;
    if (int r = check_session_name(c, fn, "name", name)) return r;
    if (ret_session == nullptr) return invalid(c, fn, "ret_session is NULL");
    tandem_session_hints h{};
    if (hints != nullptr) {
      if (!read_sized(hints, sizeof(std::size_t), h)) return invalid(c, fn, "hints->sz is too small");
      if (h.priority_class >= tandem::ipc::kPriorityClasses) {
        return invalid(c, fn, fmt::format("hints->priority_class {} is over 3", h.priority_class));
      }
    }
    std::uint64_t id = 0;
    int r = c.session_open(name, h.priority_class, h.expected_rounds, id);
    if (r == 0) *ret_session = id;
    return r;
  });
}

int tandem_session_close(tandem_client* client, uint64_t session, int reason) noexcept {
  return guarded(client, "tandem_session_close", [&](Client& c) {
    const char* fn = "tandem_session_close";
    if (int r = need_role(c, Role::kRunner, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    if (reason < TANDEM_CLOSE_NORMAL || reason > TANDEM_CLOSE_CANCELLED) {
      return invalid(c, fn, fmt::format("reason {} is unknown", reason));
    }
    return c.session_close(session, static_cast<std::uint8_t>(reason));
  });
}

int tandem_tool_begin(tandem_client* client, uint64_t session, const char* tool_name, uint32_t call,
                      int32_t pid) noexcept {
  return guarded(client, "tandem_tool_begin", [&](Client& c) {
    const char* fn = "tandem_tool_begin";
    if (int r = need_role(c, Role::kRunner, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    if (!valid_name(tool_name, tandem::base::kMaxToolNameBytes)) return invalid(c, fn, "tool_name is NULL or empty");
    if (pid < 0 || pid > 0x3fffffff) return invalid(c, fn, fmt::format("pid {} is out of range", pid));
    return c.tool_begin(session, tool_name, call, pid);
  });
}

int tandem_tool_end(tandem_client* client, uint64_t session, const char* tool_name, uint32_t call, int32_t exit_code,
                    const tandem_tool_usage* usage) noexcept {
  return guarded(client, "tandem_tool_end", [&](Client& c) {
    const char* fn = "tandem_tool_end";
    if (int r = need_role(c, Role::kRunner, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    if (!valid_name(tool_name, tandem::base::kMaxToolNameBytes)) return invalid(c, fn, "tool_name is NULL or empty");
    if (exit_code < -64 || exit_code > 255) {
      return invalid(c, fn, fmt::format("exit_code {} is neither a status nor a signal", exit_code));
    }
    tandem_tool_usage u{};
    if (usage != nullptr && !read_sized(usage, sizeof(std::size_t), u)) return invalid(c, fn, "usage->sz is too small");
    return c.tool_end(session, tool_name, call, exit_code, usage != nullptr ? &u : nullptr);
  });
}

// ---- tool processes --------------------------------------------------------------

int tandem_tool_spawn(tandem_client* client, uint64_t session, const char* tool_name, const char* const* argv,
                      const char* const* envp, const char* cwd, const tandem_tool_options* options,
                      int32_t* ret_pid) noexcept {
  return guarded(client, "tandem_tool_spawn", [&](Client& c) {
    const char* fn = "tandem_tool_spawn";
    if (int r = need_role(c, Role::kRunner, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    if (!valid_name(tool_name, tandem::base::kMaxToolNameBytes)) return invalid(c, fn, "tool_name is NULL or empty");
    if (ret_pid == nullptr) return invalid(c, fn, "ret_pid is NULL");
    if (argv == nullptr || argv[0] == nullptr || argv[0][0] == '\0') return invalid(c, fn, "argv is NULL or empty");
    tandem::client::ToolSpec spec;
    for (std::size_t i = 0; argv[i] != nullptr; ++i) {
      if (i >= tandem::client::kMaxToolArgs) return invalid(c, fn, "argv has too many entries");
      spec.process.argv.emplace_back(argv[i]);
    }
    for (std::size_t i = 0; envp != nullptr && envp[i] != nullptr; ++i) {
      if (i >= tandem::client::kMaxToolArgs) return invalid(c, fn, "envp has too many entries");
      if (std::strchr(envp[i], '=') == nullptr) return invalid(c, fn, fmt::format("envp[{}] is not NAME=value", i));
      spec.process.env.emplace_back(envp[i]);
    }
    spec.process.inherit_env = envp == nullptr;
    if (cwd != nullptr) spec.process.cwd = cwd;
    tandem_tool_options o{};
    if (options != nullptr) {
      if (!read_sized(options, sizeof(std::size_t), o)) return invalid(c, fn, "options->sz is too small");
      if (o.cpu_quota_us != 0 && o.cpu_quota_us < 1000) return invalid(c, fn, "options->cpu_quota_us is under 1000");
      if (o.cpu_period_us != 0 && (o.cpu_period_us < 1000 || o.cpu_period_us > 1000000)) {
        return invalid(c, fn, "options->cpu_period_us is outside 1000..1000000");
      }
      if (o.memory_high != 0 && o.memory_max != 0 && o.memory_high > o.memory_max) {
        return invalid(c, fn, "options->memory_high exceeds memory_max");
      }
      if (o.stdin_fd < 0 || o.stdout_fd < 0 || o.stderr_fd < 0) return invalid(c, fn, "a stdio fd is negative");
      if ((o.flags & ~static_cast<std::uint32_t>(TANDEM_TOOL_ALLOW_UNPLACED)) != 0) {
        return invalid(c, fn, fmt::format("options->flags {:#x} has unknown bits", o.flags));
      }
      if (o.uid == static_cast<std::uint32_t>(-1) || o.gid == static_cast<std::uint32_t>(-1)) {
        return invalid(c, fn, "options->uid or gid is -1");
      }
    }
    spec.allow_unplaced = (o.flags & TANDEM_TOOL_ALLOW_UNPLACED) != 0;
    if (o.uid != 0) spec.process.uid = o.uid;
    if (o.gid != 0) spec.process.gid = o.gid;
    spec.limits = tandem::ipc::ToolLimitsInfo{o.cpu_quota_us, o.cpu_period_us, o.memory_high,
                                              o.memory_max,   o.pids_max,      o.low_priority != 0};
    spec.process.stdin_fd = o.stdin_fd != 0 ? o.stdin_fd : -1;
    spec.process.stdout_fd = o.stdout_fd != 0 ? o.stdout_fd : -1;
    spec.process.stderr_fd = o.stderr_fd != 0 ? o.stderr_fd : -1;
    std::int32_t pid = 0;
    int r = c.tool_spawn(session, tool_name, spec, pid);
    if (r == 0) *ret_pid = pid;
    return r;
  });
}

int tandem_tool_wait(tandem_client* client, int32_t pid, int timeout_ms, tandem_tool_result* ret_result) noexcept {
  return guarded(client, "tandem_tool_wait", [&](Client& c) {
    const char* fn = "tandem_tool_wait";
    if (int r = need_role(c, Role::kRunner, fn)) return r;
    if (ret_result == nullptr) return invalid(c, fn, "ret_result is NULL");
    if (ret_result->sz < sizeof(std::size_t)) return invalid(c, fn, "ret_result->sz is too small");
    tandem_tool_result out{};
    int r = c.tool_wait(pid, timeout_ms, out);
    if (r == 0) {
      const std::size_t sz = std::min(ret_result->sz, sizeof out);
      out.sz = ret_result->sz;
      std::memcpy(ret_result, &out, sz);
    }
    return r;
  });
}

int tandem_tool_info_get(tandem_client* client, int32_t pid, tandem_tool_info* ret_info) noexcept {
  return guarded(client, "tandem_tool_info_get", [&](Client& c) {
    const char* fn = "tandem_tool_info_get";
    if (int r = need_role(c, Role::kRunner, fn)) return r;
    if (ret_info == nullptr) return invalid(c, fn, "ret_info is NULL");
    if (ret_info->sz < sizeof(std::size_t)) return invalid(c, fn, "ret_info->sz is too small");
    tandem_tool_info out{};
    out.sz = sizeof out;
    int r = c.tool_info(pid, out);
    if (r == 0) tandem::client::write_sized(ret_info, out);
    return r;
  });
}

int tandem_tool_kill(tandem_client* client, int32_t pid) noexcept {
  return guarded(client, "tandem_tool_kill", [&](Client& c) {
    if (int r = need_role(c, Role::kRunner, "tandem_tool_kill")) return r;
    return c.tool_kill(pid);
  });
}

static_assert(TANDEM_TOOL_EXITED == static_cast<int>(tandem::ipc::ToolExitReason::kExited));
static_assert(TANDEM_TOOL_SIGNALED == static_cast<int>(tandem::ipc::ToolExitReason::kSignaled));
static_assert(TANDEM_TOOL_OOM_KILLED == static_cast<int>(tandem::ipc::ToolExitReason::kOomKilled));
static_assert(TANDEM_TOOL_KILLED_MEMORY == static_cast<int>(tandem::ipc::ToolExitReason::kKilledMemory));
static_assert(TANDEM_TOOL_KILLED_POLICY == static_cast<int>(tandem::ipc::ToolExitReason::kKilledPolicy));
static_assert(TANDEM_TOOL_KILLED_SESSION == static_cast<int>(tandem::ipc::ToolExitReason::kKilledSession));

// ---- engine API -------------------------------------------------------------------

int tandem_round_submit(tandem_client* client, uint64_t session, const tandem_round* round) noexcept {
  return guarded(client, "tandem_round_submit", [&](Client& c) {
    const char* fn = "tandem_round_submit";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    if (round == nullptr) return invalid(c, fn, "round is NULL");
    tandem_round r{};
    // The struct as first released ends at max_output_tokens: a member
    // appended since reads as 0 for a caller whose sz ends before it.
    constexpr std::size_t kFirstRoundSize = offsetof(tandem_round, max_output_tokens) + sizeof r.max_output_tokens;
    if (!read_sized(round, kFirstRoundSize, r)) return invalid(c, fn, "round->sz is too small");
    if (r.prompt_tokens == 0) return invalid(c, fn, "round->prompt_tokens is 0");
    if (r.cached_tokens > r.prompt_tokens) return invalid(c, fn, "round->cached_tokens > round->prompt_tokens");
    return c.round_submit(session, r);
  });
}

int tandem_round_first_token(tandem_client* client, uint64_t session, uint32_t round, uint64_t queue_delay_ns,
                             uint64_t prefill_ns) noexcept {
  return guarded(client, "tandem_round_first_token", [&](Client& c) {
    const char* fn = "tandem_round_first_token";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    return c.round_first_token(session, round, queue_delay_ns, prefill_ns);
  });
}

int tandem_round_end(tandem_client* client, uint64_t session, uint32_t round, uint32_t output_tokens,
                     uint32_t blocks_held, int tool_follows) noexcept {
  return guarded(client, "tandem_round_end", [&](Client& c) {
    const char* fn = "tandem_round_end";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    return c.round_end(session, round, output_tokens, blocks_held, tool_follows != 0);
  });
}

int tandem_kv_stats_report(tandem_client* client, const tandem_kv_stats* stats) noexcept {
  return guarded(client, "tandem_kv_stats_report", [&](Client& c) {
    const char* fn = "tandem_kv_stats_report";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (stats == nullptr) return invalid(c, fn, "stats is NULL");
    tandem_kv_stats s{};
    // block_bytes was appended: a struct that ends before it is valid.
    if (!read_sized(stats, offsetof(tandem_kv_stats, block_bytes), s)) {
      return invalid(c, fn, "stats->sz is too small");
    }
    if (s.blocks_total == 0) return invalid(c, fn, "stats->blocks_total is 0");
    if (s.blocks_free > s.blocks_total) return invalid(c, fn, "stats->blocks_free > stats->blocks_total");
    if (s.blocks_pinned > s.blocks_total - s.blocks_free) {
      return invalid(c, fn, "stats->blocks_pinned > allocated blocks (blocks_total - blocks_free)");
    }
    return c.kv_stats(s);
  });
}

int tandem_kv_event(tandem_client* client, uint64_t session, int kind, uint32_t blocks, uint32_t round) noexcept {
  return guarded(client, "tandem_kv_event", [&](Client& c) {
    const char* fn = "tandem_kv_event";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    if (kind < TANDEM_KV_EVICTED || kind > TANDEM_KV_DROPPED)
      return invalid(c, fn, fmt::format("kind {} is unknown", kind));
    return c.kv_event(session, kind, blocks, round);
  });
}

static_assert(static_cast<int>(tandem::ipc::KvBlocksOp::kStored) == TANDEM_KV_BLOCKS_STORED);
static_assert(static_cast<int>(tandem::ipc::KvBlocksOp::kRemoved) == TANDEM_KV_BLOCKS_REMOVED);
static_assert(static_cast<int>(tandem::ipc::KvMedium::kCpu) == TANDEM_KV_MEDIUM_CPU);
static_assert(tandem::ipc::kMaxKvBlockSize == 1u << 20);

int tandem_kv_blocks_report(tandem_client* client, uint64_t session, const tandem_kv_blocks* blocks) noexcept {
  return guarded(client, "tandem_kv_blocks_report", [&](Client& c) {
    const char* fn = "tandem_kv_blocks_report";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (session == 0) return invalid(c, fn, "session is 0");
    if (blocks == nullptr) return invalid(c, fn, "blocks is NULL");
    tandem_kv_blocks b{};
    if (!read_sized(blocks, sizeof b, b)) return invalid(c, fn, "blocks->sz is too small");
    if (b.op != TANDEM_KV_BLOCKS_STORED && b.op != TANDEM_KV_BLOCKS_REMOVED) {
      return invalid(c, fn, fmt::format("blocks->op {} is unknown", b.op));
    }
    if (b.medium != TANDEM_KV_MEDIUM_GPU && b.medium != TANDEM_KV_MEDIUM_CPU) {
      return invalid(c, fn, fmt::format("blocks->medium {} is unknown", b.medium));
    }
    if (b.count == 0 || b.count > TANDEM_KV_BLOCKS_MAX) {
      return invalid(c, fn, fmt::format("blocks->count {} is outside 1..{}", b.count, TANDEM_KV_BLOCKS_MAX));
    }
    if (b.hashes == nullptr) return invalid(c, fn, "blocks->hashes is NULL");
    if (b.op == TANDEM_KV_BLOCKS_STORED) {
      if (b.block_size == 0 || b.block_size > tandem::ipc::kMaxKvBlockSize) {
        return invalid(c, fn, fmt::format("blocks->block_size {} is outside 1..1048576", b.block_size));
      }
    } else {
      if (b.block_size != 0) return invalid(c, fn, "blocks->block_size of a REMOVED is not 0");
      if (b.has_parent != 0) return invalid(c, fn, "blocks->has_parent of a REMOVED is not 0");
    }
    if (b.has_parent == 0 && b.parent_hash != 0) return invalid(c, fn, "blocks->parent_hash set without has_parent");
    return c.kv_blocks(session, b);
  });
}

// ---- directives -------------------------------------------------------------------

int tandem_poll(tandem_client* client, int timeout_ms, int max, tandem_directive* ret_directives) noexcept {
  return guarded(client, "tandem_poll", [&](Client& c) {
    const char* fn = "tandem_poll";
    if (timeout_ms < 0) return invalid(c, fn, "timeout_ms is negative (the wait is always bounded)");
    if (max < 0) return invalid(c, fn, "max is negative");
    if (max > 0 && ret_directives == nullptr) return invalid(c, fn, "ret_directives is NULL with max > 0");
    return c.poll(timeout_ms, max, ret_directives);
  });
}

int tandem_session_runnable(tandem_client* client, uint64_t session) noexcept {
  return guarded(client, "tandem_session_runnable", [&](Client& c) {
    if (session == 0) return invalid(c, "tandem_session_runnable", "session is 0");
    return c.runnable(session);
  });
}

int tandem_session_priority(tandem_client* client, uint64_t session) noexcept {
  return guarded(client, "tandem_session_priority", [&](Client& c) {
    if (session == 0) return invalid(c, "tandem_session_priority", "session is 0");
    return c.priority(session);
  });
}

// ---- in-process step scheduling -------------------------------------------------------

int tandem_engine_plan_step(tandem_client* client, const tandem_step_input* input,
                            tandem_step_plan* ret_plan) noexcept {
  return guarded(client, "tandem_engine_plan_step", [&](Client& c) {
    const char* fn = "tandem_engine_plan_step";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (input == nullptr) return invalid(c, fn, "input is NULL");
    if (ret_plan == nullptr) return invalid(c, fn, "ret_plan is NULL");
    tandem_step_input in{};
    if (!read_sized(input, sizeof in, in)) return invalid(c, fn, "input->sz is too small");
    // The fields up to n_unpin are the first version of the struct; one
    // that ends there gets swaps as preemptions (Coordinator::plan).
    constexpr std::size_t kFirstPlanSize = offsetof(tandem_step_plan, n_unpin) + sizeof(uint32_t);
    constexpr std::size_t kSwapEnd = offsetof(tandem_step_plan, n_swap) + sizeof(uint32_t);
    tandem_step_plan plan{};
    if (!read_sized(ret_plan, kFirstPlanSize, plan)) return invalid(c, fn, "ret_plan->sz is too small");
    if (ret_plan->sz < kSwapEnd) plan.swap = nullptr;
    std::string error;
    int r = c.coordinator().plan(in, plan, error);
    if (r != 0) return c.fail(-r, fmt::format("{}: {}", fn, error));
    ret_plan->n_run = plan.n_run;
    ret_plan->n_preempt = plan.n_preempt;
    ret_plan->n_unpin = plan.n_unpin;
    if (ret_plan->sz >= kSwapEnd) ret_plan->n_swap = plan.n_swap;
    return 0;
  });
}

int tandem_engine_keep_decision(tandem_client* client, const tandem_round_end_info* info, int* ret_decision,
                                int64_t* ret_until_ns) noexcept {
  return guarded(client, "tandem_engine_keep_decision", [&](Client& c) {
    const char* fn = "tandem_engine_keep_decision";
    if (int r = need_role(c, Role::kEngine, fn)) return r;
    if (info == nullptr) return invalid(c, fn, "info is NULL");
    if (ret_decision == nullptr) return invalid(c, fn, "ret_decision is NULL");
    tandem_round_end_info in{};
    if (!read_sized(info, sizeof in, in)) return invalid(c, fn, "info->sz is too small");
    if (in.session == 0) return invalid(c, fn, "info->session is 0");
    if (in.now_ns < 0) return invalid(c, fn, "info->now_ns is negative");
    const tandem::sched::KeepPlan keep = c.coordinator().keep(in);
    *ret_decision = static_cast<int>(keep.decision);
    if (ret_until_ns != nullptr) {
      *ret_until_ns = keep.decision == tandem::sched::KeepDecision::kPin ? tandem::base::to_ns(keep.until) : 0;
    }
    return 0;
  });
}

const char* tandem_engine_policy(const tandem_client* client) noexcept {
  if (client == nullptr || client->impl->role() != Role::kEngine) return "";
  return client->impl->coordinator().policy_name().c_str();
}
