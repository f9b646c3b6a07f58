// Tool processes (tandem_tool_spawn / _wait / _kill): the runner side of
// issue 6. tandemd makes the tool call's cgroup and hands its directories
// over (ToolPlacement); cpu::spawn starts the process inside them; after it
// exits, its usage is read from those directories, so CPU time and peak
// memory count every process of the call, daemonised ones included.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

#include "base/ids.h"
#include "cpu/cgroup.h"
#include "cpu/spawn.h"
#include "libclient/client.h"

namespace tandem::client {
namespace {

void copy_message(tandem_tool_result& out, std::string_view text) {
  const std::size_t n = std::min(text.size(), sizeof out.message - 1);
  std::memcpy(out.message, text.data(), n);
  out.message[n] = '\0';
}

}  // namespace

std::uint32_t Client::ask_placement(std::uint64_t session, std::uint32_t call, std::uint64_t kind,
                                    const ipc::ToolLimitsInfo& limits, bool ahead, std::string& why, int& why_code) {
  if (state_ != ConnState::kConnected) {
    why = connection_error_.empty() ? "not connected to tandemd"
                                    : fmt::format("not connected to tandemd: {}", connection_error_);
    why_code = ENOTCONN;
    return 0;
  }
  const std::uint32_t request = next_request_++;
  if (next_request_ == 0) next_request_ = 1;
  queue_message(ipc::build_tool_prepare(request, session, call, kind, limits, ahead));
  if (!flush_outbox()) {
    why = "the connection to tandemd was lost";
    why_code = ENOTCONN;
    return 0;
  }
  return request;
}

std::optional<Client::Placement> Client::await_placement(std::uint32_t request, std::string& why, int& why_code) {
  const base::Time deadline = clock_.now() + kPlacementTimeout;
  for (;;) {
    if (auto it = placements_.find(request); it != placements_.end()) {
      Placement p = std::move(it->second);
      placements_.erase(it);
      return p;
    }
    const base::Time now = clock_.now();
    if (now >= deadline || state_ != ConnState::kConnected) {
      why = state_ != ConnState::kConnected ? "the connection to tandemd was lost" : "tandemd did not answer in time";
      why_code = state_ != ConnState::kConnected ? ENOTCONN : ETIMEDOUT;
      // Late answers are dropped: this one's and earlier ones', but not
      // those of placements asked ahead, which their sessions still wait for.
      for (auto it = placements_.begin(); it != placements_.end() && it->first <= request;) {
        const bool ahead =
            std::any_of(aheads_.begin(), aheads_.end(), [&](const auto& a) { return a.second.request == it->first; });
        it = ahead ? std::next(it) : placements_.erase(it);
      }
      return std::nullopt;
    }
    pollfd pfd{sock_.get(), POLLIN, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    (void)::poll(&pfd, 1, static_cast<int>(std::max<std::int64_t>(1, ms)));
    if (!pump_socket()) continue;  // lost: the loop reports it
  }
}

std::optional<Client::Placement> Client::request_placement(std::uint64_t session, std::uint32_t call,
                                                           std::uint64_t kind, const ipc::ToolLimitsInfo& limits,
                                                           std::string& why, int& why_code) {
  drive(true);
  const std::uint32_t request = ask_placement(session, call, kind, limits, false, why, why_code);
  if (request == 0) return std::nullopt;
  return await_placement(request, why, why_code);
}

std::optional<Client::Ahead> Client::take_ahead(std::uint64_t session, const ipc::ToolLimitsInfo& limits) {
  auto it = aheads_.find(session);
  if (it == aheads_.end() || !(it->second.limits == limits)) return std::nullopt;
  Ahead a = it->second;
  aheads_.erase(it);
  return a;
}

void Client::drop_ahead(std::uint64_t session) {
  auto it = aheads_.find(session);
  if (it == aheads_.end()) return;
  placements_.erase(it->second.request);  // closes its fds, if it came
  aheads_.erase(it);
}

std::uint32_t Client::new_call() {
  const std::uint32_t call = next_call_++;
  if (next_call_ == 0) next_call_ = kFirstSpawnCall;
  return call;
}

int Client::tool_spawn(std::uint64_t session, std::string_view tool, const ToolSpec& spec, std::int32_t& ret_pid) {
  drive(false);
  Session* s = find(session);
  if (s == nullptr || !s->open) return fail(ENOENT, "tandem_tool_spawn: session is not open on this handle");
  if (s->refused != 0) {
    return fail(s->refused, fmt::format("tandem_tool_spawn: tandemd refused the session: {}", daemon_error_));
  }
  const std::size_t tools_limit = daemon_tools_ != 0 && connected()
                                      ? std::min<std::size_t>(kMaxToolsPerSession, daemon_tools_)
                                      : kMaxToolsPerSession;
  if (s->tools.size() >= tools_limit) {
    return fail(ENOSPC, fmt::format("tandem_tool_spawn: {} tool calls running already", tools_limit));
  }
  const std::uint64_t kind = base::tool_kind_id(tool);

  // Sandboxing is never dropped silently: a tool that cannot be placed in
  // its cgroup is not started, unless the caller said it may run unplaced.
  // The cgroup asked ahead when the session's last call started, if its
  // limits are this call's: its answer is usually here already, so this
  // call skips the round trip to tandemd. A refused one (the session over a
  // limit then, say) is asked again the ordinary way; no answer in time, or
  // a lost connection, is this call's answer too.
  std::string why;
  int why_code = ENOTCONN;
  std::uint32_t call = 0;
  std::optional<Placement> placement;
  bool ask = true;
  if (std::optional<Ahead> ahead = take_ahead(session, spec.limits)) {
    drive(true);
    call = ahead->call;
    placement = await_placement(ahead->request, why, why_code);
    ask = placement && placement->info.code != 0;
    if (ask) placement.reset();
    if (placement) ++stats_.tools_placed_ahead;
  }
  if (ask) {
    call = new_call();
    placement = request_placement(session, call, kind, spec.limits, why, why_code);
  }
  if (placement && placement->info.code != 0) {
    why = fmt::format("tandemd: {}", base::escape(placement->info.message, 512));
    why_code = placement->info.code;
    // A refusal for bad limits, a limit, or a session tandemd does not
    // give this client is the caller's to see whatever it allows.
    if (placement->info.code != ENOTSUP && placement->info.code != EIO) {
      return fail(placement->info.code, fmt::format("tandem_tool_spawn: {}", why));
    }
    placement.reset();
  }
  // The one decoding of a placement's directories (cpu/cgroup_dirs.h): the
  // fds as they arrived, checked against what the message says of them.
  cpu::ReceivedDirs dirs;
  if (placement) {
    const ipc::ToolPlacementInfo& info = placement->info;
    auto decoded =
        cpu::decode_dirs(cpu::DirsLayout{info.has_v2, info.v1_count, info.cpuacct_fd, info.memory_fd, info.cpu_fd},
                         std::move(placement->fds));
    if (decoded) {
      dirs = std::move(*decoded);
    } else {
      why = decoded.error().message();
      why_code = decoded.error().code();
      placement.reset();
    }
  }
  if (!placement && !spec.allow_unplaced) {
    return fail(why_code, fmt::format("tandem_tool_spawn: the tool was not started: it could not be placed in a "
                                      "cgroup ({}); pass TANDEM_TOOL_ALLOW_UNPLACED to start it without one",
                                      why));
  }

  cpu::SpawnSpec ss = spec.process;
  ToolProc proc;
  // A placed tool gets a cgroup namespace of its own, so its cgroup is its
  // root and it cannot name (nor move to) any cgroup outside it; that needs
  // CAP_SYS_ADMIN, which a runner placing tools normally has (root).
  ss.new_cgroup_ns = placement.has_value() && cpu::may_create_cgroup_namespace();
  proc.uid = ss.uid.value_or(::geteuid());
  proc.gid = ss.gid.value_or(::getegid());
  if (!placement) proc.flags |= TANDEM_TOOL_UNPLACED;
  if (ss.new_cgroup_ns) proc.flags |= TANDEM_TOOL_CGROUP_NS;
  if (ss.uid || ss.gid) proc.flags |= TANDEM_TOOL_UID_CHANGED;
  if (placement) {
    ss.bwrap = placement->info.bwrap;
    ss.bwrap_args = placement->info.bwrap_args;
    proc.cgroup_id = placement->info.cgroup_id;
  }
  auto spawned = cpu::spawn(ss, dirs.dirs());
  if (!spawned) {
    // The cgroup stays empty; TOOL_END tells tandemd to remove it.
    if (placement) {
      ipc::ToolStart start;
      start.tool_kind = kind;
      start.tool_call = call;
      send_record(start, session);
      ipc::ToolEnd end;
      end.tool_kind = kind;
      end.tool_call = call;
      end.exit_code = 127;
      send_record(end, session);
    }
    const int code = spawned.error().code();
    return fail(code, fmt::format("tandem_tool_spawn: {}", spawned.error().message()));
  }
  if (!placement) {
    ++stats_.tools_unplaced;
    last_error_ = fmt::format("tandem_tool_spawn: started without a cgroup: {}", why);
  }
  ++stats_.tools_spawned;
  proc.session = session;
  proc.call = call;
  proc.tool = std::string(tool);
  proc.pidfd = std::move(spawned->pidfd);
  proc.started_ns = spawned->started_ns;
  proc.dirs = std::move(dirs);
  const std::int32_t pid = spawned->pid;

  s->tools.push_back(ToolCall{call, kind, base::to_ns(clock_.now())});
  ipc::ToolStart r;
  r.tool_kind = kind;
  r.tool_call = call;
  r.pid = static_cast<std::uint32_t>(pid);
  r.cgroup_id = proc.cgroup_id;
  send_record(r, session);
  procs_.emplace(pid, std::move(proc));
  ret_pid = pid;
  // Ask for the next call's cgroup now, while this tool runs. Not when the
  // next call would be over the tools limit (tandemd would refuse it).
  if (placement && daemon_ahead_ && !aheads_.contains(session) && s->tools.size() < tools_limit) {
    std::string ignored;
    int ignored_code = 0;
    const std::uint32_t next = new_call();
    if (const std::uint32_t request = ask_placement(session, next, kind, spec.limits, true, ignored, ignored_code)) {
      aheads_[session] = Ahead{request, next, spec.limits};
    }
  }
  return 0;
}

int Client::tool_wait(std::int32_t pid, int timeout_ms, tandem_tool_result& out) {
  auto it = procs_.find(pid);
  if (it == procs_.end()) return fail(ECHILD, fmt::format("tandem_tool_wait: {} is not a tool of this handle", pid));
  ToolProc& t = it->second;
  // Waits on the tool and on the connection at once: a daemon that
  // restarts while the tool runs is reconnected to and resynced with from
  // here, so it gives the tool's session back to this handle (and keeps its
  // cgroup) instead of reaping it as nobody's.
  const base::Time deadline = clock_.now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  base::Result<cpu::ExitStatus> status = base::make_error(ETIMEDOUT, "not waited yet");
  for (;;) {
    status = cpu::wait_exit(t.pidfd.get(), 0);
    if (status || status.error().code() != ETIMEDOUT) break;
    const base::Time now = clock_.now();
    if (timeout_ms == 0 || (timeout_ms > 0 && now >= deadline)) break;
    base::Time until = timeout_ms > 0 ? deadline : now + std::chrono::hours(1);
    pollfd fds[2] = {{t.pidfd.get(), POLLIN, 0}, {-1, POLLIN, 0}};
    switch (state_) {
      case ConnState::kDisconnected:
        until = std::min(until, next_attempt_);
        break;
      case ConnState::kAwaitingWelcome:
        fds[1].fd = sock_.get();
        until = std::min(until, hello_at_ + kWelcomeTimeout);
        break;
      case ConnState::kConnected:
        fds[1].fd = sock_.get();
        break;
    }
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    (void)::poll(fds, 2, static_cast<int>(std::clamp<std::int64_t>(ms, 0, 3'600'000)));
    drive(true);
    drain_directives();
  }
  if (!status) {
    const int code = status.error().code();
    return fail(code, fmt::format("tandem_tool_wait: {}", status.error().message()));
  }
  drive(true);            // a ToolKilled may be waiting on the socket
  it = procs_.find(pid);  // the wait drove the connection; the entry is still ours
  if (it == procs_.end()) return fail(ECHILD, fmt::format("tandem_tool_wait: {} is not a tool of this handle", pid));

  out.exit_code = status->exit_code;
  out.wall_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, status->ended_ns - t.started_ns));
  out.cpu_ns = status->cpu_ns;
  out.peak_memory_bytes = status->max_rss_bytes;
  out.cgroup_id = t.cgroup_id;
  out.flags = t.flags | (t.daemon_lost ? std::uint32_t{TANDEM_TOOL_DAEMON_LOST} : 0u);
  std::uint64_t oom_kills = 0;
  if (!t.dirs.empty()) {
    auto usage = cpu::read_usage(t.dirs.dirs());
    if (usage) {
      if (usage->cpu_ns) out.cpu_ns = std::max(out.cpu_ns, *usage->cpu_ns);
      if (usage->memory_peak) out.peak_memory_bytes = *usage->memory_peak;
      oom_kills = usage->oom_kills;
    }
  }
  out.reason = TANDEM_TOOL_EXITED;
  if (auto k = kills_.find({t.session, t.call}); k != kills_.end()) {
    out.reason = k->second.reason;
    copy_message(out, fmt::format("killed by tandemd: {}", k->second.message));
    kills_.erase(k);
  } else if (status->exit_code < 0) {
    if (oom_kills > 0 && -status->exit_code == SIGKILL) {
      out.reason = TANDEM_TOOL_OOM_KILLED;
      copy_message(out, "killed by the kernel's OOM killer at the tool's memory limit");
    } else {
      out.reason = TANDEM_TOOL_SIGNALED;
      copy_message(out,
                   fmt::format("terminated by signal {} ({})", -status->exit_code,
                               sigabbrev_np(-status->exit_code) != nullptr ? sigabbrev_np(-status->exit_code) : "?"));
    }
  }

