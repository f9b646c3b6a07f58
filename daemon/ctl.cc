// The ctl server: tandemctl's requests, answered with JSON (docs/tandemctl.md
// shows the shapes; tandemctl renders the tables).
#include <poll.h>

#include <bit>
#include <cctype>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/parse.h"
#include "base/text.h"

#include "daemon/metrics.h"
#include "daemon/server.h"
#include "daemon/server_parts.h"

namespace tandem::daemon {
namespace {

using nlohmann::json;

json optional_int(std::int64_t v) { return v < 0 ? json(nullptr) : json(v); }

// Every JSON answer goes through here: a string that is not valid UTF-8 (a
// name a client chose, a path) is written with U+FFFD in place of its bad
// bytes instead of throwing (nlohmann's strict dump() throws type_error.316,
// which once took the daemon down). Names are validated where they come in;
// this is what keeps an answer total whatever reaches it.
std::string text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// How long session kill waits for a killed unplaced tool to be gone.
constexpr int kKillCheckMs = 200;
// What `policy set` appends to the configuration's source.
constexpr std::string_view kPolicySetSuffix = " + tandemctl policy set ";
// A ctl reply is one datagram (ipc::kMaxMessageSize): a session list stops
// growing past this many bytes and says it was truncated.
constexpr std::size_t kCtlListBudget = ipc::kMaxMessageSize - 4096;

}  // namespace

void Server::on_ctl(Client& c, const wire::CtlRequest& req) {
  if (c.role != Role::kCtlRead && c.role != Role::kCtlAdmin) {
    send_message(c, ipc::build_ctl_response(EPERM, "ctl requests need the ctl_read or ctl_admin role"));
    return;
  }
  const std::string_view command = req.command()->string_view();
  const std::string_view cursor = req.cursor() != nullptr ? req.cursor()->string_view() : std::string_view();
  const auto page = [&](const Page& p) { send_message(c, ipc::build_ctl_response(0, p.body, p.next)); };
  // Records below a ring's wake-up watermark wait for the tick: take them
  // now, so an answer is never a tick stale.
  for (auto& [id, other] : clients_) other.pending = other.has_channel && !other.doomed;
  pump();
  const base::Time now = clock_->now();
  if (command == "status") {
    send_message(c, ipc::build_ctl_response(0, ctl_status(now)));
  } else if (command == "engines") {
    page(ctl_engines(cursor));
  } else if (command == "sessions") {
    page(ctl_sessions(now, cursor));
  } else if (command == "tools") {
    page(ctl_tools(cursor));
  } else if (command == "gpu") {
    send_message(c, ipc::build_ctl_response(0, ctl_gpu(now)));
  } else if (command == "metrics") {
    page(ctl_metrics(now, cursor));
  } else if (command == "events") {
    const std::string_view since =
        req.args() != nullptr && req.args()->size() == 1 ? req.args()->Get(0)->string_view() : std::string_view("0");
    send_message(c, ipc::build_ctl_response(0, ctl_events(since)));
  } else if (command == "policy") {
    std::vector<std::string_view> args;
    if (req.args() != nullptr) {
      for (const auto* a : *req.args()) args.push_back(a->string_view());
    }
    if (args.empty() || (args.size() == 1 && args[0] == "get")) {
      send_message(c, ipc::build_ctl_response(0, ctl_policy()));
    } else if (args.size() == 3 && args[0] == "set") {
      if (c.role != Role::kCtlAdmin) {
        send_message(c, ipc::build_ctl_response(EPERM, "policy set needs the ctl_admin role"));
        return;
      }
      std::string out;
      const int code = ctl_policy_set(args[1], args[2], out);
      send_message(c, ipc::build_ctl_response(code, out));
    } else {
      send_message(c, ipc::build_ctl_response(EINVAL, "policy takes: get | set KEY VALUE"));
    }
  } else if (command == "session-kill" || command == "session-evict" || command == "drain" || command == "undrain" ||
             command == "reload") {
    if (c.role != Role::kCtlAdmin) {
      send_message(c, ipc::build_ctl_response(EPERM, fmt::format("{} needs the ctl_admin role", command)));
      return;
    }
    const bool session_cmd = command == "session-kill" || command == "session-evict";
    const std::size_t want = session_cmd ? 1 : 0;
    if ((req.args() == nullptr ? 0 : req.args()->size()) != want) {
      send_message(c, ipc::build_ctl_response(
                          EINVAL, session_cmd ? fmt::format("{} takes one argument: a session name or id", command)
                                              : fmt::format("{} takes no argument", command)));
      return;
    }
    std::string out;
    int code = 0;
    if (command == "session-kill") {
      code = ctl_session_kill(req.args()->Get(0)->string_view(), now, out);
    } else if (command == "session-evict") {
      code = ctl_session_evict(req.args()->Get(0)->string_view(), now, out);
    } else if (command == "reload") {
      if (auto applied = reload(); applied) {
        out = text(json{{"reloaded", true},
                        {"source", config_->config().source},
                        {"policy", config_->config().policy},
                        {"epoch", policy_epoch_}});
      } else {
        code = applied.error().code() != 0 ? applied.error().code() : EINVAL;
        out = applied.error().context();
      }
    } else {
      const bool on = command == "drain";
      if (on != draining_)
        spdlog::info("ctl: {} by an operator", on ? "draining: no new session is admitted" : "admitting again");
      if (on != draining_) log_event(now, on ? LogKind::kDrain : LogKind::kUndrain, 0);
      draining_ = on;
      out = text(json{{"draining", draining_},
                      {"waiting", model_.sessions().count(sched::SessionState::kWaiting)},
                      {"live", model_.sessions().size()}});
    }
    send_message(c, ipc::build_ctl_response(code, out));
  } else {
    send_message(
        c, ipc::build_ctl_response(
               EINVAL, fmt::format("unknown command \"{}\" (known: status, engines, sessions, tools, gpu, metrics, "
                                   "events, policy, drain, undrain, reload, session-evict, session-kill)",
                                   base::escape(command, 64))));
  }
}

PidAttribution Server::gpu_attribution() const {
  std::map<pid_t, GpuClient> by_pid;
  for (const auto& [id, c] : clients_) {
    if (c.doomed || c.phase != Phase::kActive || c.pid <= 0) continue;
    by_pid.emplace(c.pid, GpuClient{id, c.name, std::string(to_string(c.role))});
  }
  return PidAttribution(std::move(by_pid), std::string(kProcRoot));
}

std::string Server::ctl_gpu(base::Time now) const {
  json j = gpu_json(gpu_telemetry_->snapshot(), now, gpu_attribution());
  j["truncated"] = false;
  std::string out = text(j);
  if (out.size() > kCtlListBudget) {
    // The reply must fit one datagram: the devices stay, their process lists go.
    for (auto& d : j["devices"]) d["processes"] = nullptr;
    j["truncated"] = true;
    out = text(j);
  }
  return out;
}

Server::Page Server::ctl_tools(std::string_view cursor) const {
  json list;
  effects_->tools(list);
  if (!list.is_array()) list = json::array();
  // Pages in session order: the cursor is the last session (16 hex digits) shown.
  std::vector<std::pair<std::string, const json*>> order;
  for (const auto& entry : list) {
    const json* session = entry.is_object() && entry.contains("session") ? &entry["session"] : nullptr;
    const std::string key = session != nullptr && session->is_string() ? session->get<std::string>() : std::string();
    if (key > cursor || cursor.empty()) order.emplace_back(key, &entry);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  json out = json::array();
  std::size_t bytes = 0;
  std::string next;
  for (const auto& [key, entry] : order) {
    json e = *entry;
    std::uint64_t sid = 0;
    if (key.size() == 16) sid = std::strtoull(key.c_str(), nullptr, 16);
    auto m = meta_.find(sid);
    e["name"] = m == meta_.end() ? "" : m->second.name;
    const std::size_t size = text(e).size() + 1;
    if (bytes + size > kCtlListBudget && !out.empty()) {
      next = order[out.size() - 1].first;
      break;
    }
    bytes += size;
    out.push_back(std::move(e));
  }
  return {text(json{{"sessions", out}, {"total", order.size()}, {"truncated", !next.empty()}}), next};
}

sched::SessionId Server::find_live_session(std::string_view who, std::string& out) const {
  // An id (0x-prefixed or 16 hex digits) or a name.
  sched::SessionId id = 0;
  std::string_view hex = who.starts_with("0x") ? who.substr(2) : who;
  if (!hex.empty() && hex.size() <= 16 && (who.starts_with("0x") || hex.size() == 16) &&
      hex.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos) {
    id = std::stoull(std::string(hex), nullptr, 16);
  }
  const sched::Session* s = id != 0 ? model_.sessions().find(id) : nullptr;
  if (s == nullptr) {
    id = base::session_id(who);
    s = model_.sessions().find(id);
  }
  if (s == nullptr || s->state == sched::SessionState::kDone) {
    out = fmt::format("no live session \"{}\"", base::escape(who, 128));
    return 0;
  }
  return id;
}

int Server::ctl_session_evict(std::string_view who, base::Time now, std::string& out) {
  const sched::SessionId id = find_live_session(who, out);
  if (id == 0) return ENOENT;
  const sched::Session* s = model_.sessions().find(id);
  if (s->engine == sched::kNoEngine) {
    out = fmt::format("session {:016x} has no KV on any engine yet", id);
    return EAGAIN;
  }
  // Its engine frees the KV (pins included) now, or at once after a round
  // in flight; the next round recomputes what it needs.
  spdlog::info("ctl: session {:#018x}'s KV evicted by an operator", id);
  log_event(now, LogKind::kEvict, id);
  // The operator's actions go the policy's way (sched/apply.h).
  sched::apply({sched::ActionKind::kUnpin, id}, model_.sessions(), *this, now);
  sched::apply({sched::ActionKind::kDrop, id}, model_.sessions(), *this, now);
  out = text(json{{"session", fmt::format("{:016x}", id)}, {"evicted", true}, {"engine", s->engine}});
  return 0;
}

int Server::ctl_session_kill(std::string_view who, base::Time now, std::string& out) {
  const sched::SessionId id = find_live_session(who, out);
  if (id == 0) return ENOENT;
  spdlog::info("ctl: session {:#018x} killed by an operator", id);
  log_event(now, LogKind::kKill, id);
  // Its tools outside any cgroup (started unplaced) are killed by pid; kept
  // here to see them gone.
  std::vector<UnplacedTool> unplaced = kill_unplaced(id);
  close_session(id, ipc::ToolExitReason::kKilledSession, Closed::kKilled, now);
  session_done(id);
  model_.sessions().reap_done();
  // Dead is checked, never assumed: what is still alive — in its cgroups,
  // of its lineage, or unplaced — is reported, and the answer is an error.
  std::vector<std::int32_t> alive = effects_->survivors(id);
  for (const UnplacedTool& t : unplaced) {
    pollfd p{t.pidfd.get(), POLLIN, 0};
    if (::poll(&p, 1, kKillCheckMs) == 0) alive.push_back(t.pid);
  }
  if (!alive.empty()) {
    out = fmt::format("session {:016x} is closed, but {} of its processes are still alive: {}", id, alive.size(),
                      fmt::join(alive, ", "));
    spdlog::warn("ctl: {}", out);
    return EBUSY;
  }
  out = text(json{{"session", fmt::format("{:016x}", id)}, {"killed", true}});
  return 0;
}

std::string Server::ctl_status(base::Time now) const {
  const Config& cfg = config_->config();
  json clients = {{"engine", 0}, {"runner", 0}, {"ctl_read", 0}, {"ctl_admin", 0}};
  for (const auto& [id, c] : clients_) {
    if (c.doomed || c.phase != Phase::kActive) continue;
    clients[std::string(to_string(c.role))] = clients[std::string(to_string(c.role))].get<int>() + 1;
  }
  const auto& table = model_.sessions();
  json j = {
      {"version", kVersion},
      {"pid", static_cast<std::int64_t>(::getpid())},
      {"uptime_s", base::to_seconds(now - started_)},
      {"runtime_dir", cfg.runtime_dir},
      {"config", cfg.source},
      {"policy", {{"name", cfg.policy}, {"epoch", policy_epoch_}}},
      {"clients", clients},
      {"sessions",
       {{"total", table.size()},
        {"waiting", table.count(sched::SessionState::kWaiting)},
        {"reasoning", table.count(sched::SessionState::kReasoning)},
        {"acting", table.count(sched::SessionState::kActing)},
        {"paused", table.count(sched::SessionState::kPaused)}}},
      {"records", {{"accepted", stats_.records_accepted}, {"rejected", stats_.records_rejected}}},
      {"ticks", stats_.ticks},
      {"actions", stats_.actions},
      {"directives", stats_.directives},
      {"directives_dropped", stats_.directives_dropped},
      {"clients_refused", stats_.clients_refused},
      {"clients_dropped", stats_.clients_dropped},
      {"tools", {{"prepared", stats_.tools_prepared}, {"refused", stats_.tools_refused}}},
      {"internal_errors", stats_.internal_errors},
      {"names_refused", stats_.names_refused},
      {"clients_refused_limits", stats_.clients_refused_limits},
      {"ctl_idle_closed", stats_.ctl_idle_closed},
      {"accept_errors", stats_.accept_errors},
      {"resync_refused", stats_.resync_refused},
      {"sessions_detached", stats_.sessions_detached},
      {"sessions_reattached", stats_.sessions_reattached},
      {"sessions_restored", stats_.sessions_restored},
      {"unplaced_tools", stats_.unplaced_tools},
      {"effects",
       {{"cpu_weight", stats_.effects_cpu_weight},
        {"cpu_quota", stats_.effects_cpu_quota},
        {"sm_partition", stats_.effects_sm_partition},
        {"kill_tools", stats_.effects_kill_tools}}},
  };
  json host;
  effects_->status(host);
  j["host"] = host.is_null() ? json{{"cgroups", "off"}, {"telemetry_mode", "off"}} : host;
  if (auto w = policy_.control->admission_window()) {
    j["admission_window"] = *w;
  } else {
    j["admission_window"] = nullptr;  // the policy admits every session
  }
  j["draining"] = draining_;
  const Footprint f = footprint();
  j["tables"] = {{"clients", f.clients},
                 {"sessions", f.sessions},
                 {"session_meta", f.session_meta},
                 {"pending_names", f.pending_names},
                 {"owners", f.owners},
                 {"held_owners", f.detached},
                 {"tombstones", f.tombstones}};
  j["nvml"] = gpu_status(gpu_telemetry_->snapshot());
  j["metrics"] = {{"listen", metrics_                 ? metrics_->address()
                             : metrics_error_.empty() ? std::string("off")
                                                      : "off: " + metrics_error_},
                  {"scrapes", metrics_ ? metrics_->scrapes() : 0}};
  return text(j);
}

std::string Server::ctl_events(std::string_view since_text) const {
  const std::uint64_t since = base::parse_int<std::uint64_t>(since_text).value_or(0);
  // Names: of live sessions from their meta, of ended ones from the close
  // (or kill) event that kept theirs.
  std::unordered_map<sched::SessionId, std::string_view> names;
  for (const EventLog::Entry& e : log_.entries()) {
    if (!e.name.empty()) names[e.session] = e.name;
  }
  for (const auto& [id, m] : meta_) {
    if (!m.name.empty()) names[id] = m.name;
  }
  json list = json::array();
  std::size_t bytes = 0;
  std::uint64_t next = since;
  for (const EventLog::Entry& e : log_.entries()) {
    if (e.seq <= since) continue;
    auto [kind, detail] = EventLog::describe(e);
    json j = {{"seq", e.seq}, {"t", e.t}, {"kind", kind}};
    if (e.session != 0) {
      j["session"] = fmt::format("{:016x}", e.session);
      if (auto n = names.find(e.session); n != names.end()) j["name"] = n->second;
    }
    if (!detail.empty()) j["detail"] = std::move(detail);
    bytes += text(j).size() + 1;
    if (bytes > kCtlListBudget) break;  // the rest comes with the next request
    next = e.seq;
    list.push_back(std::move(j));
  }
  // Events older than the log's window were lost to a slow follower.
  return text(json{{"events", list}, {"next", next}, {"lost", log_.lost_after(since)}});
}

std::string Server::ctl_policy() const {
  const Config& cfg = config_->config();
  json params = json::object();
  for (const auto& [k, v] : config_->params().values()) params[k] = v;
  json specs = json::array();
  for (const sched::ParamSpec& p : config_->policy().params) {
    specs.push_back({{"name", p.name}, {"default", p.default_value}, {"min", p.min}, {"max", p.max}, {"doc", p.doc}});
  }
  return text(json{{"name", cfg.policy},
                   {"epoch", policy_epoch_},
                   {"tick_ms", std::chrono::duration_cast<std::chrono::milliseconds>(cfg.tick).count()},
                   {"source", cfg.source},
                   {"params", params},
                   {"specs", specs}});
}

int Server::ctl_policy_set(std::string_view key, std::string_view value, std::string& out) {
  // The running configuration with one key changed, validated and compiled
  // like a file: a bad value changes nothing and says why.
  for (const std::string_view arg : {key, value}) {
    if (auto ok = base::check_name(arg, "policy set's argument"); !ok) {
      out = ok.error().context();
      return ok.error().code();
    }
  }
  Config next = config_->config();
  if (auto ok = set_policy_key(next, key, value); !ok) {
    out = ok.error().context();
    return EINVAL;
  }
  // The source names the file and the keys set since it was read, each
  // once: however many `policy set`s follow, it stays as short as the
  // policy's parameter list.
  std::set<std::string> keys = policy_set_keys_;
  keys.insert(std::string(key));
  const std::string& source = config_->config().source;
  const auto suffix = source.find(kPolicySetSuffix);
  next.source = fmt::format("{}{}{}", source.substr(0, suffix), kPolicySetSuffix, fmt::join(keys, ", "));
  auto compiled = CompiledConfig::compile(std::move(next));
  if (!compiled) {
    out = compiled.error().context();
    return compiled.error().code() != 0 ? compiled.error().code() : EINVAL;
  }
  if (auto applied = apply_config(std::move(*compiled), "policy set"); !applied) {
    out = applied.error().context();
    return EINVAL;
  }
  policy_set_keys_ = std::move(keys);
  out = ctl_policy();
  return 0;
}

Server::Page Server::ctl_engines(std::string_view cursor) const {
  const std::uint32_t after = base::parse_int<std::uint32_t>(cursor).value_or(0);
  std::map<sched::EngineId, std::uint32_t> sessions;
  for (const auto& [id, s] : model_.sessions().sessions()) {
    if (s.state != sched::SessionState::kDone && s.engine != sched::kNoEngine) ++sessions[s.engine];
  }
  const auto projected = GpuPlane::projected_blocks(model_.sessions());
  json list = json::array();
  std::size_t bytes = 0;
  std::size_t total = 0;
  std::string next;
  for (const auto& [id, c] : clients_) {
    if (c.doomed || c.phase != Phase::kActive || c.role != Role::kEngine) continue;
    ++total;
    if (id <= after || !next.empty()) continue;
    if (bytes > kCtlListBudget) {
      next = std::to_string(list.back()["id"].get<std::uint32_t>());
      continue;
    }
    const sched::EngineView* v = model_.engine(id);
    const sched::KvPoolStats kv = v != nullptr ? v->kv : sched::KvPoolStats{};
    const std::uint32_t pool = v != nullptr && v->has_stats ? kv.blocks_total : c.engine.total_blocks;
    const auto p = projected.find(id);
    const std::uint64_t demand = p == projected.end() ? 0 : p->second;
    const EngineGpu* g = gpu_.engine(id);
    json offloaded = json::array();
    for (std::uint32_t i = 0; i < 64; ++i) {
      if ((c.gpu.offload_plan >> i & 1u) != 0) offloaded.push_back(i);
    }
    list.push_back({
        {"id", id},
        {"name", c.name},
        {"pid", c.pid},
        {"gpu", c.gpu_index},
        {"block_size", c.engine.block_size},
        {"total_blocks", c.engine.total_blocks},
        {"free_blocks", v != nullptr && v->has_stats ? json(kv.blocks_free) : json(nullptr)},
        {"pinned_blocks", kv.blocks_pinned},
        {"offloaded_blocks", kv.blocks_offloaded},
        {"usage", v != nullptr ? v->usage() : 0.0},
        {"running", kv.running_seqs},
        {"waiting", kv.waiting_seqs},
        {"queued_blocks", v != nullptr ? v->queued_blocks : 0},
        {"step_tokens", kv.step_tokens},
        {"step_time_us", std::chrono::duration_cast<std::chrono::microseconds>(kv.step_time).count()},
        {"sessions", sessions[id]},
        {"sm_partition", c.gpu.sm_partition_set ? json(c.gpu.sm_partition) : json(nullptr)},
        {"blocks_total", pool},
        {"block_bytes", g != nullptr && g->block_bytes != 0 ? json(g->block_bytes) : json(nullptr)},
        {"projected_blocks", demand},
        {"pressure", pool != 0 ? json(static_cast<double>(demand) / pool) : json(nullptr)},
        {"sm_decode_sms", c.gpu.sm_partition_set && g != nullptr && c.gpu.sm_partition < g->decode_sms.size()
                              ? json(g->decode_sms[c.gpu.sm_partition])
                              : json(nullptr)},
        {"sm_partitions", g != nullptr ? json(g->decode_sms) : json::array()},
        {"device_sms", g != nullptr && g->has_pool() ? json(g->device_sms) : json(nullptr)},
        {"sm_op", g != nullptr && g->has_pool() ? json(GpuPlane::sm_op_of(*g)) : json(nullptr)},
        {"sm_op_profiled", g != nullptr && g->sm_op != 0},
        {"sm_dec", g != nullptr && g->published ? json(g->sm_dec) : json(nullptr)},
        {"weight_modules", g != nullptr ? g->offload.modules().size() : 0},
        {"offload_plan", c.gpu.offload_plan},
        {"offloaded_modules", offloaded},
        {"offload_freed_bytes", c.gpu.offload_freed_bytes},
        {"records_accepted", c.accepted},
        {"records_rejected", c.rejected},
    });
    bytes += text(list.back()).size() + 1;
  }
  return {text(json{{"engines", list}, {"total", total}, {"truncated", !next.empty()}}), next};
}

Server::Page Server::ctl_metrics(base::Time now, std::string_view cursor) const {
  // Text, a page at a time, each ending at a line's end: the cursor is the
  // offset where the next page starts.
  const std::string all = metrics_text(now);
  const std::size_t from = std::min<std::size_t>(base::parse_int<std::size_t>(cursor).value_or(0), all.size());
  if (all.size() - from <= kCtlListBudget) return {all.substr(from), ""};
  std::size_t end = all.rfind('\n', from + kCtlListBudget);
  end = end == std::string::npos || end < from ? from + kCtlListBudget : end + 1;
  return {all.substr(from, end - from), std::to_string(end)};
}

Server::Page Server::ctl_sessions(base::Time now, std::string_view cursor) const {
  // In id order, a page at a time: the cursor is the last id shown.
  const std::uint64_t after = cursor.empty() ? 0 : std::strtoull(std::string(cursor).c_str(), nullptr, 16);
  std::vector<sched::SessionId> ids;
  for (const auto& [id, s] : model_.sessions().sessions()) {
    if (s.state != sched::SessionState::kDone) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  json list = json::array();
  std::size_t bytes = 0;
  std::string next;
  for (sched::SessionId id : ids) {
    if (id <= after) continue;
    const sched::Session& s = *model_.sessions().find(id);
    if (bytes > kCtlListBudget) {
      next = fmt::format("{:016x}", list.empty() ? id : std::stoull(list.back()["id"].get<std::string>(), nullptr, 16));
      break;
    }
    auto m = meta_.find(id);
    const SessionMeta meta = m != meta_.end() ? m->second : SessionMeta{};
    const auto o = owners_.find(meta.owner);
    const std::uint32_t owner_client = o == owners_.end() ? 0 : o->second.client;
    list.push_back({
        {"id", fmt::format("{:#018x}", id)},
        {"name", meta.name},
        {"state", lower(s.state)},
        {"residency", lower(s.residency)},
        {"engine", s.engine == sched::kNoEngine ? json(nullptr) : json(s.engine)},
        {"owner", owner_client == 0 ? json(nullptr) : json(owner_client)},
        {"held", meta.owner != 0 && owner_client == 0},
        {"round", s.round},
        {"rounds_done", s.rounds_done},
        {"round_in_flight", s.round_in_flight},
        {"blocks_held", s.blocks_held},
        {"in_tool", s.tool != 0},
        {"tool_kind", s.tool == 0 ? json(nullptr) : json(fmt::format("{:#018x}", s.tool))},
        {"priority", meta.priority},
        {"age_s", base::to_seconds(now - s.opened)},
        {"in_state_s", base::to_seconds(now - s.state_since)},
        {"cpu_weight", optional_int(meta.cpu_weight)},
        {"cpu_quota_us", optional_int(meta.cpu_quota)},
    });
    bytes += text(list.back()).size() + 1;
  }
  return {text(json{{"sessions", list}, {"total", ids.size()}, {"truncated", !next.empty()}}), next};
}

}  // namespace tandem::daemon
