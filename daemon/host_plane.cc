#include "daemon/host_plane.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/parse.h"
#include "cpu/cgroup_dirs.h"
#include "cpu/spawn.h"

namespace tandem::daemon {
namespace {

using base::Time;

constexpr int kKillWaitMs = 200;  // how long one kill waits for the processes to go

std::string session_dir(sched::SessionId s) { return fmt::format("tools/{:016x}", s); }
std::string call_dir(sched::SessionId s, std::uint32_t call) { return fmt::format("tools/{:016x}/{}", s, call); }

// Cores in a cpu list ("0-3,6" → 5); 0 for an empty or malformed list.
std::uint32_t count_cpus(std::string_view list) {
  std::uint32_t n = 0;
  for (std::string_view part : base::split(list, ',', true)) {
    const auto dash = part.find('-');
    auto lo = base::parse_int<std::uint32_t>(part.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : base::parse_int<std::uint32_t>(part.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) return 0;
    n += *hi - *lo + 1;
  }
  return n;
}

// The smaller of two limits where 0 means "none".
std::uint64_t tighter(std::uint64_t a, std::uint64_t b) {
  if (a == 0) return b;
  if (b == 0) return a;
  return std::min(a, b);
}

std::string_view to_string(ipc::ToolExitReason r) {
  switch (r) {
    case ipc::ToolExitReason::kExited:
      return "exited";
    case ipc::ToolExitReason::kSignaled:
      return "signaled";
    case ipc::ToolExitReason::kOomKilled:
      return "oom-killed";
    case ipc::ToolExitReason::kKilledMemory:
      return "killed-memory";
    case ipc::ToolExitReason::kKilledPolicy:
      return "killed-policy";
    case ipc::ToolExitReason::kKilledSession:
      return "killed-session";
  }
  return "unknown";
}

}  // namespace

HostPlane::HostPlane(const HostConfig& config, const HostEnv& env, std::unique_ptr<cpu::CgroupManager> cgroups)
    : config_(config),
      proc_root_(env.proc_root),
      cgroups_(std::move(cgroups)),
      memory_rule_(sched::HostMemoryConfig{config.pressure_high, config.pressure_critical, config.tools_budget,
                                           config.stall_kill_after}) {}

HostPlane::~HostPlane() {
  if (!lock_) return;  // never started: the subtree may be another tandemd's
  // Sessions still running tools stay for the next tandemd to adopt; empty
  // folders, and the subtree itself when no process is left in it, go. Ready
  // cgroups of the pool go in any case: the next tandemd makes its own; so
  // does a placement ahead no tool started in (its runner drops it when the
  // connection goes).
  for (auto& [id, s] : sessions_) {
    for (cpu::Node& n : s.ready) (void)drop_ready(std::move(n));
    s.ready.clear();
    if (const Call* ahead = ahead_call(s)) {
      auto in = cgroups_->processes(ahead->node);
      if (in && in->empty()) (void)cgroups_->remove(ahead->node);
    }
    auto procs = cgroups_->processes(s.node);
    if (procs && procs->empty()) (void)cgroups_->remove(s.node);
  }
  retry_burials();
  auto procs = cgroups_->processes(cgroups_->root());
  if (procs && procs->empty()) {
    auto r = cgroups_->remove(cgroups_->root());
    if (!r) spdlog::warn("host: leaving the cgroup subtree: {}", r.error().message());
  }
}

base::Result<std::unique_ptr<HostPlane>> HostPlane::open(const HostConfig& config, Time now, const HostEnv& env) {
  cpu::ManagerOptions o = env.cgroups;
  o.subtree = config.subtree;
  o.root = config.root;
  auto cg = cpu::CgroupManager::open(o);
  if (!cg) return base::propagate(std::move(cg.error()));
  std::unique_ptr<HostPlane> plane(new HostPlane(config, env, std::move(*cg)));
  auto r = plane->start(now);
  if (!r) return base::propagate(std::move(r.error()));
  return plane;
}

base::Result<void> HostPlane::start(Time now) {
  // One tandemd per subtree: a second one would reap the first one's tools.
  {
    const int dir = cgroups_->root().dirs.front().get();
    base::UniqueFd fd(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return base::errno_error("open the cgroup subtree for its lock");
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      return base::errno_error(
          fmt::format("cgroup subtree {} is in use by another tandemd", cgroups_->hierarchies().front().path()));
    }
    lock_ = std::move(fd);
  }
  auto engines = cgroups_->create("engines");
  if (!engines) return base::propagate(std::move(engines.error()));
  engines_ = std::move(*engines);
  auto tools = cgroups_->create("tools");
  if (!tools) return base::propagate(std::move(tools.error()));
  tools_ = std::move(*tools);
  for (auto [node, cpus] : {std::pair{&engines_, &config_.engine_cpus}, {&tools_, &config_.tool_cpus}}) {
    if (cpus->empty()) continue;
    cpu::Limits l;
    l.cpus = *cpus;
    auto r = cgroups_->apply(*node, l);
    if (!r) return base::propagate(std::move(r.error()), fmt::format("cpuset of {}", node->rel));
    if (*r & cpu::kNoCpus) spdlog::warn("host: no cpuset controller: {} = {} is not applied", node->rel, *cpus);
  }
  pool_limits_ = limits_for({});
  if (auto v = cpu::validate(pool_limits_); !v) return base::propagate(std::move(v.error()), "[tools] limits");
  tool_cores_ = count_cpus(config_.tool_cpus);
  if (tool_cores_ == 0) tool_cores_ = static_cast<std::uint32_t>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));

