// The ctl server: tandemctl's requests, answered with JSON (docs/tandemctl.md
// shows the shapes; tandemctl renders the tables).
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

#include "daemon/ctl_service.h"
#include "daemon/metrics.h"
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

// What `policy set` appends to the configuration's source.
constexpr std::string_view kPolicySetSuffix = " + tandemctl policy set ";
// A ctl reply is one datagram (ipc::kMaxMessageSize): a session list stops
// growing past this many bytes and says it was truncated.
constexpr std::size_t kCtlListBudget = ipc::kMaxMessageSize - 4096;

}  // namespace

std::vector<std::uint8_t> CtlService::handle(Role role, const wire::CtlRequest& req) {
  using ipc::build_ctl_response;
  if (role != Role::kCtlRead && role != Role::kCtlAdmin) {
    return build_ctl_response(EPERM, "ctl requests need the ctl_read or ctl_admin role");
  }
  const std::string_view command = req.command()->string_view();
  const std::string_view cursor = req.cursor() != nullptr ? req.cursor()->string_view() : std::string_view();
  const auto page = [&](const Page& p) { return build_ctl_response(0, p.body, p.next); };
  commands_.refresh();
  const base::Time now = clock_.now();
  if (command == "status") return build_ctl_response(0, status(now));
  if (command == "engines") return page(engines(cursor));
  if (command == "sessions") return page(sessions(now, cursor));
  if (command == "tools") return page(tools(cursor));
  if (command == "gpu") return build_ctl_response(0, gpu(now));
  if (command == "metrics") return page(metrics(now, cursor));
  if (command == "events") {
    const std::string_view since =
        req.args() != nullptr && req.args()->size() == 1 ? req.args()->Get(0)->string_view() : std::string_view("0");
    return build_ctl_response(0, events(since));
  }
  if (command == "policy") {
    std::vector<std::string_view> args;
    if (req.args() != nullptr) {
      for (const auto* a : *req.args()) args.push_back(a->string_view());
    }
    if (args.empty() || (args.size() == 1 && args[0] == "get")) return build_ctl_response(0, policy());
    if (args.size() == 3 && args[0] == "set") {
      if (role != Role::kCtlAdmin) return build_ctl_response(EPERM, "policy set needs the ctl_admin role");
      std::string out;
      const int code = policy_set(args[1], args[2], out);
      return build_ctl_response(code, out);
    }
    return build_ctl_response(EINVAL, "policy takes: get | set KEY VALUE");
  }
  if (command == "session-kill" || command == "session-evict" || command == "drain" || command == "undrain" ||
      command == "reload") {
    if (role != Role::kCtlAdmin) {
      return build_ctl_response(EPERM, fmt::format("{} needs the ctl_admin role", command));
    }
    const bool session_cmd = command == "session-kill" || command == "session-evict";
    const std::size_t want = session_cmd ? 1 : 0;
    if ((req.args() == nullptr ? 0 : req.args()->size()) != want) {
      return build_ctl_response(EINVAL, session_cmd
                                            ? fmt::format("{} takes one argument: a session name or id", command)
                                            : fmt::format("{} takes no argument", command));
    }
    std::string out;
    int code = 0;
    if (command == "session-kill") {
      code = session_kill(req.args()->Get(0)->string_view(), now, out);
    } else if (command == "session-evict") {
      code = session_evict(req.args()->Get(0)->string_view(), now, out);
    } else if (command == "reload") {
      if (auto applied = commands_.reload(); applied) {
        out = text(json{{"reloaded", true},
                        {"source", view_.config().config().source},
                        {"policy", view_.config().config().policy},
                        {"epoch", view_.policy_epoch()}});
      } else {
        code = applied.error().code() != 0 ? applied.error().code() : EINVAL;
        out = applied.error().context();
      }
    } else {
      const bool on = command == "drain";
      if (on != view_.draining()) {
        spdlog::info("ctl: {} by an operator", on ? "draining: no new session is admitted" : "admitting again");
      }
      commands_.set_draining(on, now);
      const auto& table = view_.model().sessions();
      out = text(json{{"draining", view_.draining()},
                      {"waiting", table.count(sched::SessionState::kWaiting)},
                      {"live", table.size()}});
    }
    return build_ctl_response(code, out);
  }
  return build_ctl_response(
      EINVAL, fmt::format("unknown command \"{}\" (known: status, engines, sessions, tools, gpu, metrics, "
                          "events, policy, drain, undrain, reload, session-evict, session-kill)",
                          base::escape(command, 64)));
}

