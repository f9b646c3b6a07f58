// The ctl server: tandemctl's requests, answered with JSON (docs/tandemctl.md
// shows the shapes; tandemctl renders the tables).
#include <cctype>

#include <fmt/format.h>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"

#include "daemon/server.h"

namespace tandem::daemon {
namespace {

using nlohmann::json;

json optional_int(std::int64_t v) { return v < 0 ? json(nullptr) : json(v); }

// "reasoning" for REASONING: ctl's JSON keys and values are lower case.
template <class E>
std::string lower(E value) {
  std::string s(sched::to_string(value));
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

constexpr std::string_view kVersion = "0.1.0";
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
  // Records below a ring's wake-up watermark wait for the tick: take them
  // now, so an answer is never a tick stale.
  for (auto& [id, other] : clients_) other.pending = other.has_channel && !other.doomed;
  pump();
  const base::Time now = clock_.now();
  if (command == "status") {
    send_message(c, ipc::build_ctl_response(0, ctl_status(now)));
  } else if (command == "engines") {
    send_message(c, ipc::build_ctl_response(0, ctl_engines()));
  } else if (command == "sessions") {
    send_message(c, ipc::build_ctl_response(0, ctl_sessions(now)));
  } else if (command == "tools") {
    send_message(c, ipc::build_ctl_response(0, ctl_tools()));
  } else if (command == "session-kill") {
    if (c.role != Role::kCtlAdmin) {
      send_message(c, ipc::build_ctl_response(EPERM, "session-kill needs the ctl_admin role"));
      return;
    }
    if (req.args() == nullptr || req.args()->size() != 1) {
      send_message(c, ipc::build_ctl_response(EINVAL, "session-kill takes one argument: a session name or id"));
      return;
    }
    std::string out;
    const int code = ctl_session_kill(req.args()->Get(0)->string_view(), now, out);
    send_message(c, ipc::build_ctl_response(code, out));
  } else {
    send_message(
        c, ipc::build_ctl_response(
               EINVAL, fmt::format("unknown command \"{}\" (known: status, engines, sessions, tools, session-kill)",
                                   command.substr(0, 64))));
  }
}

std::string Server::ctl_tools() const {
  json list;
  effects_->tools(list);
  if (list.is_null()) list = json::array();
  // Names, where known.
  for (auto& entry : list) {
    const auto id = std::stoull(entry.value("session", std::string("0")), nullptr, 16);
    auto m = meta_.find(id);
    entry["name"] = m == meta_.end() ? "" : m->second.name;
  }
  json out = {{"sessions", list}};
  std::string text = out.dump();
  if (text.size() > kCtlListBudget) {
    json cut = json::array();
    std::size_t size = 0;
    for (const auto& e : list) {
      size += e.dump().size();
      if (size > kCtlListBudget) break;
      cut.push_back(e);
    }
    text = json{{"sessions", cut}, {"total", list.size()}, {"truncated", true}}.dump();
  }
  return text;
}

int Server::ctl_session_kill(std::string_view who, base::Time now, std::string& out) {
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
    out = fmt::format("no live session \"{}\"", who.substr(0, 128));
    return ENOENT;
  }
  spdlog::info("ctl: session {:#018x} killed by an operator", id);
  effects_->kill_tools(id, ipc::ToolExitReason::kKilledSession);
  ++stats_.effects_kill_tools;
  (void)feed(sched::SessionClosed{id}, now);
  session_done(id);
  model_.sessions().reap_done();
  out = json{{"session", fmt::format("{:016x}", id)}, {"killed", true}}.dump();
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
      {"effects",
       {{"cpu_weight", stats_.effects_cpu_weight},
        {"cpu_quota", stats_.effects_cpu_quota},
        {"sm_partition", stats_.effects_sm_partition},
        {"kill_tools", stats_.effects_kill_tools}}},
  };
  json host;
  effects_->status(host);
  j["host"] = host.is_null() ? json{{"cgroups", "off"}, {"telemetry_mode", "off"}} : host;
  return j.dump();
}

std::string Server::ctl_engines() const {
  std::map<sched::EngineId, std::uint32_t> sessions;
  for (const auto& [id, s] : model_.sessions().sessions()) {
    if (s.state != sched::SessionState::kDone && s.engine != sched::kNoEngine) ++sessions[s.engine];
  }
  json list = json::array();
  for (const auto& [id, c] : clients_) {
    if (c.doomed || c.phase != Phase::kActive || c.role != Role::kEngine) continue;
    const sched::EngineView* v = model_.engine(id);
    const sched::KvPoolStats kv = v != nullptr ? v->kv : sched::KvPoolStats{};
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
        {"records_accepted", c.accepted},
        {"records_rejected", c.rejected},
    });
  }
  return json{{"engines", list}}.dump();
}

std::string Server::ctl_sessions(base::Time now) const {
  json list = json::array();
  std::size_t total = 0;
  std::size_t bytes = 0;
  for (const auto& [id, s] : model_.sessions().sessions()) {
    if (s.state == sched::SessionState::kDone) continue;
    ++total;
    if (bytes > kCtlListBudget) continue;  // counted, not listed: the reply must fit one datagram
    auto m = meta_.find(id);
    const SessionMeta meta = m != meta_.end() ? m->second : SessionMeta{};
    list.push_back({
        {"id", fmt::format("{:#018x}", id)},
        {"name", meta.name},
        {"state", lower(s.state)},
        {"residency", lower(s.residency)},
        {"engine", s.engine == sched::kNoEngine ? json(nullptr) : json(s.engine)},
        {"owner", meta.owner == 0 ? json(nullptr) : json(meta.owner)},
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
    bytes += list.back().dump().size() + 1;
  }
  return json{{"sessions", list}, {"total", total}, {"truncated", list.size() < total}}.dump();
}

}  // namespace tandem::daemon