  bpf::Options topts;
  topts.force_sampling = config_.telemetry == "sampling";
  topts.proc_root = proc_root_;
  auto tel = bpf::open_telemetry(topts);
  if (!tel) {
    if (config_.telemetry == "ebpf") return base::propagate(std::move(tel.error()), "telemetry");
    telemetry_error_ = tel.error().message();
    spdlog::warn("host: telemetry is off: {}", telemetry_error_);
  } else {
    telemetry_ = std::move(*tel);
    if (config_.telemetry == "ebpf" && telemetry_->mode() != bpf::Mode::kEbpf) {
      return base::make_error(ENOTSUP, fmt::format("telemetry: eBPF required ([telemetry] mode = \"ebpf\") but {}",
                                                   telemetry_->describe()));
    }
  }

  // Tool cgroups of a previous run.
  auto found = cgroups_->children("tools");
  if (!found) return base::propagate(std::move(found.error()));
  for (const std::string& name : *found) {
    auto node = cgroups_->open_node("tools/" + name);
    if (!node) continue;
    std::uint64_t id = 0;
    const bool named = name.size() == 16 && std::all_of(name.begin(), name.end(), [](char ch) {
                         return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
                       });
    if (named) id = std::stoull(name, nullptr, 16);
    if (!named || id == 0 || config_.on_restart == "reap") {
      spdlog::info("host: reaping tool cgroup {} of a previous run", node->rel);
      ++sessions_reaped_;
      bury(std::move(*node));
      continue;
    }
    SessionCg s;
    s.node = std::move(*node);
    s.orphan = true;
    s.orphan_deadline = now + config_.adopt_grace;
    for (const std::string& c : cgroups_->children(s.node.rel).value_or(std::vector<std::string>{})) {
      if (c.starts_with(kPoolPrefix)) {
        // A pooled cgroup of the previous run: a ready one (empty) goes; one
        // it had handed out stays until its processes are gone. create()
        // also completes one that a killed tandemd left half made.
        auto pn = cgroups_->create(s.node.rel + "/" + c);
        if (!pn) continue;
        auto procs = cgroups_->processes(*pn);
        if (procs && procs->empty()) {
          (void)cgroups_->remove(*pn);
          continue;
        }
        if (telemetry_) (void)telemetry_->track(pn->id, id, pn->dirs.front().get());
        s.leftovers.push_back(std::move(*pn));
        continue;
      }
      auto call = base::parse_int<std::uint32_t>(c);
      auto cn = cgroups_->open_node(s.node.rel + "/" + c);
      if (!call || !cn) continue;
      Call entry;
      entry.node = std::move(*cn);
      if (telemetry_) (void)telemetry_->track(entry.node.id, id, entry.node.dirs.front().get());
      s.calls.emplace(*call, std::move(entry));
    }
    spdlog::info("host: found session {:016x} of a previous run ({} tool calls); kept {} s for its runner", id,
                 s.calls.size() + s.leftovers.size(), std::chrono::duration<double>(config_.adopt_grace).count());
    sessions_.emplace(id, std::move(s));
  }
  if (const std::uint32_t u = cgroups_->unsupported(); u != 0) {
    std::string missing;
    const std::pair<std::uint32_t, const char*> knobs[] = {
        {cpu::kNoCpuWeight, "cpu weight"}, {cpu::kNoCpuMax, "cpu quota"},     {cpu::kNoMemoryHigh, "memory high"},
        {cpu::kNoMemoryMax, "memory max"}, {cpu::kNoMemoryLow, "memory low"}, {cpu::kNoPidsMax, "pids max"},
        {cpu::kNoCpus, "cpuset"}};
    for (const auto& [bit, what] : knobs) {
      if ((u & bit) != 0) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", what);
    }
    spdlog::warn("host: no controller here for: {} (those limits are skipped)", missing);
  }
  spdlog::info("host: cgroups {}; telemetry {}", cgroups_->describe(),
               telemetry_ ? std::string(telemetry_->describe()) : "off: " + telemetry_error_);
  return {};
}