PidAttribution CtlService::gpu_attribution() const {
  std::map<pid_t, GpuClient> by_pid;
  view_.for_each_client([&](const ClientCard& c) {
    if (!c.active || c.pid <= 0) return;
    by_pid.emplace(c.pid, GpuClient{c.id, std::string(c.name), std::string(to_string(c.role))});
  });
  return PidAttribution(std::move(by_pid), std::string(kProcRoot));
}

std::string CtlService::gpu(base::Time now) const {
  json j = gpu_json(view_.gpu_telemetry().snapshot(), now, gpu_attribution());
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

CtlService::Page CtlService::tools(std::string_view cursor) const {
  json list;
  view_.host().tools(list);
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
    const auto m = view_.session(sid);
    e["name"] = m ? m->name : "";
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

sched::SessionId CtlService::find_live_session(std::string_view who, std::string& out) const {
  // An id (0x-prefixed or 16 hex digits) or a name.
  sched::SessionId id = 0;
  std::string_view hex = who.starts_with("0x") ? who.substr(2) : who;
  if (!hex.empty() && hex.size() <= 16 && (who.starts_with("0x") || hex.size() == 16) &&
      hex.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos) {
    id = std::stoull(std::string(hex), nullptr, 16);
  }
  const sched::SessionTable& table = view_.model().sessions();
  const sched::Session* s = id != 0 ? table.find(id) : nullptr;
  if (s == nullptr) {
    id = base::session_id(who);
    s = table.find(id);
  }
  if (s == nullptr || s->state == sched::SessionState::kDone) {
    out = fmt::format("no live session \"{}\"", base::escape(who, 128));
    return 0;
  }
  return id;
}

int CtlService::session_evict(std::string_view who, base::Time now, std::string& out) {
  const sched::SessionId id = find_live_session(who, out);
  if (id == 0) return ENOENT;
  const sched::Session* s = view_.model().sessions().find(id);
  if (s->engine == sched::kNoEngine) {
    out = fmt::format("session {:016x} has no KV on any engine yet", id);
    return EAGAIN;
  }
  // Its engine frees the KV (pins included) now, or at once after a round
  // in flight; the next round recomputes what it needs.
  spdlog::info("ctl: session {:#018x}'s KV evicted by an operator", id);
  commands_.evict_session(id, now);
  out = text(json{{"session", fmt::format("{:016x}", id)}, {"evicted", true}, {"engine", s->engine}});
  return 0;
}

int CtlService::session_kill(std::string_view who, base::Time now, std::string& out) {
  const sched::SessionId id = find_live_session(who, out);
  if (id == 0) return ENOENT;
  spdlog::info("ctl: session {:#018x} killed by an operator", id);
  // Dead is checked, never assumed: what is still alive — in its cgroups,
  // of its lineage, or unplaced — is reported, and the answer is an error.
  const std::vector<std::int32_t> alive = commands_.kill_session(id, now);
  if (!alive.empty()) {
    out = fmt::format("session {:016x} is closed, but {} of its processes are still alive: {}", id, alive.size(),
                      fmt::join(alive, ", "));
    spdlog::warn("ctl: {}", out);
    return EBUSY;
  }
  out = text(json{{"session", fmt::format("{:016x}", id)}, {"killed", true}});
  return 0;
}

std::string CtlService::status(base::Time now) const {
  const Config& cfg = view_.config().config();
  json clients = {{"engine", 0}, {"runner", 0}, {"ctl_read", 0}, {"ctl_admin", 0}};
  view_.for_each_client([&](const ClientCard& c) {
    if (!c.active) return;
    clients[std::string(to_string(c.role))] = clients[std::string(to_string(c.role))].get<int>() + 1;
  });
  const auto& table = view_.model().sessions();
  const ServerStats& stats = view_.stats();
  json j = {
      {"version", kVersion},
      {"pid", static_cast<std::int64_t>(::getpid())},
      {"uptime_s", base::to_seconds(now - view_.started())},
      {"runtime_dir", cfg.runtime_dir},
      {"config", cfg.source},
      {"policy", {{"name", cfg.policy}, {"epoch", view_.policy_epoch()}}},
      {"clients", clients},
      {"sessions",
       {{"total", table.size()},
        {"waiting", table.count(sched::SessionState::kWaiting)},
        {"reasoning", table.count(sched::SessionState::kReasoning)},
        {"acting", table.count(sched::SessionState::kActing)},
        {"paused", table.count(sched::SessionState::kPaused)}}},
      {"records",
       {{"accepted", stats.records_accepted}, {"rejected", stats.records_rejected}, {"late", stats.records_late}}},
      {"ticks", stats.ticks},
      {"actions", stats.actions},
      {"directives", stats.directives},
      {"directives_dropped", stats.directives_dropped},
      {"clients_refused", stats.clients_refused},
      {"clients_dropped", stats.clients_dropped},
      {"tools", {{"prepared", stats.tools_prepared}, {"refused", stats.tools_refused}}},
      {"internal_errors", stats.internal_errors},
      {"names_refused", stats.names_refused},
      {"clients_refused_limits", stats.clients_refused_limits},
      {"ctl_idle_closed", stats.ctl_idle_closed},
      {"accept_errors", stats.accept_errors},
      {"resync_refused", stats.resync_refused},
      {"sessions_detached", stats.sessions_detached},
      {"sessions_reattached", stats.sessions_reattached},
      {"sessions_restored", stats.sessions_restored},
      {"unplaced_tools", stats.unplaced_tools},
      {"effects",
       {{"cpu_weight", stats.effects_cpu_weight},
        {"cpu_quota", stats.effects_cpu_quota},
        {"sm_partition", stats.effects_sm_partition},
        {"kill_tools", stats.effects_kill_tools}}},
  };
  json host;
  view_.host().status(host);
  j["host"] = host.is_null() ? json{{"cgroups", "off"}, {"telemetry_mode", "off"}} : host;
  if (auto w = view_.policy().admission_window()) {
    j["admission_window"] = *w;
  } else {
    j["admission_window"] = nullptr;  // the policy admits every session
  }
  j["draining"] = view_.draining();
  const Footprint f = view_.footprint();
  j["tables"] = {{"clients", f.clients},
                 {"sessions", f.sessions},
                 {"session_meta", f.session_meta},
                 {"pending_names", f.pending_names},
                 {"owners", f.owners},
                 {"held_owners", f.detached},
                 {"tombstones", f.tombstones}};
  j["nvml"] = gpu_status(view_.gpu_telemetry().snapshot());
  const MetricsEndpoints& metrics = view_.metrics();
  j["metrics"] = {{"listen", metrics.node().listen()},
                  {"scrapes", metrics.node().endpoint ? metrics.node().endpoint->scrapes() : 0}};
  if (!metrics.engines().empty()) {
    json engines = json::object();
    for (const auto& e : metrics.engines()) {
      engines[e.name] = {{"listen", e.listen()}, {"scrapes", e.endpoint ? e.endpoint->scrapes() : 0}};
    }
    j["metrics"]["engines"] = std::move(engines);
  }
  j["kv_events"] = {{"endpoint", view_.kv_events_state()},
                    {"published", view_.stats().kv_events_published},
                    {"dropped", view_.stats().kv_events_dropped}};
  return text(j);
}

std::string CtlService::events(std::string_view since_text) const {
  const EventLog& log = view_.events();
  const std::uint64_t since = base::parse_int<std::uint64_t>(since_text).value_or(0);
  // Names: of live sessions from their meta, of ended ones from the close
  // (or kill) event that kept theirs.
  std::unordered_map<sched::SessionId, std::string_view> names;
  for (std::size_t i = 0; i < log.size(); ++i) {
    const EventLog::Entry& e = log.at(i);
    if (const std::string_view n = log.name(e); !n.empty()) names[e.session] = n;
  }
  view_.for_each_session([&](sched::SessionId id, const SessionCard& m) {
    if (!m.name.empty()) names[id] = m.name;
  });
  json list = json::array();
  std::size_t bytes = 0;
  std::uint64_t next = since;
  for (std::size_t i = 0; i < log.size(); ++i) {
    const EventLog::Entry& e = log.at(i);
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
  return text(json{{"events", list}, {"next", next}, {"lost", log.lost_after(since)}});
}

std::string CtlService::policy() const {
  const CompiledConfig& config = view_.config();
  const Config& cfg = config.config();
  json params = json::object();
  for (const auto& [k, v] : config.params().values()) params[k] = v;
  json specs = json::array();
  for (const sched::ParamSpec& p : config.policy().params) {
    specs.push_back({{"name", p.name}, {"default", p.default_value}, {"min", p.min}, {"max", p.max}, {"doc", p.doc}});
  }
  return text(json{{"name", cfg.policy},
                   {"epoch", view_.policy_epoch()},
                   {"tick_ms", std::chrono::duration_cast<std::chrono::milliseconds>(cfg.tick).count()},
                   {"source", cfg.source},
                   {"params", params},
                   {"specs", specs}});
}

int CtlService::policy_set(std::string_view key, std::string_view value, std::string& out) {
  // The running configuration with one key changed, validated and compiled
  // like a file: a bad value changes nothing and says why.
  for (const std::string_view arg : {key, value}) {
    if (auto ok = base::check_name(arg, "policy set's argument"); !ok) {
      out = ok.error().context();
      return ok.error().code();
    }
  }
  Config next = view_.config().config();
  if (auto ok = set_policy_key(next, key, value); !ok) {
    out = ok.error().context();
    return EINVAL;
  }
  // The source names the file and the keys set since it was read, each
  // once: however many `policy set`s follow, it stays as short as the
  // policy's parameter list.
  std::set<std::string> keys = policy_set_keys_;
  keys.insert(std::string(key));
  const std::string& source = view_.config().config().source;
  const auto suffix = source.find(kPolicySetSuffix);
  next.source = fmt::format("{}{}{}", source.substr(0, suffix), kPolicySetSuffix, fmt::join(keys, ", "));
  auto compiled = CompiledConfig::compile(std::move(next));
  if (!compiled) {
    out = compiled.error().context();
    return compiled.error().code() != 0 ? compiled.error().code() : EINVAL;
  }
  if (auto applied = commands_.apply_config(std::move(*compiled), "policy set"); !applied) {
    out = applied.error().context();
    return EINVAL;
  }
  policy_set_keys_ = std::move(keys);
  out = policy();
  return 0;
}

CtlService::Page CtlService::engines(std::string_view cursor) const {
  const std::uint32_t after = base::parse_int<std::uint32_t>(cursor).value_or(0);
  const sched::NodeModel& model = view_.model();
  std::map<sched::EngineId, std::uint32_t> sessions;
  for (const sched::Session* s : model.sessions().by_id()) {
    if (s->state != sched::SessionState::kDone && s->engine != sched::kNoEngine) ++sessions[s->engine];
  }
  const auto projected = GpuPlane::projected_blocks(model.sessions());
  json list = json::array();
  std::size_t bytes = 0;
  std::size_t total = 0;
  std::string next;
  view_.for_each_client([&](const ClientCard& c) {
    const std::uint32_t id = c.id;
    if (!c.active || c.role != Role::kEngine) return;
    ++total;
    if (id <= after || !next.empty()) return;
    if (bytes > kCtlListBudget) {
      next = std::to_string(list.back()["id"].get<std::uint32_t>());
      return;
    }
    const sched::EngineView* v = model.engine(id);
    const sched::KvPoolStats kv = v != nullptr ? v->kv : sched::KvPoolStats{};
    const std::uint32_t pool = v != nullptr && v->has_stats ? kv.blocks_total : c.engine.total_blocks;
    const auto p = projected.find(id);
    const std::uint64_t demand = p == projected.end() ? 0 : p->second;
    const EngineGpu* g = view_.gpu_plane().engine(id);
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
        {"records_late", c.late},
    });
    bytes += text(list.back()).size() + 1;
  });
  return {text(json{{"engines", list}, {"total", total}, {"truncated", !next.empty()}}), next};
}

CtlService::Page CtlService::metrics(base::Time now, std::string_view cursor) const {
  // Text, a page at a time, each ending at a line's end: the cursor is the
  // offset where the next page starts.
  const std::string all = metrics_text(now);
  const std::size_t from = std::min<std::size_t>(base::parse_int<std::size_t>(cursor).value_or(0), all.size());
  if (all.size() - from <= kCtlListBudget) return {all.substr(from), ""};
  std::size_t end = all.rfind('\n', from + kCtlListBudget);
  end = end == std::string::npos || end < from ? from + kCtlListBudget : end + 1;
  return {all.substr(from, end - from), std::to_string(end)};
}

CtlService::Page CtlService::sessions(base::Time now, std::string_view cursor) const {
  // In id order, a page at a time: the cursor is the last id shown.
  const std::uint64_t after = cursor.empty() ? 0 : std::strtoull(std::string(cursor).c_str(), nullptr, 16);
  const sched::SessionTable& table = view_.model().sessions();
  std::vector<sched::SessionId> ids;
  for (const sched::Session* s : table.by_id()) {
    if (s->state != sched::SessionState::kDone) ids.push_back(s->id);
  }
  json list = json::array();
  std::size_t bytes = 0;
  std::string next;
  for (sched::SessionId id : ids) {
    if (id <= after) continue;
    const sched::Session& s = *table.find(id);
    if (bytes > kCtlListBudget) {
      next = fmt::format("{:016x}", list.empty() ? id : std::stoull(list.back()["id"].get<std::string>(), nullptr, 16));
      break;
    }
    const SessionCard meta = view_.session(id).value_or(SessionCard{});
    const std::uint32_t owner_client = meta.owner_client;
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
