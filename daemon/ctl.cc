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

// "reasoning" for REASONING: ctl's JSON keys and values are lower case.
template <class E>
std::string lower(E value) {
  std::string s(sched::to_string(value));
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

constexpr std::string_view kVersion = "0.1.0";
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
  const base::Time now = clock_.now();
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
  apply({sched::ActionKind::kUnpin, id}, now);
  apply({sched::ActionKind::kDrop, id}, now);
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

// An event log entry's kind and its text (ctl events).
std::pair<std::string_view, std::string> Server::describe_event(const LoggedEvent& e) {
  using L = LogKind;
  const auto& v = e.v;
  switch (e.kind) {
    case L::kSessionOpen:
      return {"session_open", ""};
    case L::kSessionTakeover:
      return {"session_open", "by its runner, after its engine's first round"};
    case L::kSessionClose:
      return {"session_close", ""};
    case L::kRoundSubmit:
      return {"round_submit",
              fmt::format("round {} on engine {}: {} prompt tokens, {} cached", v[0], v[1], v[2], v[3])};
    case L::kRoundEnd:
      return {"round_end", fmt::format("round {}: {} output tokens{}", v[0], v[1], v[2] ? ", a tool follows" : "")};
    case L::kToolStart:
      return {"tool_start", fmt::format("call {}", v[0])};
    case L::kToolEnd:
      return {"tool_end", fmt::format("call {}: exit {} after {:.3f} s", v[0], v[1], static_cast<double>(v[2]) * 1e-9)};
    case L::kKv: {
      static constexpr const char* kKinds[] = {"evicted", "restored", "offloaded", "dropped"};
      return {"kv", fmt::format("{} {} blocks", kKinds[static_cast<std::size_t>(v[0]) % 4], v[1])};
    }
    case L::kAdmit:
      return {"admit", fmt::format("on engine {}", v[0])};
    case L::kPause:
      return {"pause", ""};
    case L::kRestore:
      return {"restore", fmt::format("onto engine {}", v[0])};
    case L::kPin:
      return {"pin", fmt::format("for {:.3f} s", static_cast<double>(v[0]) * 1e-9)};
    case L::kUnpin:
      return {"unpin", ""};
    case L::kDrop:
      return {"drop", ""};
    case L::kOffload:
      return {"offload", ""};
    case L::kKillTools:
      return {"kill_tools", "by the policy"};
    case L::kDrain:
      return {"drain", "by an operator"};
    case L::kUndrain:
      return {"undrain", "by an operator"};
    case L::kEvict:
      return {"evict", "by an operator"};
    case L::kKill:
      return {"kill", "by an operator"};
    case L::kSmPartition:
      return {"sm_partition",
              fmt::format("engine {}: partition {} ({} decode SMs) for SM_dec {}", v[0], v[1], v[2], v[3])};
    case L::kOffloadPlan:
      return {"offload_plan", fmt::format("engine {}: modules {:#x}, {} bytes freed, at pressure {:.3f}", v[0],
                                          static_cast<std::uint64_t>(v[1]), v[2], static_cast<double>(v[3]) / 1000.0)};
  }
  return {"?", ""};
}

std::string Server::ctl_events(std::string_view since_text) const {
  const std::uint64_t since = base::parse_int<std::uint64_t>(since_text).value_or(0);
  // Names: of live sessions from their meta, of ended ones from the close
  // (or kill) event that kept theirs.
  std::unordered_map<sched::SessionId, std::string_view> names;
  for (const LoggedEvent& e : events_) {
    if (!e.name.empty()) names[e.session] = e.name;
  }
  for (const auto& [id, m] : meta_) {
    if (!m.name.empty()) names[id] = m.name;
  }
  json list = json::array();
  std::size_t bytes = 0;
  std::uint64_t next = since;
  for (const LoggedEvent& e : events_) {
    if (e.seq <= since) continue;
    auto [kind, detail] = describe_event(e);
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
  const std::uint64_t oldest = events_.empty() ? next_event_ : events_.front().seq;
  return text(json{{"events", list}, {"next", next}, {"lost", since + 1 < oldest ? oldest - since - 1 : 0}});
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
  if (key == "name") {
    if (value != next.policy) next.policy_params.clear();  // the old policy's parameters mean nothing to another
    next.policy = value;
  } else if (key == "tick_ms") {
    auto ms = base::parse_int<std::int64_t>(value);
    if (!ms) {
      out = fmt::format("tick_ms: '{}' is not an integer", base::escape(value, 64));
      return EINVAL;
    }
    next.tick = std::chrono::milliseconds(*ms);
  } else {
    double v = 0;
    if (value == "true" || value == "false") {
      v = value == "true" ? 1 : 0;
    } else if (auto d = base::parse_double(value)) {
      v = *d;
    } else {
      out = fmt::format("{}: '{}' is not a number", base::escape(key, 64), base::escape(value, 64));
      return EINVAL;
    }
    next.policy_params[std::string(key)] = v;
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

std::string Server::metrics_text(base::Time now) const {
  PromText p;
  const Config& cfg = config_->config();
  p.gauge("tandem_build_info", "tandemd's version and running policy (always 1)", 1,
          {{"version", kVersion}, {"policy", cfg.policy}});
  p.gauge("tandem_uptime_seconds", "seconds since tandemd started", base::to_seconds(now - started_));

  // Clients and sessions.
  std::array<std::uint64_t, kRoleCount> roles{};
  for (const auto& [id, c] : clients_) {
    if (!c.doomed && c.phase == Phase::kActive) ++roles[static_cast<std::size_t>(c.role)];
  }
  for (std::size_t r = 0; r < kRoleCount; ++r) {
    p.gauge("tandem_clients", "connected clients by role", static_cast<double>(roles[r]),
            {{"role", to_string(static_cast<Role>(r))}});
  }
  const auto& table = model_.sessions();
  using sched::SessionState;
  for (auto state : {SessionState::kWaiting, SessionState::kReasoning, SessionState::kActing, SessionState::kPaused}) {
    p.gauge("tandem_sessions", "live sessions by state", static_cast<double>(table.count(state)),
            {{"state", lower(state)}});
  }
  if (auto w = policy_.control->admission_window()) {
    p.gauge("tandem_admission_window", "sessions the policy lets reason at once (MARS's AIMD window)", *w);
  }
  std::uint64_t pinned_sessions = 0;
  for (const auto& [id, sess] : table.sessions()) pinned_sessions += sess.residency == sched::Residency::kPinned;
  p.gauge("tandem_kv_pinned_sessions", "sessions whose KV is pinned while their tool runs",
          static_cast<double>(pinned_sessions));

  // KV by engine, and the GPU plane's view of it.
  const auto projected = GpuPlane::projected_blocks(model_.sessions());
  for (const auto& [id, v] : model_.engines()) {
    const auto it = clients_.find(id);
    const std::string name = it != clients_.end() ? it->second.name : std::to_string(id);
    const double total = v.has_stats ? v.kv.blocks_total : v.params.total_blocks;
    const char* help = "KV blocks of each engine's pool by state (offloaded: host copies, outside the pool)";
    p.gauge("tandem_kv_blocks", help, total, {{"engine", name}, {"state", "total"}});
    p.gauge("tandem_kv_blocks", help, v.has_stats ? v.kv.blocks_free : total, {{"engine", name}, {"state", "free"}});
    p.gauge("tandem_kv_blocks", help, v.kv.blocks_pinned, {{"engine", name}, {"state", "pinned"}});
    p.gauge("tandem_kv_blocks", help, v.kv.blocks_offloaded, {{"engine", name}, {"state", "offloaded"}});
    p.gauge("tandem_kv_blocks", help, static_cast<double>(v.queued_blocks), {{"engine", name}, {"state", "queued"}});
    const auto demand = projected.find(id);
    p.gauge("tandem_kv_blocks", help, demand == projected.end() ? 0.0 : static_cast<double>(demand->second),
            {{"engine", name}, {"state", "projected"}});
  }
  // The GPU plane, one family at a time (a family's samples must be together).
  struct EngineGpuSample {
    std::string name;
    double total = 0;
    double projected = 0;
    const Client* client = nullptr;
    const EngineGpu* gpu = nullptr;
  };
  std::vector<EngineGpuSample> gpu_samples;
  for (const auto& [id, v] : model_.engines()) {
    const auto it = clients_.find(id);
    const auto demand = projected.find(id);
    gpu_samples.push_back({it != clients_.end() ? it->second.name : std::to_string(id),
                           static_cast<double>(v.has_stats ? v.kv.blocks_total : v.params.total_blocks),
                           demand == projected.end() ? 0.0 : static_cast<double>(demand->second),
                           it != clients_.end() ? &it->second : nullptr, gpu_.engine(id)});
  }
  for (const auto& e : gpu_samples) {
    if (e.total > 0) {
      p.gauge("tandem_kv_pressure", "projected KV demand of each engine's live sessions over its pool",
              e.projected / e.total, {{"engine", e.name}});
    }
  }
  for (const auto& e : gpu_samples) {
    if (e.client != nullptr && e.client->sm_partition_set) {
      p.gauge("tandem_sm_partition", "the green-context partition index published to each engine",
              e.client->sm_partition, {{"engine", e.name}});
    }
  }
  for (const auto& e : gpu_samples) {
    if (e.client != nullptr && e.client->sm_partition_set && e.gpu != nullptr &&
        e.client->sm_partition < e.gpu->decode_sms.size()) {
      p.gauge("tandem_sm_partition_decode_sms", "decode SMs of the partition published to each engine",
              e.gpu->decode_sms[e.client->sm_partition], {{"engine", e.name}});
    }
  }
  for (const auto& e : gpu_samples) {
    if (e.client == nullptr) continue;
    p.gauge("tandem_offloaded_weight_modules", "weight modules each engine is asked to stream from host memory",
            static_cast<double>(std::popcount(e.client->offload_plan)), {{"engine", e.name}});
  }
  for (const auto& e : gpu_samples) {
    if (e.client == nullptr) continue;
    p.gauge("tandem_offload_freed_bytes", "device bytes the offload plan frees for each engine's KV pool",
            static_cast<double>(e.client->offload_freed_bytes), {{"engine", e.name}});
  }
  static constexpr const char* kKvKinds[] = {"evicted", "restored", "offloaded", "dropped"};
  for (std::size_t k = 0; k < std::size(kKvKinds); ++k) {
    p.counter("tandem_kv_events_total", "KV moves engines reported, by kind", static_cast<double>(stats_.kv_events[k]),
              {{"kind", kKvKinds[k]}});
  }
  for (std::size_t k = 0; k < std::size(kKvKinds); ++k) {
    p.counter("tandem_kv_event_blocks_total", "KV blocks those moves concerned, by kind",
              static_cast<double>(stats_.kv_event_blocks[k]), {{"kind", kKvKinds[k]}});
  }
  p.counter("tandem_offload_plan_changes_total", "changes of an engine's weight-offload plan",
            static_cast<double>(stats_.offload_plan_changes));
  p.counter("tandem_recomputed_tokens_total",
            "prompt tokens a session had computed before that its engine did not serve from cache",
            static_cast<double>(stats_.recomputed_tokens));

  // Tools and the host.
  p.counter("tandem_tool_calls_total", "tool calls given a cgroup", static_cast<double>(stats_.tools_prepared));
  p.counter("tandem_tool_calls_refused_total", "tool calls refused a cgroup",
            static_cast<double>(stats_.tools_refused));
  json host;
  effects_->status(host);
  const auto num = [&](const char* key) {
    return host.is_object() && host.contains(key) && host[key].is_number() ? host[key].get<double>() : 0.0;
  };
  p.gauge("tandem_tool_cgroups", "tool calls with a live cgroup", num("tool_cgroups"));
  p.gauge("tandem_tool_memory_bytes", "memory of every tool call's cgroup, at the last host tick",
          num("tools_memory_bytes"));
  p.counter("tandem_tool_cpu_seconds_total", "CPU time of every tool call's cgroup", num("tools_cpu_seconds"));
  p.counter("tandem_tools_killed_total", "tool calls tandemd killed", num("tools_killed"));
  p.counter("tandem_tool_throttles_total", "tool calls throttled under memory pressure", num("throttles"));
  p.counter("tandem_tool_freezes_total", "tool calls frozen under memory pressure", num("freezes"));
  // The warm pool of tool-call cgroups.
  const json pool = host.is_object() && host.contains("pool") ? host["pool"] : json();
  const auto pool_num = [&](const char* key) {
    return pool.is_object() && pool.contains(key) && pool[key].is_number() ? pool[key].get<double>() : 0.0;
  };
  p.gauge("tandem_tool_pool_ready", "tool-call cgroups made ahead and ready to hand out", pool_num("ready"));
  p.gauge("tandem_tool_pool_target", "ready tool-call cgroups the sessions' call rates ask for", pool_num("target"));
  p.counter("tandem_tool_pool_hits_total", "tool calls given a ready cgroup from the pool", pool_num("hits"));
  p.counter("tandem_tool_pool_misses_total", "tool calls that made their cgroup (the pool had none ready)",
            pool_num("misses"));
  const double mem_psi = num("memory_psi_some_avg10");
  const double cpu_psi = num("cpu_psi_some_avg10");
  if (host.is_object() && host.contains("memory_psi_some_avg10") && mem_psi >= 0) {
    p.gauge("tandem_pressure_some_avg10", "PSI some avg10 of the node (memory) and of the tools (cpu), percent",
            mem_psi, {{"resource", "memory"}});
  }
  if (host.is_object() && host.contains("cpu_psi_some_avg10") && cpu_psi >= 0) {
    p.gauge("tandem_pressure_some_avg10", "PSI some avg10 of the node (memory) and of the tools (cpu), percent",
            cpu_psi, {{"resource", "cpu"}});
  }

  // GPUs, from NVML.
  gpu_metrics(p, gpu_telemetry_->snapshot(), gpu_attribution());

  // The daemon itself.
  p.counter("tandem_control_ticks_total", "control ticks run", static_cast<double>(stats_.ticks));
  p.counter("tandem_control_tick_seconds_total", "time spent in control ticks", stats_.tick_seconds);
  p.gauge("tandem_control_tick_seconds_max", "the longest control tick since start", stats_.tick_seconds_max);
  p.counter("tandem_records_total", "ring records taken from clients, by result",
            static_cast<double>(stats_.records_accepted), {{"result", "accepted"}});
  p.counter("tandem_records_total", "ring records taken from clients, by result",
            static_cast<double>(stats_.records_rejected), {{"result", "rejected"}});
  p.counter("tandem_directives_total", "directives sent to engines", static_cast<double>(stats_.directives));
  p.counter("tandem_directive_ring_overflows_total",
            "directives dropped because an engine's directive ring and backlog were full",
            static_cast<double>(stats_.directives_dropped));
  p.counter("tandem_clients_refused_total", "connections refused at the handshake",
            static_cast<double>(stats_.clients_refused));
  p.counter("tandem_clients_dropped_total", "clients dropped for misbehaving",
            static_cast<double>(stats_.clients_dropped));
  p.counter("tandem_internal_errors_total", "exceptions caught in a handler (bugs), answered as errors",
            static_cast<double>(stats_.internal_errors));
  p.counter("tandem_clients_refused_limits_total",
            "connections refused by clients_per_uid, reserved_clients or the ctl cap",
            static_cast<double>(stats_.clients_refused_limits));
  p.counter("tandem_resync_refused_total", "resync entries refused", static_cast<double>(stats_.resync_refused));
  p.counter("tandem_accept_errors_total", "accept() failures (out of fds or memory)",
            static_cast<double>(stats_.accept_errors));
  return p.text();
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
      if ((c.offload_plan >> i & 1u) != 0) offloaded.push_back(i);
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
        {"sm_partition", c.sm_partition_set ? json(c.sm_partition) : json(nullptr)},
        {"blocks_total", pool},
        {"block_bytes", g != nullptr && g->block_bytes != 0 ? json(g->block_bytes) : json(nullptr)},
        {"projected_blocks", demand},
        {"pressure", pool != 0 ? json(static_cast<double>(demand) / pool) : json(nullptr)},
        {"sm_decode_sms", c.sm_partition_set && g != nullptr && c.sm_partition < g->decode_sms.size()
                              ? json(g->decode_sms[c.sm_partition])
                              : json(nullptr)},
        {"sm_partitions", g != nullptr ? json(g->decode_sms) : json::array()},
        {"device_sms", g != nullptr && g->has_pool() ? json(g->device_sms) : json(nullptr)},
        {"sm_op", g != nullptr && g->has_pool() ? json(GpuPlane::sm_op_of(*g)) : json(nullptr)},
        {"sm_op_profiled", g != nullptr && g->sm_op != 0},
        {"sm_dec", g != nullptr && g->published ? json(g->sm_dec) : json(nullptr)},
        {"weight_modules", g != nullptr ? g->offload.modules().size() : 0},
        {"offload_plan", c.offload_plan},
        {"offloaded_modules", offloaded},
        {"offload_freed_bytes", c.offload_freed_bytes},
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
