// tandemctl's renderers (render.h). Every lookup goes through cell()/number()
// so that a missing key, a null or a wrong type is one "-", never an
// exception: nlohmann's typed getters throw on a type mismatch, so they are
// only called after the type has been checked.
#include "ctl/render.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace tandem::ctl {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, 15> kCommands = {"status", "engines",      "sessions",      "tools",   "metrics",
                                                        "events", "top",          "policy",        "drain",   "undrain",
                                                        "reload", "session-kill", "session-evict", "session", "gpu"};

// The keys `status` is documented to carry (docs/tandemctl.md), in display
// order.
constexpr std::array<std::string_view, 38> kStatusKeys = {
    // the daemon
    "version", "pid", "uptime_s", "runtime_dir", "policy.name", "policy.epoch", "admission_window", "metrics.listen",
    // connected clients by role
    "clients.engine", "clients.runner", "clients.ctl_read", "clients.ctl_admin",
    // sessions by state
    "sessions.total", "sessions.waiting", "sessions.reasoning", "sessions.acting", "sessions.paused",
    // activity counters
    "records.accepted", "records.rejected", "records.late", "ticks", "directives",
    // side effects applied, by kind
    "effects.cpu_weight", "effects.cpu_quota", "effects.sm_partition", "effects.kill_tools",
    // the host plane: cgroups, telemetry and its mode, memory pressure
    "host.cgroups", "host.telemetry_mode", "host.telemetry", "host.sessions", "host.tool_cgroups",
    "host.memory_pressure", "tools.prepared",
    // the warm pool of tool-call cgroups, and the cgroup2 mount's favordynmods
    "host.pool.ready", "host.pool.hits", "host.pool.hit_rate", "host.ahead.held", "host.favordynmods"};