HostPlane::SessionCg* HostPlane::session_cg(sched::SessionId session, bool create) {
  auto it = sessions_.find(session);
  if (it != sessions_.end()) return &it->second;
  if (!create) return nullptr;
  auto node = cgroups_->create(session_dir(session));
  if (!node) {
    spdlog::warn("host: session {:016x}: {}", session, node.error().message());
    return nullptr;
  }
  SessionCg s;
  s.node = std::move(*node);
  return &sessions_.emplace(session, std::move(s)).first->second;
}

void HostPlane::set_cpu_weight(sched::SessionId session, std::uint32_t weight) {
  if (weight < 1 || weight > 10000) return;
  SessionCg* s = session_cg(session, false);
  if (s == nullptr) {
    pending_[session].first = weight;  // applied when its first tool call gets a cgroup
    return;
  }
  if (s->cpu_weight == weight) return;
  s->cpu_weight = weight;
  cpu::Limits l;
  l.cpu_weight = weight;
  auto r = cgroups_->apply(s->node, l);
  if (!r) spdlog::warn("host: cpu.weight {} for session {:016x}: {}", weight, session, r.error().message());
}

void HostPlane::set_cpu_quota(sched::SessionId session, std::uint32_t us_per_100ms) {
  SessionCg* s = session_cg(session, false);
  if (s == nullptr) {
    pending_[session].second = us_per_100ms;
    return;
  }
  if (s->cpu_quota == us_per_100ms) return;
  s->cpu_quota = us_per_100ms;
  cpu::Limits l;
  l.cpu_max = cpu::CpuMax{
      us_per_100ms == 0 ? std::nullopt : std::optional<std::uint64_t>(std::max(1000u, us_per_100ms)), 100000};
  auto r = cgroups_->apply(s->node, l);
  if (!r) spdlog::warn("host: cpu.max for session {:016x}: {}", session, r.error().message());
}

void HostPlane::kill_call(sched::SessionId session, std::uint32_t call, Call& c, ipc::ToolExitReason reason,
                          std::string message) {
  spdlog::info("host: killing tool call {} of session {:016x} ({}): {}", call, session, to_string(reason), message);
  notice(ToolNotice{session, call, reason, std::move(message)});
  if (c.frozen) (void)cgroups_->freeze(c.node, false);  // v1: a frozen task dies only once thawed
  auto r = cgroups_->kill(c.node, kKillWaitMs);
  if (!r) spdlog::warn("host: killing tool call {} of session {:016x}: {}", call, session, r.error().message());
  c.frozen = false;
  ++tools_killed_;
}

