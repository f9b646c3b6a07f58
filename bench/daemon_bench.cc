// daemon_bench: what tandemd itself costs under a steady production-shaped
// load, and how long a directive takes from the policy's decision to the
// engine that must act on it (the two daemon targets: ≤ 1% of one
// core with 8 engines sending KV_STATS at 100 Hz and 1,000 live sessions;
// decision → engine latency p50/p99).
//
// Methodology
// -----------
// The real tandemd binary (the build's, TANDEMD_PATH, or --tandemd's) runs as a child in a fresh temporary
// runtime dir, with a config written for the run (stderr to tandemd.log in
// that dir), started and stopped by the harness the tests use
// (testbed/daemon_process.h). The default policy is the daemon's, `tandem`, with window_min =
// window_max = window_init = 4096: its admission window (mars's) then never
// binds at 1,000 sessions (not even before the first KV_STATS, when it drops
// the window to window_min), so every waiting session is admitted at the next
// tick and the bench measures the daemon, not a policy's backlog. `mars` gets
// the same three parameters; other policies get none.
//
// The clients speak the raw protocol (Hello, Welcome with the segment and two
// doorbells, the rings), as libtandem does, from one process; they ring the
// event doorbell as libtandem's EventSender does, honouring the daemon's
// wake-up watermark (Doorbell::notify_if):
//   - one runner: SESSION_OPEN for sessions "bench-<i>" at set-up; then, for
//     every session an engine hands over, TOOL_START on its next wake-up
//     (every 2 ms) and TOOL_END + SESSION_CLOSE --tool-ms later;
//   - --engines engines, one thread each (sleeping between sends: this is a
//     2-core machine and the clients must leave the daemon its core). Each
//     sends KV_STATS at --stats-hz and, --churn-hz times a second, ends the
//     round of its oldest admitted session (ROUND_END, tool follows), hands
//     that session to the runner, and submits round 0 of a fresh session
//     (ROUND_SUBMIT, which opens it), which the policy must ADMIT. The live
//     count thus stays at --sessions plus the sessions whose tool is still
//     running, and every fresh session yields one decision and one directive.
//   Fresh sessions are opened by their ROUND_SUBMIT, not by a SESSION_OPEN:
//   the two would travel on different rings, and a SESSION_OPEN that reached
//   the daemon after the ROUND_SUBMIT had opened the session would be
//   rejected. The set-up opens the initial sessions with SESSION_OPEN and
//   submits their rounds only after ctl `status` shows all of them admitted;
//   the daemon then tells each engine at its ROUND_SUBMIT (one ADMIT per
//   initial session, stamped when the record is taken, outside the window).
//
// Engines wait on their directive doorbell (Doorbell::wait, no spinning) with
// a timeout at their next send; --wake poll makes them poll the ring every
// 1 ms instead, as an engine that drains at step boundaries would.
//
// Latency: the daemon stamps each directive with the CLOCK_MONOTONIC time of
// the tick that decided it (header.timestamp_ns); an engine records
// now − stamp when it pops the directive. Only directives stamped inside the
// measurement window count. The engine also records, for each fresh session,
// the time from its ROUND_SUBMIT to the ADMIT (which includes waiting for the
// next tick: up to one tick period).
//
// Daemon CPU over the window (--seconds, after --warmup s of steady state):
// utime + stime from /proc/<pid>/stat (clock ticks, usually 10 ms each) and
// the process CPU clock (clock_getcpuclockid, ns) at both ends. Over its whole
// life: getrusage(RUSAGE_CHILDREN) around SIGTERM + waitpid. The bench's own
// CPU (getrusage(RUSAGE_SELF)) over the window is printed too, so a reader can
// see the machine was not starved. The ctl `status` queries that prove the
// load arrived are made outside the window.
//
// The run fails (exit 1) unless ctl `status` shows the live sessions at
// --sessions (plus those in flight), records accepted growing at ≥ 90% of the
// rate the clients sent, 0 rejected records, 0 dropped directives and
// clients, no record the bench could not push, and directives seen. Late
// records are not rejections: an engine's ROUND_END can wait in its ring for
// the tick while the runner's SESSION_CLOSE, 50 ms of tool later, is taken
// first (docs/daemon.md "Bad input"); their count is printed.
//
// Process hygiene: tandemd dies with the bench (PR_SET_PDEATHSIG), is stopped
// and reaped on every error path (testbed::DaemonProcess's destructor, which
// also sweeps its cgroup subtree), and killed on SIGINT or SIGTERM to the
// bench. The handler exits at once, so the subtree of a bench killed that
// way is swept by the next daemon_bench (testbed::sweep_stale_subtrees).
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/ids.h"
#include "base/result.h"
#include "base/stats.h"
#include "base/unique_fd.h"
#include "ipc/channel.h"
#include "ipc/daemon_connection.h"
#include "ipc/doorbell.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "ipc/spsc_ring.h"
#include "testbed/daemon_process.h"