  // TOOL_END, if the session is still open here.
  Session* s = find(t.session);
  if (s != nullptr && s->open) {
    auto call = std::find_if(s->tools.begin(), s->tools.end(), [&](const ToolCall& c) { return c.call == t.call; });
    if (call != s->tools.end()) {
      ipc::ToolEnd r;
      r.tool_kind = call->kind;
      r.tool_call = t.call;
      r.exit_code = status->exit_code;
      r.wall_ns = out.wall_ns;
      r.cpu_ns = out.cpu_ns;
      r.peak_memory_bytes = out.peak_memory_bytes;
      send_record(r, t.session);
      s->tools.erase(call);
    }
  }
  procs_.erase(it);
  return 0;
}

int Client::tool_info(std::int32_t pid, tandem_tool_info& out) const {
  auto it = procs_.find(pid);
  if (it == procs_.end()) {
    const_cast<Client*>(this)->last_error_ = fmt::format("tandem_tool_info_get: {} is not a tool of this handle", pid);
    return -ECHILD;
  }
  out.session = it->second.session;
  out.cgroup_id = it->second.cgroup_id;
  out.flags = it->second.flags | (it->second.daemon_lost ? std::uint32_t{TANDEM_TOOL_DAEMON_LOST} : 0u);
  out.uid = it->second.uid;
  out.gid = it->second.gid;
  return 0;
}

int Client::tool_kill(std::int32_t pid) {
  auto it = procs_.find(pid);
  if (it == procs_.end()) return fail(ECHILD, fmt::format("tandem_tool_kill: {} is not a tool of this handle", pid));
  ToolProc& t = it->second;
  // The whole cgroup where v2 can kill it in one write; the process otherwise.
  if (const int v2 = t.dirs.dirs().v2_dir; v2 >= 0 && cpu::write_file(v2, "cgroup.kill", "1")) return 0;
  auto r = cpu::send_signal(t.pidfd.get(), SIGKILL);
  if (!r && r.error().code() != ESRCH) return fail(r.error().code(), r.error().message());
  return 0;
}

void Client::reap_tools(std::uint64_t session) {
  for (auto it = procs_.begin(); it != procs_.end();) {
    if (session != 0 && it->second.session != session) {
      ++it;
      continue;
    }
    (void)tool_kill(it->first);
    (void)cpu::wait_exit(it->second.pidfd.get(), 2000);
    kills_.erase({it->second.session, it->second.call});
    it = procs_.erase(it);
  }
}

}  // namespace tandem::client