void HostPlane::kill_tools(sched::SessionId session, ipc::ToolExitReason reason) {
  SessionCg* s = session_cg(session, false);
  if (s == nullptr) return;
  for (auto& [call, c] : s->calls) {
    if (c.ended) continue;
    kill_call(session, call, c, reason,
              reason == ipc::ToolExitReason::kKilledPolicy ? "the scheduling policy ended it" : "its session ended");
  }
}

void HostPlane::kill_lineage(sched::SessionId session) {
  if (!telemetry_) return;
  std::vector<base::UniqueFd> killed;
  for (std::int32_t pid : telemetry_->lineage(session)) {
    base::UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    // Still of the lineage after the pidfd was opened: the pidfd is that
    // process's, not one that took over its pid.
    if (!fd || !telemetry_->in_lineage(pid, session)) continue;
    if (cpu::send_signal(fd.get(), SIGKILL)) {
      ++lineage_killed_;
      killed.push_back(std::move(fd));
    }
  }
  for (const base::UniqueFd& fd : killed) {
    pollfd p{fd.get(), POLLIN, 0};
    (void)::poll(&p, 1, kKillWaitMs);
  }
  if (!killed.empty())
    spdlog::info("host: session {:016x}: killed {} processes that had left its cgroups", session, killed.size());
}