namespace tandem::bench {
namespace {

using base::Result;
using nlohmann::json;

// The target: daemon CPU as a share of one core.
constexpr double kTargetCpuPercent = 1.0;

// Engine parameters every bench engine announces (the brief's).
constexpr std::uint32_t kBlockSize = 16;
constexpr std::uint32_t kTotalBlocks = 100'000;
constexpr std::uint32_t kMaxSeqs = 256;
constexpr std::uint32_t kTokenBudget = 8192;
// What each bench round claims.
constexpr std::uint32_t kPromptTokens = 512;
constexpr std::uint32_t kOutputTokens = 128;
constexpr std::uint32_t kBlocksPerSession = 40;
constexpr std::uint32_t kStepTokens = 256;
constexpr std::uint32_t kStepTimeUs = 20'000;
// Window parameters that keep mars's admission window out of the way.
constexpr int kOpenWindow = 4096;

constexpr auto kStartTimeout = std::chrono::seconds(5);
constexpr auto kReplyTimeout = std::chrono::seconds(5);
constexpr auto kSetupTimeout = std::chrono::seconds(15);
constexpr auto kStopTimeout = std::chrono::seconds(10);
constexpr auto kCtlPoll = std::chrono::milliseconds(20);
constexpr auto kRunnerPeriod = std::chrono::milliseconds(2);
constexpr auto kPollPeriod = std::chrono::milliseconds(1);
// Share of the records the clients sent that the daemon must have accepted
// in the window (the rest may sit in a ring at either edge of it).
constexpr double kMinAcceptedShare = 0.9;

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void sleep_ns(std::int64_t ns) {
  if (ns <= 0) return;
  timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

template <class T>
ipc::Slot make_record(const T& r, std::uint64_t session) {
  return ipc::encode(r, session, now_ns());
}

// ---------------------------------------------------------------------------
// Command line

enum class Wake : std::uint8_t { kDoorbell, kPoll };

struct Options {
  double seconds = 20.0;
  double warmup = 3.0;
  int engines = 8;
  int sessions = 1000;
  int stats_hz = 100;
  int churn_hz = 100;  // per engine
  int tool_ms = 50;
  int tick_ms = 0;  // 0: the daemon's default
  std::string policy = "tandem";
  int repeat = 1;
  Wake wake = Wake::kDoorbell;
  std::string host = "ebpf";           // the host plane: ebpf, sampling (telemetry) or off (no cgroups)
  std::string tandemd = TANDEMD_PATH;  // --tandemd: another build's, for before/after runs
  std::string runtime_parent;          // where the runtime dir goes; empty: the first tmpfs (runtime_parent_default)
  bool keep = false;
};

// Whether `dir` is on a tmpfs.
bool on_tmpfs(const std::string& dir) {
  struct statfs fs {};
  return ::statfs(dir.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

// Under systemd, tandemd's runtime dir (the ownership journal's home) is
// /run/tandem, on a tmpfs (RuntimeDirectory=): the bench puts its runtime
// dir on one too, the first writable of /run and /dev/shm, else TMPDIR.
std::string runtime_parent_default() {
  for (const char* dir : {"/run", "/dev/shm"}) {
    if (on_tmpfs(dir) && ::access(dir, W_OK) == 0) return dir;
  }
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  return ec ? "/tmp" : tmp.string();
}

void print_usage(std::FILE* to) {
  fmt::print(
      to,
      "usage: daemon_bench [flags]\n"
      "  --seconds N     measurement window, seconds (default 20)\n"
      "  --warmup N      steady state before the window, seconds (default 3)\n"
      "  --engines N     engine clients (default 8)\n"
      "  --sessions N    live sessions (default 1000)\n"
      "  --stats-hz N    KV_STATS per engine per second (default 100)\n"
      "  --churn-hz N    sessions each engine finishes and replaces per second (default 100)\n"
      "  --tool-ms N     how long each finished session's tool runs before it closes (default 50)\n"
      "  --tick-ms N     the daemon's control tick (default: the daemon's, 50)\n"
      "  --policy NAME   policy (default tandem, the daemon's; mars and tandem get their window opened to 4096)\n"
      "  --wake MODE     engines wait for directives on the doorbell (doorbell, default) or poll\n"
      "                  the ring every 1 ms (poll)\n"
      "  --repeat N      runs, each with a fresh daemon; medians are printed (default 1)\n"
      "  --host MODE     the daemon's host plane: ebpf (cgroups, eBPF telemetry; default when root),\n"
      "                  sampling (cgroups, sampled telemetry) or off (no cgroups)\n"
      "  --runtime-parent DIR  where the runtime dir (socket, journal) goes (default: /run or\n"
      "                  /dev/shm, the first tmpfs, as systemd gives tandemd; else TMPDIR)\n"
      "  --tandemd PATH  the tandemd binary to run (default: this build's)\n"
      "  --keep          keep the runtime dir (config, tandemd.log) and print its path\n"
      "  --help          show this text\n");
}

// Returns 0 to run, 1 when --help was printed, 2 on a usage error (printed).
int parse_args(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) {
        fmt::print(stderr, "daemon_bench: {} needs a value\n", arg);
        return std::nullopt;
      }
      return std::string(argv[++i]);
    };
    auto number = [&](double lo, double hi, double& out) {
      auto v = value();
      if (!v) return false;
      char* end = nullptr;
      const double d = std::strtod(v->c_str(), &end);
      if (end == v->c_str() || *end != '\0' || !(d >= lo && d <= hi)) {
        fmt::print(stderr, "daemon_bench: {} must be a number in [{}, {}], got '{}'\n", arg, lo, hi, *v);
        return false;
      }
      out = d;
      return true;
    };
    auto integer = [&](int lo, int hi, int& out) {
      double d = 0;
      if (!number(lo, hi, d)) return false;
      if (d != std::floor(d)) {
        fmt::print(stderr, "daemon_bench: {} must be an integer\n", arg);
        return false;
      }
      out = static_cast<int>(d);
      return true;
    };
    // A flag whose value is any non-empty text.
    auto text = [&](std::string& out) {
      auto v = value();
      if (!v || v->empty()) return false;
      out = *v;
      return true;
    };
    bool ok = true;
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      return 1;
    } else if (arg == "--seconds") {
      ok = number(0.1, 3600, o.seconds);
    } else if (arg == "--warmup") {
      ok = number(0, 600, o.warmup);
    } else if (arg == "--engines") {
      ok = integer(1, 64, o.engines);
    } else if (arg == "--sessions") {
      ok = integer(1, 100'000, o.sessions);
    } else if (arg == "--stats-hz") {
      ok = integer(1, 10'000, o.stats_hz);
    } else if (arg == "--churn-hz") {
      ok = integer(0, 10'000, o.churn_hz);
    } else if (arg == "--tool-ms") {
      ok = integer(0, 10'000, o.tool_ms);
    } else if (arg == "--tick-ms") {
      ok = integer(1, 10'000, o.tick_ms);
    } else if (arg == "--repeat") {
      ok = integer(1, 100, o.repeat);
    } else if (arg == "--policy") {
      ok = text(o.policy);
    } else if (arg == "--host") {
      auto v = value();
      ok = v.has_value() && (*v == "ebpf" || *v == "sampling" || *v == "off");
      if (ok) {
        o.host = *v;
      } else if (v) {
        fmt::print(stderr, "daemon_bench: --host takes ebpf, sampling or off, got '{}'\n", *v);
      }
    } else if (arg == "--wake") {
      auto v = value();
      ok = v.has_value() && (*v == "doorbell" || *v == "poll");
      if (ok) {
        o.wake = *v == "poll" ? Wake::kPoll : Wake::kDoorbell;
      } else if (v) {
        fmt::print(stderr, "daemon_bench: --wake takes doorbell or poll, got '{}'\n", *v);
      }
    } else if (arg == "--tandemd") {
      ok = text(o.tandemd);
    } else if (arg == "--runtime-parent") {
      ok = text(o.runtime_parent);
    } else if (arg == "--keep") {
      o.keep = true;
    } else {
      fmt::print(stderr, "daemon_bench: unknown argument '{}'\n", arg);
      print_usage(stderr);
      return 2;
    }
    if (!ok) return 2;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The daemon

// pid of the running tandemd, for the signal handler.
volatile sig_atomic_t g_daemon_pid = 0;

void on_fatal_signal(int sig) {
  const pid_t pid = g_daemon_pid;
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  ::_exit(128 + sig);
}

// CPU time of a live process (all its threads).
struct ProcCpu {
  double stat_user_s = 0;                // /proc/<pid>/stat utime
  double stat_sys_s = 0;                 // /proc/<pid>/stat stime
  std::int64_t clock_ns = 0;             // clock_getcpuclockid: user + sys, ns
  std::uint64_t voluntary_switches = 0;  // over all threads
  std::uint64_t involuntary_switches = 0;
  int threads = 0;
};

Result<ProcCpu> read_proc_cpu(pid_t pid) {
  ProcCpu out;
  const std::string base = fmt::format("/proc/{}", pid);
  std::ifstream stat_file(base + "/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return base::make_error(EIO, fmt::format("{}/stat: unreadable", base));
  std::istringstream fields(stat.substr(paren + 2));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) f.push_back(s);
  // After "pid (comm) ": field 3 (state) is f[0], so utime (14) is f[11].
  if (f.size() < 13) return base::make_error(EIO, fmt::format("{}/stat: too few fields", base));
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  out.stat_user_s = std::stod(f[11]) / tick;
  out.stat_sys_s = std::stod(f[12]) / tick;

  clockid_t cid{};
  if (::clock_getcpuclockid(pid, &cid) != 0) return base::make_error(EIO, "clock_getcpuclockid");
  timespec ts{};
  if (::clock_gettime(cid, &ts) != 0) return base::errno_error("clock_gettime(cpu clock of tandemd)");
  out.clock_ns = std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;

  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(base + "/task", ec)) {
    ++out.threads;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      auto take = [&](std::string_view key, std::uint64_t& into) {
        if (line.starts_with(key)) into += std::strtoull(line.c_str() + key.size(), nullptr, 10);
      };
      take("voluntary_ctxt_switches:", out.voluntary_switches);
      take("nonvoluntary_ctxt_switches:", out.involuntary_switches);
    }
  }
  return out;
}

double rusage_seconds(const rusage& r) {
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return tv(r.ru_utime) + tv(r.ru_stime);
}

// ---------------------------------------------------------------------------
// Raw protocol client

using Conn = ipc::DaemonConnection;

// A connection that said Hello as `role` and was welcomed.
Result<std::unique_ptr<Conn>> open_conn(const std::string& path, wire::Role role, const std::string& name,
                                        const std::optional<ipc::EngineInfo>& engine = std::nullopt) {
  auto c = Conn::connect(path);
  if (!c) return base::propagate(std::move(c.error()));
  if (auto h = c->hello(role, name, engine, kReplyTimeout); !h) {
    return base::propagate(std::move(h.error()), fmt::format("{}: Hello", name));
  }
  return std::make_unique<Conn>(std::move(*c));
}

// ctl `command`'s reply, parsed.
Result<json> ctl_json(Conn& c, const std::string& command) {
  auto body = c.ctl(command, kReplyTimeout);
  if (!body) return base::propagate(std::move(body.error()), "ctl");
  json j = json::parse(*body, nullptr, false);
  if (j.is_discarded()) return base::make_error(EBADMSG, "ctl reply is not JSON");
  return j;
}

// Error messages the daemon sent on the socket (read without blocking);
// the first one's text goes to `first`.
int drain_errors(Conn& c, std::string& first) {
  int errors = 0;
  while (true) {
    pollfd p{c.fd(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    auto m = ipc::recv_message(c.fd());
    if (!m) break;
    if (m->message()->payload_type() == wire::Payload::Error) {
      const auto* e = m->message()->payload_as_Error();
      if (errors++ == 0) first = e->message() ? e->message()->str() : "";
    }
  }
  return errors;
}

// ---------------------------------------------------------------------------
// The clients

// A session whose round ended, handed from an engine to the runner.
struct Handoff {
  std::uint64_t session = 0;
  std::int64_t at_ns = 0;
};

// What the threads share.
struct Shared {
  std::atomic<bool> stop{false};
  std::atomic<bool> submit_initial{false};  // engines: submit the initial rounds and start churning
  std::atomic<std::int64_t> window_start{std::numeric_limits<std::int64_t>::max()};
  std::atomic<std::int64_t> window_end{std::numeric_limits<std::int64_t>::max()};
  std::mutex handoff_mu;
  std::vector<Handoff> handoffs;  // guarded by handoff_mu

  bool in_window(std::int64_t ts) const {
    return ts >= window_start.load(std::memory_order_relaxed) && ts < window_end.load(std::memory_order_relaxed);
  }
};

// One engine's counters; read by main after the thread ends.
struct EngineStats {
  std::vector<std::int64_t> latency_ns;      // decision → seen, stamped in the window
  std::vector<std::int64_t> admit_delay_ns;  // ROUND_SUBMIT → ADMIT seen, submitted in the window
  std::uint64_t directives = 0;
  std::uint64_t directives_in_window = 0;
  std::uint64_t admits = 0;
  std::uint64_t admits_at_submit = 0;   // initial sessions, told at their ROUND_SUBMIT
  std::uint64_t admits_unexpected = 0;  // for a session this engine was not waiting on
  std::uint64_t undecodable = 0;
  std::uint64_t push_failed = 0;
  std::uint64_t kv_stats_sent = 0;
  std::uint64_t round_ends_sent = 0;
  std::uint64_t submits_sent = 0;
  std::uint64_t churn_skipped = 0;  // nothing admitted to finish
  std::array<std::uint64_t, 64> by_type{};
};

void engine_main(const Options& o, Shared& sh, Conn& conn, int index, std::vector<std::uint64_t> initial,
                 EngineStats& st) {
  std::deque<std::uint64_t> live;                           // admitted, round in flight; oldest first
  std::unordered_map<std::uint64_t, std::int64_t> waiting;  // fresh session → submit time
  std::unordered_set<std::uint64_t> initial_unannounced(initial.begin(), initial.end());
  std::uint64_t fresh_seq = 0;
  bool churning = false;
  ipc::RecordDecoder decoder(ipc::Direction::kToClient);
  ipc::RingConsumer& dirs = conn.directives();

  auto push = [&](const ipc::Slot& s) {
    if (!conn.push(s)) ++st.push_failed;
  };
  auto drain = [&] {
    ipc::Slot slot;
    while (dirs.try_pop(slot)) {
      const std::int64_t seen = now_ns();
      ipc::Record r;
      if (decoder.decode(slot, r) != ipc::DecodeStatus::kOk) {
        ++st.undecodable;
        continue;
      }
      ++st.directives;
      ++st.by_type[static_cast<std::size_t>(r.header().type) % st.by_type.size()];
      if (sh.in_window(r.timestamp_ns())) {
        ++st.directives_in_window;
        st.latency_ns.push_back(seen - r.timestamp_ns());
      }
      if (r.type() == ipc::RecordType::kAdmit) {
        ++st.admits;
        auto it = waiting.find(r.session());
        if (it == waiting.end()) {
          // An initial session: admitted before its round was submitted, so
          // the daemon tells this engine at the ROUND_SUBMIT. Once each.
          if (initial_unannounced.erase(r.session()) == 1) {
            ++st.admits_at_submit;
          } else {
            ++st.admits_unexpected;
          }
          continue;
        }
        if (sh.in_window(it->second)) st.admit_delay_ns.push_back(seen - it->second);
        live.push_back(r.session());
        waiting.erase(it);
      }
    }
  };
  auto submit = [&](std::uint64_t session) {
    ipc::RoundSubmit r;
    r.round = 0;
    r.prompt_tokens = kPromptTokens;
    r.projected_blocks = kBlocksPerSession;
    r.max_output_tokens = kOutputTokens;
    push(make_record(r, session));
    ++st.submits_sent;
  };
  auto send_stats = [&] {
    ipc::KvStats k;
    const auto held = static_cast<std::uint32_t>(live.size() + waiting.size()) * kBlocksPerSession;
    k.blocks_total = kTotalBlocks;
    k.blocks_free = held < kTotalBlocks ? kTotalBlocks - held : 0;
    k.blocks_pinned = 0;
    k.running_seqs = static_cast<std::uint32_t>(live.size());
    k.waiting_seqs = static_cast<std::uint32_t>(waiting.size());
    k.step_tokens = kStepTokens;
    k.step_time_us = kStepTimeUs;
    push(make_record(k, base::kNoSession));
    ++st.kv_stats_sent;
  };
  auto churn = [&] {
    if (live.empty()) {
      ++st.churn_skipped;
      return;
    }
    const std::uint64_t done = live.front();
    live.pop_front();
    ipc::RoundEnd e;
    e.header.flags = ipc::kRoundEndToolFollows;
    e.round = 0;
    e.output_tokens = kOutputTokens;
    e.blocks_held = kBlocksPerSession;
    push(make_record(e, done));
    ++st.round_ends_sent;
    {
      std::lock_guard lock(sh.handoff_mu);
      sh.handoffs.push_back(Handoff{done, now_ns()});
    }
    const std::uint64_t fresh = base::session_id(fmt::format("bench-e{}-{}", index, fresh_seq++));
    waiting.emplace(fresh, now_ns());
    submit(fresh);
  };

  const std::int64_t stats_period = 1'000'000'000 / o.stats_hz;
  const std::int64_t churn_period = o.churn_hz > 0 ? 1'000'000'000 / o.churn_hz : 0;
  // Spread the engines over a period so their sends do not all coincide.
  std::int64_t next_stats = now_ns() + stats_period * index / o.engines;
  std::int64_t next_churn = std::numeric_limits<std::int64_t>::max();
  while (!sh.stop.load(std::memory_order_relaxed)) {
    drain();
    if (!churning && sh.submit_initial.load(std::memory_order_acquire)) {
      for (std::uint64_t s : initial) {
        submit(s);
        live.push_back(s);
      }
      churning = true;
      if (churn_period > 0) next_churn = now_ns() + churn_period * index / o.engines;
    }
    std::int64_t now = now_ns();
    if (now >= next_stats) {
      send_stats();
      next_stats += stats_period;
      if (next_stats <= now) next_stats = now + stats_period;  // fell behind: no burst
    }
    if (now >= next_churn) {
      churn();
      next_churn += churn_period;
      if (next_churn <= now) next_churn = now + churn_period;
    }
    now = now_ns();
    const std::int64_t next = std::min(next_stats, next_churn);
    if (next <= now) continue;
    if (o.wake == Wake::kDoorbell) {
      auto r = conn.directive_bell().wait([&] { return !dirs.empty(); }, base::Duration(next - now), 0);
      (void)r;  // an error here shows as directives never seen
    } else {
      sleep_ns(std::min<std::int64_t>(next - now, std::chrono::nanoseconds(kPollPeriod).count()));
    }
  }
}

struct RunnerStats {
  std::uint64_t tool_starts = 0;
  std::uint64_t tool_ends = 0;
  std::uint64_t closes = 0;
  std::uint64_t push_failed = 0;
};

void runner_main(const Options& o, Shared& sh, Conn& conn, RunnerStats& st) {
  struct Pending {
    Handoff h;
    bool started = false;
  };
  std::deque<Pending> pending;  // by hand-off time
  std::vector<Handoff> incoming;
  const std::uint64_t tool = base::tool_kind_id("bench-tool");
  const std::int64_t tool_ns = std::int64_t{o.tool_ms} * 1'000'000;
  auto push = [&](const ipc::Slot& s) {
    if (!conn.push(s)) ++st.push_failed;
  };
  while (!sh.stop.load(std::memory_order_relaxed)) {
    {
      std::lock_guard lock(sh.handoff_mu);
      incoming.swap(sh.handoffs);
    }
    for (const Handoff& h : incoming) pending.push_back(Pending{h, false});
    incoming.clear();
    const std::int64_t now = now_ns();
    for (Pending& p : pending) {
      if (p.started) continue;
      ipc::ToolStart ts;
      ts.tool_kind = tool;
      ts.tool_call = 1;
      push(make_record(ts, p.h.session));
      p.started = true;
      ++st.tool_starts;
    }
    while (!pending.empty() && pending.front().h.at_ns + tool_ns <= now) {
      const std::uint64_t s = pending.front().h.session;
      ipc::ToolEnd te;
      te.tool_kind = tool;
      te.tool_call = 1;
      te.exit_code = 0;
      te.wall_ns = static_cast<std::uint64_t>(tool_ns);
      push(make_record(te, s));
      ++st.tool_ends;
      ipc::SessionClose c;
      c.reason = static_cast<std::uint8_t>(ipc::CloseReason::kNormal);
      push(make_record(c, s));
      ++st.closes;
      pending.pop_front();
    }
    sleep_ns(std::chrono::nanoseconds(kRunnerPeriod).count());
  }
}

// ---------------------------------------------------------------------------
// One run

struct RunResult {
  double window_s = 0;
  double cpu_stat_s = 0;  // /proc stat utime + stime over the window
  double cpu_stat_user_s = 0;
  double cpu_stat_sys_s = 0;
  double cpu_clock_s = 0;  // process CPU clock over the window
  double cpu_percent = 0;  // from the CPU clock
  double cpu_stat_percent = 0;
  double lifetime_cpu_s = 0;  // getrusage(RUSAGE_CHILDREN) at exit
  double lifetime_wall_s = 0;
  double lifetime_max_rss_mib = 0;
  double wakeups_per_s = 0;  // voluntary context switches
  double involuntary_per_s = 0;
  int daemon_threads = 0;
  double ticks_per_s = 0;
  double records_per_s = 0;       // accepted by the daemon
  double records_sent_per_s = 0;  // pushed by the bench
  double directives_per_s = 0;    // sent by the daemon (ctl)
  double actions_per_s = 0;
  std::uint64_t live_sessions = 0;  // ctl status at the window's end
  std::uint64_t rejected = 0;
  std::uint64_t late = 0;  // records about a session that had ended (since the daemon started)
  base::Summary latency;   // µs
  base::Summary admit_delay;
  double bench_cpu_s = 0;
  double bench_cpu_percent = 0;
  int exit_status = 0;
  json status_end;
};

std::uint64_t live_of(const json& status) {
  const json& s = status.at("sessions");
  return s.at("waiting").get<std::uint64_t>() + s.at("reasoning").get<std::uint64_t>() +
         s.at("acting").get<std::uint64_t>() + s.at("paused").get<std::uint64_t>();
}

std::string tail_of(const std::string& s, std::size_t max_bytes = 4000) {
  return s.size() > max_bytes ? "…" + s.substr(s.size() - max_bytes) : s;
}

// The cgroup subtree of the bench's tandemds: its own, so a tandemd running on
// the machine is never touched.
std::string subtree_name() { return fmt::format("tandem-bench-{}", ::getpid()); }

std::string config_text(const Options& o) {
  std::string t = fmt::format("[policy]\nname = \"{}\"\n", o.policy);
  if (o.tick_ms > 0) t += fmt::format("tick_ms = {}\n", o.tick_ms);
  if (o.policy == "mars" || o.policy == "tandem") {
    t += fmt::format("[policy.params]\nwindow_min = {0}\nwindow_max = {0}\nwindow_init = {0}\n", kOpenWindow);
  }
  t += fmt::format("[cgroups]\nmode = \"{}\"\nsubtree = \"{}\"\n", o.host == "off" ? "off" : "auto", subtree_name());
  if (o.host != "off") t += fmt::format("[telemetry]\nmode = \"{}\"\n", o.host == "ebpf" ? "auto" : "sampling");
  return t;
}

Result<RunResult> run_once(const Options& o) {
  testbed::DaemonOptions options;
  options.tandemd = o.tandemd;
  options.temp_prefix = "tandem-bench-";
  options.temp_parent = o.runtime_parent;
  options.keep_dir = o.keep;
  options.config = config_text(o);
  if (o.host != "off") options.cgroup_subtree = subtree_name();
  options.start_timeout = kStartTimeout;
  options.stop_timeout = kStopTimeout;
  auto made = testbed::DaemonProcess::create(std::move(options));
  if (!made) return base::propagate(std::move(made.error()));
  testbed::DaemonProcess& daemon = **made;
  // The signal handler's pid, cleared before the daemon is stopped on any path.
  struct ForgetPid {
    ~ForgetPid() { g_daemon_pid = 0; }
  } forget_pid;
  if (o.keep) fmt::print("runtime dir: {}\n", daemon.runtime_dir());
  const std::string& sock = daemon.socket_path();

  // Shows the daemon's log, then fails the run with `why`.
  auto fail = [&](std::string why) -> Result<RunResult> {
    std::fflush(stdout);
    fmt::print(stderr, "--- tandemd.log (tail) ---\n{}\n--------------------------\n", tail_of(daemon.log()));
    return base::make_error(EIO, std::move(why));
  };

  rusage children_before{};
  ::getrusage(RUSAGE_CHILDREN, &children_before);
  const std::int64_t started_ns = now_ns();
  if (auto r = daemon.start(); !r) return fail(r.error().message());
  g_daemon_pid = daemon.pid();

  auto ctl = open_conn(sock, wire::Role::CtlRead, "bench-ctl");
  if (!ctl) return fail(ctl.error().message());
  auto status = [&]() -> Result<json> { return ctl_json(**ctl, "status"); };

  auto runner = open_conn(sock, wire::Role::Runner, "bench-runner");
  if (!runner) return fail(runner.error().message());
  std::vector<std::unique_ptr<Conn>> engines;
  for (int e = 0; e < o.engines; ++e) {
    ipc::EngineInfo info;
    info.block_size = kBlockSize;
    info.total_blocks = kTotalBlocks;
    info.max_seqs = kMaxSeqs;
    info.token_budget = kTokenBudget;
    auto c = open_conn(sock, wire::Role::Engine, fmt::format("bench-engine-{}", e), info);
    if (!c) return fail(c.error().message());
    engines.push_back(std::move(*c));
  }

  // The initial sessions, dealt to the engines round-robin.
  std::vector<std::vector<std::uint64_t>> initial(o.engines);
  std::vector<std::uint64_t> all;
  for (int i = 0; i < o.sessions; ++i) {
    const std::uint64_t id = base::session_id(fmt::format("bench-{}", i));
    all.push_back(id);
    initial[i % o.engines].push_back(id);
  }

  Shared sh;
  std::vector<EngineStats> estats(o.engines);
  RunnerStats rstats;
  std::vector<std::jthread> threads;
  // Declared after the threads: destroyed first, so every exit path stops
  // them before they are joined.
  struct StopGuard {
    Shared& sh;
    ~StopGuard() { sh.stop = true; }
  } stop_guard{sh};

  threads.reserve(static_cast<std::size_t>(o.engines) + 1);
  for (int e = 0; e < o.engines; ++e) {
    threads.emplace_back(engine_main, std::cref(o), std::ref(sh), std::ref(*engines[e]), e, initial[e],
                         std::ref(estats[e]));
  }

  // Set-up: the runner opens every session (before its thread starts, so
  // the ring has one producer at a time); once the policy has admitted them
  // all, the engines submit their first rounds.
  for (std::uint64_t id : all) {
    ipc::SessionOpen open;
    const auto deadline = std::chrono::steady_clock::now() + kSetupTimeout;
    while (!(*runner)->push(make_record(open, id))) {
      if (std::chrono::steady_clock::now() > deadline) return fail("the runner's event ring stayed full at set-up");
      sleep_ns(1'000'000);
    }
  }
  {
    const auto deadline = std::chrono::steady_clock::now() + kSetupTimeout;
    while (true) {
      auto s = status();
      if (!s) return fail(fmt::format("ctl status: {}", s.error().message()));
      const json& ss = s->at("sessions");
      const auto total = ss.at("total").get<std::uint64_t>();
      const auto waiting = ss.at("waiting").get<std::uint64_t>();
      if (total == all.size() && waiting == 0) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return fail(
            fmt::format("set-up: after {} s the daemon holds {} sessions, {} of them waiting; expected {} "
                        "all admitted (does policy '{}' admit every waiting session?)",
                        std::chrono::duration_cast<std::chrono::seconds>(kSetupTimeout).count(), total, waiting,
                        all.size(), o.policy));
      }
      std::this_thread::sleep_for(kCtlPoll);
    }
  }
  sh.submit_initial.store(true, std::memory_order_release);
  threads.emplace_back(runner_main, std::cref(o), std::ref(sh), std::ref(**runner), std::ref(rstats));

  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup));

  // The window. ctl queries sit outside it.
  auto s0 = status();
  if (!s0) return fail(fmt::format("ctl status: {}", s0.error().message()));
  auto sent = [&] {
    std::uint64_t n = 0;
    for (const EngineStats& e : estats) n += e.kv_stats_sent + e.round_ends_sent + e.submits_sent;
    return n + rstats.tool_starts + rstats.tool_ends + rstats.closes;
  };
  // (The counters are read racily; they only size the check below.)
  rusage self0{};
  ::getrusage(RUSAGE_SELF, &self0);
  auto cpu0 = read_proc_cpu(daemon.pid());
  if (!cpu0) return fail(cpu0.error().message());
  const std::uint64_t sent0 = sent();
  const std::int64_t w0 = now_ns();
  sh.window_start = w0;
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  const std::int64_t w1 = now_ns();
  sh.window_end = w1;
  auto cpu1 = read_proc_cpu(daemon.pid());
  if (!cpu1) return fail(cpu1.error().message());
  rusage self1{};
  ::getrusage(RUSAGE_SELF, &self1);
  const std::uint64_t sent1 = sent();
  auto s1 = status();
  if (!s1) return fail(fmt::format("ctl status: {}", s1.error().message()));
  // Let the last directives of the window arrive, then stop the clients.
  std::this_thread::sleep_for(std::chrono::milliseconds(o.tick_ms > 0 ? 2 * o.tick_ms : 100));
  sh.stop = true;
  for (std::jthread& t : threads) t.join();

  RunResult r;
  r.window_s = static_cast<double>(w1 - w0) / 1e9;
  r.cpu_stat_user_s = cpu1->stat_user_s - cpu0->stat_user_s;
  r.cpu_stat_sys_s = cpu1->stat_sys_s - cpu0->stat_sys_s;
  r.cpu_stat_s = r.cpu_stat_user_s + r.cpu_stat_sys_s;
  r.cpu_clock_s = static_cast<double>(cpu1->clock_ns - cpu0->clock_ns) / 1e9;
  r.cpu_percent = 100.0 * r.cpu_clock_s / r.window_s;
  r.cpu_stat_percent = 100.0 * r.cpu_stat_s / r.window_s;
  r.wakeups_per_s = static_cast<double>(cpu1->voluntary_switches - cpu0->voluntary_switches) / r.window_s;
  r.involuntary_per_s = static_cast<double>(cpu1->involuntary_switches - cpu0->involuntary_switches) / r.window_s;
  r.daemon_threads = cpu1->threads;
  auto delta = [&](std::initializer_list<const char*> path) {
    const json* a = &*s0;
    const json* b = &*s1;
    for (const char* k : path) {
      a = &a->at(k);
      b = &b->at(k);
    }
    return static_cast<double>(b->get<std::uint64_t>() - a->get<std::uint64_t>());
  };
  r.ticks_per_s = delta({"ticks"}) / r.window_s;
  r.records_per_s = delta({"records", "accepted"}) / r.window_s;
  r.records_sent_per_s = static_cast<double>(sent1 - sent0) / r.window_s;
  r.directives_per_s = delta({"directives"}) / r.window_s;
  r.actions_per_s = delta({"actions"}) / r.window_s;
  r.live_sessions = live_of(*s1);
  r.rejected = s1->at("records").at("rejected").get<std::uint64_t>();
  r.late = s1->at("records").value("late", std::uint64_t{0});
  r.status_end = *s1;
  r.bench_cpu_s = rusage_seconds(self1) - rusage_seconds(self0);
  r.bench_cpu_percent = 100.0 * r.bench_cpu_s / r.window_s;

  std::vector<std::int64_t> lat;
  std::vector<std::int64_t> adm;
  std::uint64_t push_failed = rstats.push_failed;
  std::uint64_t undecodable = 0;
  std::uint64_t unexpected = 0;
  std::uint64_t skipped = 0;
  for (const EngineStats& e : estats) {
    lat.insert(lat.end(), e.latency_ns.begin(), e.latency_ns.end());
    adm.insert(adm.end(), e.admit_delay_ns.begin(), e.admit_delay_ns.end());
    push_failed += e.push_failed;
    undecodable += e.undecodable;
    unexpected += e.admits_unexpected;
    skipped += e.churn_skipped;
  }
  r.latency = base::summarize_ns_as_us(lat);
  r.admit_delay = base::summarize_ns_as_us(adm);

  std::string first_error;
  int socket_errors = drain_errors(**runner, first_error);
  for (auto& e : engines) socket_errors += drain_errors(*e, first_error);

  // Stop the daemon: whole-life CPU from the kernel's accounting.
  g_daemon_pid = 0;
  const auto stopped = daemon.stop();
  const std::int64_t stopped_ns = now_ns();
  const int wstatus = daemon.wait_status().value_or(0);
  rusage children_after{};
  ::getrusage(RUSAGE_CHILDREN, &children_after);
  r.lifetime_cpu_s = rusage_seconds(children_after) - rusage_seconds(children_before);
  r.lifetime_wall_s = static_cast<double>(stopped_ns - started_ns) / 1e9;
  r.lifetime_max_rss_mib = static_cast<double>(children_after.ru_maxrss) / 1024.0;  // largest child so far
  r.exit_status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);

  // Sanity: the load reached the daemon.
  std::vector<std::string> problems;
  const auto n = static_cast<std::uint64_t>(o.sessions);
  // In flight beyond --sessions: sessions whose tool runs (tool_ms) plus the
  // closed ones the next tick reaps, with a tick of slack each way.
  const double tick_s = (o.tick_ms > 0 ? o.tick_ms : 50) / 1e3;
  const auto in_flight = static_cast<std::uint64_t>(
      std::ceil(o.engines * o.churn_hz * (o.tool_ms / 1e3 + 2 * tick_s + 2 * kRunnerPeriod.count() / 1e3)));
  if (r.live_sessions + o.engines < n || r.live_sessions > n + in_flight) {
    problems.push_back(fmt::format("ctl status shows {} live sessions; expected {} (+ up to {} in flight)",
                                   r.live_sessions, n, in_flight));
  }
  if (r.records_per_s <= 0 || r.records_per_s < kMinAcceptedShare * r.records_sent_per_s) {
    problems.push_back(fmt::format("the daemon accepted {:.0f} records/s in the window; the clients sent {:.0f}/s",
                                   r.records_per_s, r.records_sent_per_s));
  }
  if (r.rejected != 0) problems.push_back(fmt::format("the daemon rejected {} records", r.rejected));
  for (const char* k : {"directives_dropped", "clients_dropped", "clients_refused"}) {
    if (s1->at(k).get<std::uint64_t>() != 0) {
      problems.push_back(fmt::format("ctl status: {} = {}", k, s1->at(k).get<std::uint64_t>()));
    }
  }
  if (push_failed != 0) problems.push_back(fmt::format("{} records did not fit in an event ring", push_failed));
  if (undecodable != 0) problems.push_back(fmt::format("{} directives failed validation", undecodable));
  if (unexpected != 0)
    problems.push_back(fmt::format("{} ADMITs for sessions the engine was not waiting on", unexpected));
  if (skipped != 0) problems.push_back(fmt::format("{} churn steps found no admitted session to finish", skipped));
  if (o.churn_hz > 0 && r.latency.count == 0)
    problems.push_back("no directive stamped in the window reached an engine");
  if (socket_errors != 0) {
    problems.push_back(fmt::format("the daemon sent {} Error messages (first: {})", socket_errors, first_error));
  }
  if (!stopped) problems.push_back(stopped.error().message());
  if (!problems.empty()) {
    std::string all_problems;
    for (const std::string& p : problems) all_problems += "\n  - " + p;
    return fail("sanity checks failed:" + all_problems);
  }
  return r;
}

// ---------------------------------------------------------------------------
// Output

json to_json(const RunResult& r) {
  auto pct = [](const base::Summary& p) {
    return json{{"count", p.count}, {"p50_us", p.p50}, {"p99_us", p.p99}, {"max_us", p.max}};
  };
  return json{
      {"window_s", r.window_s},
      {"daemon_cpu_s", r.cpu_clock_s},
      {"daemon_cpu_percent_of_core", r.cpu_percent},
      {"daemon_cpu_stat_s", r.cpu_stat_s},
      {"daemon_cpu_stat_user_s", r.cpu_stat_user_s},
      {"daemon_cpu_stat_sys_s", r.cpu_stat_sys_s},
      {"daemon_cpu_stat_percent_of_core", r.cpu_stat_percent},
      {"daemon_lifetime_cpu_s", r.lifetime_cpu_s},
      {"daemon_lifetime_wall_s", r.lifetime_wall_s},
      {"daemon_max_rss_mib", r.lifetime_max_rss_mib},
      {"daemon_threads", r.daemon_threads},
      {"daemon_voluntary_switches_per_s", r.wakeups_per_s},
      {"daemon_involuntary_switches_per_s", r.involuntary_per_s},
      {"ticks_per_s", r.ticks_per_s},
      {"records_accepted_per_s", r.records_per_s},
      {"records_sent_per_s", r.records_sent_per_s},
      {"directives_per_s", r.directives_per_s},
      {"actions_per_s", r.actions_per_s},
      {"live_sessions", r.live_sessions},
      {"records_rejected", r.rejected},
      {"records_late", r.late},
      {"decision_to_engine", pct(r.latency)},
      {"submit_to_admit", pct(r.admit_delay)},
      {"bench_cpu_s", r.bench_cpu_s},
      {"bench_cpu_percent_of_core", r.bench_cpu_percent},
      {"daemon_exit_status", r.exit_status},
  };
}

void print_run(const Options& o, int index, const RunResult& r) {
  fmt::print("\nrun {}/{}: window {:.2f} s\n", index + 1, o.repeat, r.window_s);
  fmt::print("  daemon CPU, window (process CPU clock)  {:8.4f} s = {:6.3f} % of one core   target ≤ {:.0f} %: {}\n",
             r.cpu_clock_s, r.cpu_percent, kTargetCpuPercent, r.cpu_percent <= kTargetCpuPercent ? "met" : "MISSED");
  fmt::print("  daemon CPU, window (/proc stat ticks)   {:8.2f} s = {:6.3f} % (user {:.2f} s, sys {:.2f} s)\n",
             r.cpu_stat_s, r.cpu_stat_percent, r.cpu_stat_user_s, r.cpu_stat_sys_s);
  fmt::print(
      "  daemon CPU, whole life (getrusage)      {:8.3f} s over {:.1f} s wall (set-up included); "
      "max RSS {:.1f} MiB\n",
      r.lifetime_cpu_s, r.lifetime_wall_s, r.lifetime_max_rss_mib);
  fmt::print("  daemon wake-ups                         {:8.0f} /s voluntary, {:.0f} /s involuntary ({} thread{})\n",
             r.wakeups_per_s, r.involuntary_per_s, r.daemon_threads, r.daemon_threads == 1 ? "" : "s");
  fmt::print(
      "  daemon work                             {:8.0f} records/s accepted ({:.0f}/s sent), {:.0f} "
      "directives/s, {:.1f} ticks/s, {} live sessions, {} late records\n",
      r.records_per_s, r.records_sent_per_s, r.directives_per_s, r.ticks_per_s, r.live_sessions, r.late);
  fmt::print("  decision → engine sees directive        n={} p50 {:.1f} µs  p99 {:.1f} µs  max {:.1f} µs\n",
             r.latency.count, r.latency.p50, r.latency.p99, r.latency.max);
  fmt::print("  ROUND_SUBMIT → ADMIT seen (waits a tick) n={} p50 {:.2f} ms  p99 {:.2f} ms  max {:.2f} ms\n",
             r.admit_delay.count, r.admit_delay.p50 / 1e3, r.admit_delay.p99 / 1e3, r.admit_delay.max / 1e3);
  fmt::print("  bench clients' own CPU                  {:8.3f} s = {:6.2f} % of one core\n", r.bench_cpu_s,
             r.bench_cpu_percent);
}

int run_main(int argc, char** argv) {
  Options o;
  if (int rc = parse_args(argc, argv, o); rc != 0) return rc == 1 ? 0 : 2;
  if (o.runtime_parent.empty()) o.runtime_parent = runtime_parent_default();

  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  const unsigned cores = std::thread::hardware_concurrency();
  fmt::print(
      "daemon_bench: tandemd ({}) with {} engines (KV_STATS {} Hz, {} fresh sessions/s each) and 1 runner, "
      "{} live sessions\n",
      o.tandemd, o.engines, o.stats_hz, o.churn_hz, o.sessions);
  fmt::print("policy {}{}, tick {} ms, engines wait by {}, tool {} ms; window {} s after {} s warm-up; {} CPU{}\n",
             o.policy, (o.policy == "mars" || o.policy == "tandem") ? fmt::format(" (window {})", kOpenWindow) : "",
             o.tick_ms > 0 ? o.tick_ms : 50, o.wake == Wake::kDoorbell ? "doorbell" : "polling every 1 ms", o.tool_ms,
             o.seconds, o.warmup, cores, cores == 1 ? "" : "s");
  const bool runtime_on_tmpfs = on_tmpfs(o.runtime_parent);
  fmt::print("runtime dir under {} ({}){}\n", o.runtime_parent, runtime_on_tmpfs ? "tmpfs" : "not tmpfs",
             runtime_on_tmpfs
                 ? ""
                 : ": tandemd's under systemd is on a tmpfs, and its journal's writes cost more on a disk file system");

  // A bench killed by a signal exits at once and leaves its subtree: sweep
  // those of benches that are gone.
  if (o.host != "off") {
    auto swept = testbed::sweep_stale_subtrees("tandem-bench-");
    if (!swept) {
      fmt::print(stderr, "daemon_bench: {}\n", swept.error().message());
      return 1;
    }
    for (const std::string& name : *swept) fmt::print("swept {}, left by a daemon_bench that was killed\n", name);
  }

  std::fflush(stdout);
  std::vector<RunResult> runs;
  for (int i = 0; i < o.repeat; ++i) {
    auto r = run_once(o);
    if (!r) {
      fmt::print(stderr, "daemon_bench: run {}: {}\n", i + 1, r.error().message());
      return 1;
    }
    print_run(o, i, *r);
    std::fflush(stdout);
    runs.push_back(std::move(*r));
  }

  json out;
  out["bench"] = "daemon_bench";
  out["config"] = {{"engines", o.engines},
                   {"sessions", o.sessions},
                   {"stats_hz", o.stats_hz},
                   {"churn_hz", o.churn_hz},
                   {"tool_ms", o.tool_ms},
                   {"tick_ms", o.tick_ms > 0 ? o.tick_ms : 50},
                   {"policy", o.policy},
                   {"seconds", o.seconds},
                   {"warmup", o.warmup},
                   {"repeat", o.repeat},
                   {"cores", cores},
                   {"wake", o.wake == Wake::kDoorbell ? "doorbell" : "poll"},
                   {"tandemd", o.tandemd},
                   {"runtime_parent", o.runtime_parent},
                   {"runtime_on_tmpfs", runtime_on_tmpfs},
                   {"host", o.host}};
  json list = json::array();
  for (const RunResult& r : runs) list.push_back(to_json(r));
  out["runs"] = list;
  json med = json::object();
  for (const auto& [key, value] : list.front().items()) {
    if (value.is_number()) {
      std::vector<double> v;
      for (const json& r : list) v.push_back(r.at(key).get<double>());
      med[key] = base::median(v);
    } else if (value.is_object()) {
      for (const auto& [sub, subv] : value.items()) {
        std::vector<double> v;
        for (const json& r : list) v.push_back(r.at(key).at(sub).get<double>());
        med[key][sub] = base::median(v);
      }
    }
  }
  out["median"] = med;
  if (o.repeat > 1) {
    fmt::print("\nmedians over {} runs:\n", o.repeat);
    fmt::print("  daemon CPU {:.3f} % of one core (/proc stat {:.3f} %), target ≤ {:.0f} %: {}\n",
               med["daemon_cpu_percent_of_core"].get<double>(), med["daemon_cpu_stat_percent_of_core"].get<double>(),
               kTargetCpuPercent,
               med["daemon_cpu_percent_of_core"].get<double>() <= kTargetCpuPercent ? "met" : "MISSED");
    fmt::print("  decision → engine p50 {:.1f} µs, p99 {:.1f} µs, max {:.1f} µs\n",
               med["decision_to_engine"]["p50_us"].get<double>(), med["decision_to_engine"]["p99_us"].get<double>(),
               med["decision_to_engine"]["max_us"].get<double>());
    fmt::print("  bench clients' CPU {:.2f} % of one core\n", med["bench_cpu_percent_of_core"].get<double>());
  }
  fmt::print("{}\n", out.dump());
  return 0;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  try {
    return tandem::bench::run_main(argc, argv);
  } catch (const std::exception& e) {
    // (json::at on an unexpected ctl reply, bad_alloc, …): the daemon is
    // already killed and reaped by the unwinding.
    std::fprintf(stderr, "daemon_bench: %s\n", e.what());
    return 1;
  }
}