// The member `key` of `object`, or nullptr (also when `object` is not an
// object).
const json* member(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::optional<double> number(const json& object, std::string_view key) {
  const json* v = member(object, key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  return v->get<double>();
}

// At most three decimals, trailing zeros dropped: "12.5", "1.511", "3".
// The daemon sends durations with nanosecond digits nobody reads.
std::string format_float(double v) {
  std::string s = fmt::format("{:.3f}", v);
  if (s.find('.') == std::string::npos) return s;  // inf, nan
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// A scalar as text; nullopt for null and containers.
std::optional<std::string> scalar_text(const json& v) {
  switch (v.type()) {
    case json::value_t::string:
      return clean(v.get_ref<const std::string&>());
    case json::value_t::number_integer:
      return fmt::format("{}", v.get<std::int64_t>());
    case json::value_t::number_unsigned:
      return fmt::format("{}", v.get<std::uint64_t>());
    case json::value_t::number_float:
      return format_float(v.get<double>());
    case json::value_t::boolean:
      return std::string(v.get<bool>() ? "yes" : "no");
    default:
      return std::nullopt;
  }
}

// A JSON value as one line of text, whatever it holds; invalid UTF-8 is
// replaced rather than thrown about.
std::string compact(const json& v) { return clean(v.dump(-1, ' ', false, json::error_handler_t::replace)); }

// Walks a dotted path ("policy.name") from `root`.
const json* at_path(const json& root, std::string_view path) {
  const json* v = &root;
  while (v != nullptr) {
    auto dot = path.find('.');
    v = member(*v, path.substr(0, dot));
    if (dot == std::string_view::npos) break;
    path.remove_prefix(dot + 1);
  }
  return v;
}

// Every leaf under `v` as (dotted key, text), in the object's order
// (nlohmann's default object is sorted by key).
void flatten(const json& v, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (v.is_object()) {
    for (const auto& [key, child] : v.items()) {
      flatten(child, prefix.empty() ? clean(key) : prefix + "." + clean(key), out);
    }
    return;
  }
  if (v.is_array()) {
    out.emplace_back(prefix, compact(v));
    return;
  }
  out.emplace_back(prefix, scalar_text(v).value_or(std::string(kMissing)));
}

// A session id as 16 hex digits: the daemon sends "0x%016x"; a bare number
// is accepted too.
std::string session_id_cell(const json& session) {
  const json* v = member(session, "id");
  if (v == nullptr) return std::string(kMissing);
  if (v->is_number_unsigned()) return fmt::format("{:016x}", v->get<std::uint64_t>());
  if (!v->is_string()) return std::string(kMissing);
  std::string_view s = v->get_ref<const std::string&>();
  if (s.starts_with("0x") || s.starts_with("0X")) s.remove_prefix(2);
  bool hex = !s.empty() && s.size() <= 16 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
  if (!hex) return clean(v->get_ref<const std::string&>());
  std::string out(16 - s.size(), '0');
  for (char c : s) out += static_cast<char>(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c);
  return out;
}

std::string gpu_cell(const json& engine) {
  auto gpu = number(engine, "gpu");
  if (gpu && *gpu < 0) return std::string(kMissing);  // -1: no GPU / unknown
  return cell(engine, "gpu");
}

std::string percent_cell(const json& object, std::string_view key) {
  auto v = number(object, key);
  return v ? fmt::format("{:.1f}", *v * 100.0) : std::string(kMissing);
}

// "tokens/ms" of the last engine step.
std::string step_cell(const json& engine) {
  auto us = number(engine, "step_time_us");
  if (!member(engine, "step_tokens") && !us) return std::string(kMissing);
  return fmt::format("{}/{}", cell(engine, "step_tokens"), us ? fmt::format("{:.1f}", *us / 1000.0) : kMissing);
}

// "INDEX/DECODE_SMS" of the published partition; "-" when none is.
std::string sm_cell(const json& engine) {
  auto index = number(engine, "sm_partition");
  if (!index) return std::string(kMissing);
  return fmt::format("{}/{}", cell(engine, "sm_partition"), cell(engine, "sm_decode_sms"));
}

// "OFFLOADED/KNOWN FREED" of the weight-offload plan ("1/3 0.80G"); "-" for
// an engine that described no weight modules.
std::string offload_cell(const json& engine) {
  auto known = number(engine, "weight_modules");
  if (!known || *known <= 0) return std::string(kMissing);
  std::size_t offloaded = 0;
  if (const json* m = member(engine, "offloaded_modules"); m != nullptr && m->is_array()) offloaded = m->size();
  auto freed = number(engine, "offload_freed_bytes");
  return fmt::format("{}/{} {}", offloaded, cell(engine, "weight_modules"),
                     freed ? fmt::format("{:.2f}G", *freed / 1e9) : std::string(kMissing));
}

base::Result<const json*> list(const json& reply, std::string_view key) {
  const json* v = member(reply, key);
  if (v == nullptr || !v->is_array()) {
    return base::make_error(EBADMSG, fmt::format("{}: the daemon's reply has no \"{}\" list", key, key));
  }
  return v;
}

}  // namespace

bool known_command(std::string_view command) {
  return std::find(kCommands.begin(), kCommands.end(), command) != kCommands.end();
}

std::string clean(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return out;
}

std::string cell(const json& object, std::string_view key) {
  const json* v = member(object, key);
  if (v == nullptr) return std::string(kMissing);
  auto text = scalar_text(*v);
  if (!text || text->empty()) return std::string(kMissing);
  return *text;
}

std::string format_age(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return std::string(kMissing);
  if (seconds < 59.95) return fmt::format("{:.1f}s", seconds);
  if (seconds >= 1e12) return fmt::format("{:.0f}d", seconds / 86400);  // keeps the casts below in range
  auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d{:02}h", s / 86400, s % 86400 / 3600);
}

std::string format_table(const Table& table) {
  std::size_t n = table.header.size();
  std::vector<std::size_t> width(n, 0);
  auto cell_at = [&](const std::vector<std::string>& row, std::size_t i) -> std::string_view {
    return i < row.size() ? std::string_view(row[i]) : kMissing;
  };
  for (std::size_t i = 0; i < n; ++i) {
    width[i] = table.header[i].size();
    for (const auto& row : table.rows) width[i] = std::max(width[i], cell_at(row, i).size());
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& row) {
    std::string text;
    for (std::size_t i = 0; i < n; ++i) {
      std::string_view c = cell_at(row, i);
      std::size_t pad = width[i] - c.size();
      bool right = i < table.right_aligned.size() && table.right_aligned[i];
      if (i > 0) text += "  ";
      if (right) text.append(pad, ' ');
      text += c;
      if (!right) text.append(pad, ' ');
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text;
    out += '\n';
  };
  line(table.header);
  if (table.rows.empty()) out += "(none)\n";
  for (const auto& row : table.rows) line(row);
  return out;
}

base::Result<Table> engines_table(const json& reply) {
  auto engines = list(reply, "engines");
  if (!engines) return base::propagate(std::move(engines.error()));
  Table t;
  t.header = {"ID",   "NAME",   "PID", "GPU",  "KV%",    "TOTAL",        "FREE", "PINNED", "OFFL",
              "PROJ", "PRESS%", "RUN", "WAIT", "QUEUED", "STEP(tok/ms)", "SESS", "SM",     "OFFLOAD"};
  t.right_aligned = {true, false, true, true, true, true, true, true,  true,
                     true, true,  true, true, true, true, true, false, false};
  for (const json& e : **engines) {
    t.rows.push_back({cell(e, "id"), cell(e, "name"), cell(e, "pid"), gpu_cell(e), percent_cell(e, "usage"),
                      cell(e, "blocks_total"), cell(e, "free_blocks"), cell(e, "pinned_blocks"),
                      cell(e, "offloaded_blocks"), cell(e, "projected_blocks"), percent_cell(e, "pressure"),
                      cell(e, "running"), cell(e, "waiting"), cell(e, "queued_blocks"), step_cell(e),
                      cell(e, "sessions"), sm_cell(e), offload_cell(e)});
  }
  return t;
}

base::Result<Table> sessions_table(const json& reply) {
  auto sessions = list(reply, "sessions");
  if (!sessions) return base::propagate(std::move(sessions.error()));
  Table t;
  t.header = {"ID", "NAME", "STATE", "KV", "BLOCKS", "ENGINE", "ROUND", "AGE", "TOOL", "CPU.W"};
  t.right_aligned = {false, false, false, false, true, true, true, true, false, true};
  for (const json& s : **sessions) {
    auto age = number(s, "age_s");
    t.rows.push_back({session_id_cell(s), cell(s, "name"), cell(s, "state"), cell(s, "residency"),
                      cell(s, "blocks_held"), cell(s, "engine"), cell(s, "round"),
                      age ? format_age(*age) : std::string(kMissing), cell(s, "in_tool"), cell(s, "cpu_weight")});
  }
  return t;
}

base::Result<Table> tools_table(const json& reply) {
  auto sessions = list(reply, "sessions");
  if (!sessions) return base::propagate(std::move(sessions.error()));
  Table t;
  t.header = {"SESSION", "NAME", "CALLS", "PROCS", "CPU", "MEMORY", "CPU.W", "STATE"};
  t.right_aligned = {false, false, true, true, true, true, true, false};
  for (const json& s : **sessions) {
    std::size_t calls = 0;
    std::string state;
    if (const json* c = member(s, "calls"); c != nullptr && c->is_array()) {
      calls = c->size();
      std::size_t throttled = 0;
      std::size_t frozen = 0;
      for (const json& call : *c) {
        if (call.is_object() && call.value("throttled", false)) ++throttled;
        if (call.is_object() && call.value("frozen", false)) ++frozen;
      }
      if (throttled > 0) state += fmt::format("{} throttled", throttled);
      if (frozen > 0) state += fmt::format("{}{} frozen", state.empty() ? "" : ", ", frozen);
    }
    if (s.value("orphan", false)) state += state.empty() ? "orphan" : ", orphan";
    if (s.value("pinned", false)) state += state.empty() ? "protected" : ", protected";
    auto cpu_ns = number(s, "cpu_ns");
    auto mem = number(s, "memory_bytes");
    t.rows.push_back({cell(s, "session"), cell(s, "name"), std::to_string(calls), cell(s, "processes"),
                      cpu_ns ? fmt::format("{:.2f}s", *cpu_ns / 1e9) : std::string(kMissing),
                      mem ? fmt::format("{:.1f}M", *mem / 1048576.0) : std::string(kMissing), cell(s, "cpu_weight"),
                      state.empty() ? "-" : state});
  }
  return t;
}

base::Result<std::string> render_status(const json& reply) {
  if (!reply.is_object()) return base::make_error(EBADMSG, "status: the daemon's reply is not an object");
  std::vector<std::pair<std::string, std::string>> lines;
  for (std::string_view key : kStatusKeys) {
    const json* v = at_path(reply, key);
    std::string text(kMissing);
    if (v != nullptr) text = v->is_structured() ? compact(*v) : scalar_text(*v).value_or(std::string(kMissing));
    lines.emplace_back(std::string(key), text);
  }
  std::vector<std::pair<std::string, std::string>> all;
  flatten(reply, "", all);
  for (auto& [key, text] : all) {
    bool documented = std::find(kStatusKeys.begin(), kStatusKeys.end(), key) != kStatusKeys.end();
    if (!documented) lines.emplace_back(std::move(key), std::move(text));
  }
  std::size_t width = 0;
  for (const auto& [key, text] : lines) width = std::max(width, key.size());
  std::string out;
  for (const auto& [key, text] : lines) out += fmt::format("{:<{}} {}\n", key + ":", width + 1, text);
  return out;
}

base::Result<std::string> render(std::string_view command, std::string_view body, bool json_out) {
  // Prometheus text, as the endpoint serves it (with or without --json).
  if (command == "metrics") return std::string(body);
  json reply = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded()) {
    return base::make_error(EBADMSG, fmt::format("{}: the daemon's reply is not valid JSON", clean(command)));
  }
  if (json_out) return reply.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  base::Result<Table> table = base::make_error(EINVAL, fmt::format("unknown command '{}'", clean(command)));
  if (command == "status") return render_status(reply);
  if (command == "engines") table = engines_table(reply);
  if (command == "sessions") table = sessions_table(reply);
  if (command == "tools") table = tools_table(reply);
  if (command == "gpu") return render_gpu(reply);
  if (command == "policy") return render_policy(reply);
  if (command == "drain" || command == "undrain") {
    const bool on = reply.is_object() && reply.value("draining", false);
    return on ? fmt::format("draining: no new session is admitted ({} waiting, {} live)\n", cell(reply, "waiting"),
                            cell(reply, "live"))
              : std::string("admitting new sessions\n");
  }
  if (command == "reload") {
    return fmt::format("reloaded {}: policy {} (epoch {})\n", cell(reply, "source"), cell(reply, "policy"),
                       cell(reply, "epoch"));
  }
  if (command == "session-evict") {
    return fmt::format("session {}: its KV on engine {} is dropped; its next round recomputes it\n",
                       cell(reply, "session"), cell(reply, "engine"));
  }
  if (command == "session-kill") {
    if (!reply.is_object() || !reply.contains("session")) {
      return base::make_error(EBADMSG, "session-kill: the daemon's reply has no session");
    }
    return fmt::format("session {} killed: its tools are dead and its cgroups gone\n", cell(reply, "session"));
  }
  if (!table) return base::propagate(std::move(table.error()));
  std::string out = format_table(*table);
  // A reply is one datagram: the daemon lists what fits and says so.
  const json* truncated = at_path(reply, "truncated");
  const json* total = at_path(reply, "total");
  if (truncated != nullptr && truncated->is_boolean() && truncated->get<bool>() && total != nullptr &&
      total->is_number_unsigned()) {
    out += fmt::format("({} of {} shown: the reply holds what fits in one message; counts are in tandemctl status)\n",
                       table->rows.size(), total->get<std::uint64_t>());
  }
  return out;
}

base::Result<std::string> render_policy(const json& reply) {
  if (!reply.is_object() || !reply.contains("params") || !reply["params"].is_object()) {
    return base::make_error(EBADMSG, "policy: the daemon's reply has no params");
  }
  std::string out = fmt::format("policy {} (epoch {}, tick {} ms) from {}\n", cell(reply, "name"), cell(reply, "epoch"),
                                cell(reply, "tick_ms"), cell(reply, "source"));
  Table t;
  t.header = {"PARAMETER", "VALUE", "DEFAULT", "RANGE", "MEANING"};
  t.right_aligned = {false, true, true, false, false};
  const json* specs = member(reply, "specs");
  for (const auto& [name, value] : reply["params"].items()) {
    std::vector<std::string> row = {clean(name), scalar_text(value).value_or(std::string(kMissing)),
                                    std::string(kMissing), std::string(kMissing), std::string(kMissing)};
    if (specs != nullptr && specs->is_array()) {
      for (const json& spec : *specs) {
        if (!spec.is_object() || spec.value("name", "") != name) continue;
        row[2] = cell(spec, "default");
        row[3] = fmt::format("{} .. {}", cell(spec, "min"), cell(spec, "max"));
        row[4] = cell(spec, "doc");
      }
    }
    t.rows.push_back(std::move(row));
  }
  return out + format_table(t);
}

base::Result<std::string> render_events(std::string_view body, bool json_out, std::uint64_t& since) {
  json reply = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!reply.is_object() || !reply.contains("events") || !reply["events"].is_array()) {
    return base::make_error(EBADMSG, "events: the daemon's reply has no events list");
  }
  std::string out;
  const json* lost = member(reply, "lost");
  if (lost != nullptr && lost->is_number_unsigned() && lost->get<std::uint64_t>() > 0 && since > 0) {
    out += fmt::format("({} events left the daemon's log before they were read)\n", lost->get<std::uint64_t>());
  }
  for (const json& e : reply["events"]) {
    if (!e.is_object()) continue;
    if (json_out) {
      out += e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    } else {
      std::string who;
      if (e.contains("name")) who = cell(e, "name");
      if (e.contains("session")) who += who.empty() ? cell(e, "session") : " (" + cell(e, "session") + ")";
      std::string line = fmt::format("+{:>10}  {:<13}", cell(e, "t") + "s", cell(e, "kind"));
      if (!who.empty()) line += "  " + who;
      if (e.contains("detail")) line += "  " + cell(e, "detail");
      out += line + "\n";
    }
    if (e.contains("seq") && e["seq"].is_number_unsigned()) since = std::max(since, e["seq"].get<std::uint64_t>());
  }
  return out;
}

base::Result<std::string> render_top_part(std::string_view command, std::string_view body) {
  json reply = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded()) return base::make_error(EBADMSG, fmt::format("{}: not valid JSON", clean(command)));
  if (command == "status") {
    // A value by dotted path, as a cell ("-" when absent).
    const auto at = [&](std::string_view path) {
      const json* v = at_path(reply, path);
      return v == nullptr ? std::string(kMissing) : scalar_text(*v).value_or(std::string(kMissing));
    };
    const json* mem = at_path(reply, "host.tools_memory_bytes");
    const json* up = at_path(reply, "uptime_s");
    const json* draining = at_path(reply, "draining");
    return fmt::format(
        "tandemd {}  up {}  policy {} (window {}){}\n"
        "sessions {}: {} waiting, {} reasoning, {} acting, {} paused   clients: {} engines, {} runners\n"
        "host: memory pressure {} (PSI {} %), {} tool cgroups, {} MiB; pool {} ready, hit rate {}; {} ahead; "
        "favordynmods {}\n\n",
        at("version"), up != nullptr && up->is_number() ? format_age(up->get<double>()) : std::string(kMissing),
        at("policy.name"), at("admission_window"),
        draining != nullptr && draining->is_boolean() && draining->get<bool>() ? "  DRAINING" : "",
        at("sessions.total"), at("sessions.waiting"), at("sessions.reasoning"), at("sessions.acting"),
        at("sessions.paused"), at("clients.engine"), at("clients.runner"), at("host.memory_pressure"),
        at("host.memory_psi_some_avg10"), at("host.tool_cgroups"),
        mem != nullptr && mem->is_number() ? fmt::format("{:.1f}", mem->get<double>() / (1024.0 * 1024.0))
                                           : std::string(kMissing),
        at("host.pool.ready"), at("host.pool.hit_rate"), at("host.ahead.held"), at("host.favordynmods"));
  }
  auto table = command == "engines" ? engines_table(reply) : sessions_table(reply);
  if (!table) return base::propagate(std::move(table.error()));
  return format_table(*table) + "\n";
}

}  // namespace tandem::ctl