std::vector<std::int32_t> HostPlane::survivors(sched::SessionId session) const {
  std::vector<std::int32_t> out;
  const std::string rel = session_dir(session);
  for (const cpu::Node& n : doomed_) {
    if (n.rel != rel) continue;
    for (int pid : cgroups_->processes(n).value_or(std::vector<int>{})) out.push_back(pid);
  }
  if (auto it = sessions_.find(session); it != sessions_.end()) {
    for (int pid : cgroups_->processes(it->second.node).value_or(std::vector<int>{})) out.push_back(pid);
  }
  if (telemetry_) {
    for (std::int32_t pid : telemetry_->lineage(session)) out.push_back(pid);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void HostPlane::session_gone(sched::SessionId session) {
  pending_.erase(session);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;  // it never had a tool cgroup, so no lineage either
  kill_lineage(session);
  SessionCg& s = it->second;
  for (auto& [call, c] : s.calls) {
    if (telemetry_) telemetry_->untrack(c.node.id);
    if (!c.ended && c.pid != 0)
      notice(ToolNotice{session, call, ipc::ToolExitReason::kKilledSession, "its session ended"});
  }
  if (telemetry_) {
    for (const cpu::Node& n : s.leftovers) telemetry_->untrack(n.id);
    telemetry_->forget_group(session);
  }
  // The ready cgroups are empty; they go with the folder.
  pool_ready_ -= s.ready.size();
  pool_dropped_ += s.ready.size();
  s.ready.clear();
  bury(std::move(s.node));
  sessions_.erase(it);
}

void HostPlane::bury(cpu::Node node) {
  (void)cgroups_->freeze(node, false);
  auto k = cgroups_->kill(node, kKillWaitMs);
  if (k) {
    auto r = cgroups_->remove(node);
    if (r) return;
    spdlog::debug("host: removing {}: {} (retried each tick)", node.rel, r.error().message());
  } else {
    spdlog::warn("host: {}: {} (retried each tick)", node.rel, k.error().message());
  }
  doomed_.push_back(std::move(node));
}

void HostPlane::retry_burials() {
  std::erase_if(doomed_, [&](const cpu::Node& n) {
    if (!cgroups_->kill(n, 0)) return false;
    return static_cast<bool>(cgroups_->remove(n));
  });
}

cpu::Limits HostPlane::limits_for(const ipc::ToolLimitsInfo& asked) const {
  cpu::Limits l;
  const std::uint64_t high = tighter(config_.memory_high, asked.memory_high);
  const std::uint64_t max = tighter(config_.memory_max, asked.memory_max);
  l.memory_max = max == 0 ? cpu::kUnlimited : max;
  l.memory_high = high == 0 ? cpu::kUnlimited : (max != 0 ? std::min(high, max) : high);
  l.pids_max = tighter(config_.pids_max, asked.pids_max);
  const std::uint32_t period = asked.cpu_period_us != 0 ? asked.cpu_period_us : 100000;
  std::uint64_t quota = asked.cpu_quota_us;
  if (config_.cpu_max_percent != 0) {
    const std::uint64_t cfg = std::uint64_t{config_.cpu_max_percent} * period / 100;
    quota = quota == 0 ? cfg : std::min<std::uint64_t>(quota, cfg);
  }
  l.cpu_max = cpu::CpuMax{
      quota == 0 ? std::nullopt : std::optional<std::uint64_t>(std::max<std::uint64_t>(quota, 1000)), period};
  return l;
}

base::Result<ToolGrant> HostPlane::prepare_tool(const ToolRequest& req) {
  if (req.session == 0) return base::make_error(EINVAL, "session 0");
  SessionCg* s = session_cg(req.session, true);
  if (s == nullptr) {
    return base::make_error(EIO, fmt::format("cannot create the cgroup of session {:016x}", req.session));
  }
  s->orphan = false;
  if (const auto* p = pending_.find(req.session); p != nullptr) {
    const auto [weight, quota] = *p;
    pending_.erase(req.session);
    if (weight) set_cpu_weight(req.session, *weight);
    if (quota) set_cpu_quota(req.session, *quota);
  }
  if (s->calls.contains(req.call)) {
    return base::make_error(EEXIST,
                            fmt::format("tool call {} of session {:016x} already has a cgroup", req.call, req.session));
  }
  const cpu::Limits limits = limits_for(req.limits);
  if (auto v = cpu::validate(limits); !v) return base::propagate(std::move(v.error()), "tool limits");
  s->called = true;
  ++s->calls_in_period;
  std::optional<cpu::Node> node = take_ready(*s, limits);
  if (node) {
    ++pool_hits_;
  } else {
    // Cold: made here, on the runner's path.
    ++pool_misses_;
    auto made = cgroups_->create(call_dir(req.session, req.call));
    if (!made) return base::propagate(std::move(made.error()));
    auto applied = cgroups_->apply(*made, limits);
    if (!applied) {
      (void)cgroups_->remove(*made);
      return base::propagate(std::move(applied.error()), "tool limits");
    }
    node = std::move(*made);
  }
  if (telemetry_) {
    // dirs.front() is the v2 directory when there is one.
    auto t = telemetry_->track(node->id, req.session, node->dirs.front().get());
    if (!t) spdlog::warn("host: telemetry for {}: {}", node->rel, t.error().message());
  }
  Call c;
  c.node = std::move(*node);
  c.limits = limits;
  c.low_priority = req.limits.low_priority;
  auto& entry = s->calls.emplace(req.call, std::move(c)).first->second;
  ++tools_prepared_;
  if (req.ahead) {
    s->ahead = req.call;
    ++tools_ahead_;
  }

  ToolGrant g;
  g.info.cgroup_id = entry.node.id;
  // The one encoding of a placement's directories (cpu/cgroup_dirs.h); the
  // message carries its layout, field for field.
  static_assert(cpu::kMaxPlacementDirs == ipc::kMaxMessageFds);
  cpu::EncodedDirs dirs = cpu::encode_dirs(cgroups_->dirs(entry.node));
  g.info.has_v2 = dirs.layout.has_v2;
  g.info.v1_count = dirs.layout.v1_count;
  g.info.cpuacct_fd = dirs.layout.cpuacct;
  g.info.memory_fd = dirs.layout.memory;
  g.info.cpu_fd = dirs.layout.cpu;
  g.fds = std::move(dirs.fds);
  g.info.bwrap = config_.bubblewrap;
  g.info.bwrap_args = config_.bubblewrap_args;
  return g;
}

std::optional<cpu::Node> HostPlane::take_ready(SessionCg& s, const cpu::Limits& limits) {
  if (s.ready.empty()) return std::nullopt;
  cpu::Node node = std::move(s.ready.back());
  s.ready.pop_back();
  --pool_ready_;
  // Only what the runner tightened is written now; the rest is in place.
  cpu::Limits extra;
  bool any = false;
  if (limits.cpu_max != pool_limits_.cpu_max) {
    extra.cpu_max = limits.cpu_max;
    any = true;
  }
  if (limits.memory_high != pool_limits_.memory_high || limits.memory_max != pool_limits_.memory_max) {
    // Both: v1 derives its one limit from the pair.
    extra.memory_high = limits.memory_high;
    extra.memory_max = limits.memory_max;
    any = true;
  }
  if (limits.pids_max != pool_limits_.pids_max) {
    extra.pids_max = limits.pids_max;
    any = true;
  }
  if (any) {
    auto r = cgroups_->apply(node, extra);
    if (!r) {
      spdlog::debug("host: pooled cgroup {}: {} (a fresh one is made)", node.rel, r.error().message());
      (void)drop_ready(std::move(node));
      return std::nullopt;
    }
  }
  return node;
}

void HostPlane::tool_started(sched::SessionId session, std::uint32_t call, std::int32_t pid) {
  SessionCg* s = session_cg(session, false);
  if (s == nullptr) return;
  auto it = s->calls.find(call);
  if (it != s->calls.end()) it->second.pid = pid;
  if (s->ahead == call) s->ahead.reset();  // from now on an ordinary call
}

void HostPlane::tool_ended(sched::SessionId session, std::uint32_t call) {
  // Only marked: TOOL_END often reaches tandemd inside the runner's next
  // ToolPrepare (its ring is pumped first), and removing the cgroup there
  // would put rmdir in every hierarchy on that call's path. recycle() takes
  // it at the next tick.
  SessionCg* s = session_cg(session, false);
  if (s == nullptr) return;
  auto it = s->calls.find(call);
  if (it == s->calls.end()) return;
  it->second.ended = true;
  ++ended_waiting_;
}

const HostPlane::Call* HostPlane::ahead_call(const SessionCg& s) {
  if (!s.ahead) return nullptr;
  auto it = s.calls.find(*s.ahead);
  return it == s.calls.end() || it->second.ended ? nullptr : &it->second;
}

bool HostPlane::tool_ahead(sched::SessionId session) const {
  auto it = sessions_.find(session);
  return it != sessions_.end() && ahead_call(it->second) != nullptr;
}

std::size_t HostPlane::tool_cgroups(sched::SessionId session) const {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return 0;
  const SessionCg& s = it->second;
  return s.calls.size() + s.leftovers.size() - (ahead_call(s) != nullptr ? 1 : 0);
}

void HostPlane::on_events() {
  if (!telemetry_) return;
  proc_events_ += telemetry_->drain_events([&](const bpf::ProcEvent& e) {
    if (e.kind == bpf::ProcEvent::Kind::kExec) ++execs_;
    if (e.kind == bpf::ProcEvent::Kind::kExit) ++exits_;
  });
}

void HostPlane::status(nlohmann::json& out) const {
  std::uint64_t calls = 0;
  std::uint64_t orphans = 0;
  std::uint64_t ahead = 0;
  for (const auto& [id, s] : sessions_) {
    calls += s.calls.size() + s.leftovers.size();
    orphans += s.orphan ? 1 : 0;
    ahead += ahead_call(s) != nullptr ? 1 : 0;
  }
  out = {
      {"cgroups", cgroups_->describe()},
      {"unsupported_limits", cgroups_->unsupported()},
      {"telemetry", telemetry_ ? std::string(telemetry_->describe()) : "off: " + telemetry_error_},
      {"telemetry_mode", telemetry_ ? (telemetry_->mode() == bpf::Mode::kEbpf ? "ebpf" : "sampling") : "off"},
      {"sessions", sessions_.size()},
      {"tool_cgroups", calls},
      {"orphans", orphans},
      {"pending_removals", doomed_.size()},
      {"memory_pressure", pressure_ == Pressure::kNormal ? "normal"
                          : pressure_ == Pressure::kHigh ? "high"
                                                         : "critical"},
      {"memory_psi_some_avg10", memory_psi_},
      {"cpu_psi_some_avg10", cpu_psi_},
      {"tools_memory_bytes", tools_memory_},
      {"tools_memory_budget_bytes", config_.tools_budget},
      {"tool_peak_p95_bytes", peak_p95_},
      {"memory_kills", memory_kills_},
      {"tools_memory_stalled_seconds", std::chrono::duration<double>(tools_memory_stalled_).count()},
      {"tools_cpu_seconds", static_cast<double>(tools_cpu_ns_) * 1e-9},
      {"runq_delay_p50_us", std::chrono::duration<double, std::micro>(view_.runq_delay_p50).count()},
      {"tools_prepared", tools_prepared_},
      {"tools_killed", tools_killed_},
      {"sessions_adopted", sessions_adopted_},
      {"sessions_reaped", sessions_reaped_},
      {"throttles", throttles_},
      {"freezes", freezes_},
      {"execs_seen", execs_},
      {"exits_seen", exits_},
      {"lineage_killed", lineage_killed_},
      {"favordynmods", cgroups_->favordynmods() ? nlohmann::json(*cgroups_->favordynmods()) : nlohmann::json(nullptr)},
      {"pool",
       {{"ready", pool_ready_},
        {"target", pool_target_},
        {"max", config_.pool_max},
        {"per_session", config_.pool_per_session},
        {"hits", pool_hits_},
        {"misses", pool_misses_},
        {"hit_rate", pool_hits_ + pool_misses_ == 0 ? nlohmann::json(nullptr)
                                                    : nlohmann::json(static_cast<double>(pool_hits_) /
                                                                     static_cast<double>(pool_hits_ + pool_misses_))},
        {"made", pool_made_},
        {"dropped", pool_dropped_},
        {"errors", pool_errors_}}},
      {"ahead", {{"enabled", config_.ahead}, {"held", ahead}, {"prepared", tools_ahead_}}},
  };
}

void HostPlane::tools(nlohmann::json& out) const {
  out = nlohmann::json::array();
  for (const auto& [id, s] : sessions_) {
    nlohmann::json calls = nlohmann::json::array();
    const Call* ahead = ahead_call(s);
    for (const auto& [call, c] : s.calls) {
      calls.push_back({{"call", call},
                       {"pid", c.pid},
                       {"ended", c.ended},
                       {"ahead", ahead == &c},
                       {"memory_bytes", c.memory_bytes},
                       {"throttled", c.throttled},
                       {"frozen", c.frozen},
                       {"cgroup_id", c.node.id}});
    }
    auto u = cgroups_->usage(s.node);
    out.push_back({{"session", fmt::format("{:016x}", id)},
                   {"orphan", s.orphan},
                   {"ready", s.ready.size()},
                   {"leftovers", s.leftovers.size()},
                   {"pinned", s.pinned},
                   {"cpu_weight", s.cpu_weight ? nlohmann::json(*s.cpu_weight) : nlohmann::json(nullptr)},
                   {"cpu_ns", u && u->cpu_ns ? *u->cpu_ns : 0},
                   {"memory_bytes", u && u->memory_bytes ? *u->memory_bytes : 0},
                   {"processes", cgroups_->processes(s.node).value_or(std::vector<int>{}).size()},
                   {"calls", std::move(calls)}});
  }
}

}  // namespace tandem::daemon
