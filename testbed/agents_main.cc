// tandem-agents: replays agent sessions through the live stack (docs/replay.md).
//
//   run            every session on a thread of its own: at its arrival it
//                  opens the session on a libtandem runner handle, sends each
//                  round to the engine emulator over HTTP (streamed, so the
//                  first token's arrival is seen), and runs each tool step as
//                  a real process, tandem-toolburn, through tandem_tool_spawn
//                  in the session's cgroup. One runner thread owns the handle
//                  (a handle is used by one thread at a time) and serves the
//                  session threads' requests. A monitor samples tandemd's
//                  status for the tools' memory. At the end the run's
//                  metrics are computed with the simulator's code, next to
//                  the simulator's prediction for the same workload.
//   daemon-config  the tandemd.toml of a compressed run.
//   compare        runs side by side (testbed/replay_report.h).
//
// Exit status: 0 when every session completed, 1 when some did not (or the
// stack was not there), 2 for bad flags, 130 when stopped by SIGINT/SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/unique_fd.h"
#include "cpu/cgroup.h"
#include "cpu/parse.h"
#include "ipc/daemon_connection.h"
#include "sched/registry.h"
#include "sim/calibrate.h"
#include "sim/host_memory.h"
#include "sim/node.h"
#include "sim/preset.h"
#include "sim/report.h"
#include "sim/workload.h"
#include "tandem/tandem.h"
#include "testbed/http_send.h"
#include "testbed/replay.h"
#include "testbed/replay_report.h"

namespace tandem::testbed {
namespace {

// Attempts of one tool step killed for memory (--tool-mem) before the
// session gives up on it.
constexpr std::uint64_t kMemoryRetries = 5;

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};  // SIGINT/SIGTERM or the run's timeout

// The sessions' HTTP clients. Once the run stops, their requests are cut
// (httplib's stop() shuts the socket from another thread): a stalled engine
// would otherwise hold each read for its hour-long timeout.
std::mutex g_clients_mu;
std::set<httplib::Client*> g_clients;

class ClientRegistration {
 public:
  explicit ClientRegistration(httplib::Client* c) : c_(c) {
    std::lock_guard lock(g_clients_mu);
    g_clients.insert(c_);
  }
  ~ClientRegistration() {
    std::lock_guard lock(g_clients_mu);
    g_clients.erase(c_);
  }
  ClientRegistration(const ClientRegistration&) = delete;
  ClientRegistration& operator=(const ClientRegistration&) = delete;

 private:
  httplib::Client* c_;
};

void stop_clients() {
  std::lock_guard lock(g_clients_mu);
  for (httplib::Client* c : g_clients) c->stop();
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The machine's memory, GiB (/proc/meminfo MemTotal); 0 (the preset's) when
// unreadable.
double node_memory_gib() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib / (1024.0 * 1024.0);
  }
  return 0;
}

// The node's memory stall totals (/proc/pressure/memory, µs), or nullopt
// where the kernel has no PSI.
struct MemoryStall {
  std::uint64_t some_us = 0;
  std::uint64_t full_us = 0;
};
std::optional<MemoryStall> memory_stall() {
  auto text = cpu::read_file(AT_FDCWD, "/proc/pressure/memory");
  if (!text) return std::nullopt;
  auto psi = cpu::parse_psi(*text);
  if (!psi) return std::nullopt;
  return MemoryStall{psi->some.total_us, psi->full ? psi->full->total_us : 0};
}

// ---- the runner thread ---------------------------------------------------------

struct ToolOutcome {
  int rc = 0;  // tandem_tool_spawn's, or a pipe failure (negative errno)
  std::string error;
  tandem_tool_result result{};
  std::string output;  // the tool's stdout
  // /proc/<pid>/cgroup as the runner saw it right after the spawn: the tool
  // itself, in a cgroup namespace of its own, sees only "/".
  std::string cgroup_at_spawn;
};

// Owns the runner handle; other threads call it through post().
class Runner {
 public:
  explicit Runner(const std::string& runtime_dir) {
    tandem_options o{};
    o.sz = sizeof o;
    o.runtime_dir = runtime_dir.empty() ? nullptr : runtime_dir.c_str();
    o.name = "tandem-agents";
    open_rc_ = tandem_runner_open(&o, &client_);
    if (open_rc_ == 0) thread_ = std::thread([this] { loop(); });
  }
  ~Runner() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    tandem_close(client_);  // sessions still open end with the handle; their tools die
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  int open_rc() const { return open_rc_; }

  std::future<std::pair<int, std::uint64_t>> open_session(const std::string& name) {
    auto p = std::make_shared<std::promise<std::pair<int, std::uint64_t>>>();
    auto f = p->get_future();
    post([this, name, p] {
      std::uint64_t id = 0;
      const int rc = tandem_session_open(client_, name.c_str(), nullptr, &id);
      p->set_value({rc, id});
    });
    return f;
  }

  void close_session(std::uint64_t id, bool ok) {
    post([this, id, ok] { (void)tandem_session_close(client_, id, ok ? TANDEM_CLOSE_NORMAL : TANDEM_CLOSE_ERROR); });
  }

  std::future<ToolOutcome> spawn(std::uint64_t session, const std::string& kind, std::vector<std::string> argv) {
    auto p = std::make_shared<std::promise<ToolOutcome>>();
    auto f = p->get_future();
    post([this, session, kind, argv = std::move(argv), p] {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) {
        ToolOutcome out;
        out.rc = -errno;
        out.error = fmt::format("pipe: {}", std::strerror(errno));
        p->set_value(std::move(out));
        return;
      }
      base::UniqueFd read_end(fds[0]);
      base::UniqueFd write_end(fds[1]);
      std::vector<const char*> args;
      for (const std::string& a : argv) args.push_back(a.c_str());
      args.push_back(nullptr);
      tandem_tool_options o{};
      o.sz = sizeof o;
      o.stdout_fd = write_end.get();
      // As root a tool must get its cgroup (the replay checks it did); run
      // unprivileged, tandemd cannot make cgroups and tools run without
      // them, as the README's fallbacks say: asked for, not silent.
      if (::geteuid() != 0) o.flags |= TANDEM_TOOL_ALLOW_UNPLACED;
      std::int32_t pid = 0;
      const int rc = tandem_tool_spawn(client_, session, kind.c_str(), args.data(), nullptr, nullptr, &o, &pid);
      write_end.reset();
      if (rc != 0) {
        ToolOutcome out;
        out.rc = rc;
        out.error = tandem_last_error(client_);
        p->set_value(std::move(out));
        return;
      }
      (void)::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
      std::string cgroup;
      if (std::FILE* cg = std::fopen(fmt::format("/proc/{}/cgroup", pid).c_str(), "re")) {
        char buf[4096];
        const std::size_t n = std::fread(buf, 1, sizeof buf, cg);
        cgroup.assign(buf, n);
        std::fclose(cg);
      }
      running_.push_back({pid, std::move(read_end), p, {}, std::move(cgroup)});
    });
    return f;
  }

 private:
  struct Running {
    std::int32_t pid;
    base::UniqueFd out;
    std::shared_ptr<std::promise<ToolOutcome>> done;
    std::string output;
    std::string cgroup_at_spawn;
  };

  void post(std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      inbox_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }

  static void drain(Running& r) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(r.out.get(), buf, sizeof buf);
      if (n <= 0) break;
      r.output.append(buf, static_cast<std::size_t>(n));
    }
  }

  void loop() {
    std::deque<std::function<void()>> work;
    tandem_directive dirs[16];
    for (;;) {
      {
        std::unique_lock lock(mu_);
        // Tools running: poll them every millisecond; otherwise wake for work
        // (and at least every 50 ms to keep the connection served).
        const auto wait = running_.empty() ? std::chrono::milliseconds(50) : std::chrono::milliseconds(1);
        cv_.wait_for(lock, wait, [&] { return quit_ || !inbox_.empty(); });
        if (quit_) break;
        work.swap(inbox_);
      }
      for (auto& fn : work) fn();
      work.clear();
      (void)tandem_poll(client_, 0, 16, dirs);
      for (auto it = running_.begin(); it != running_.end();) {
        drain(*it);
        tandem_tool_result res{};
        res.sz = sizeof res;
        const int rc = tandem_tool_wait(client_, it->pid, 0, &res);
        if (rc == -ETIMEDOUT) {
          if (g_stop.load()) (void)tandem_tool_kill(client_, it->pid);
          ++it;
          continue;
        }
        drain(*it);
        ToolOutcome out;
        out.rc = rc;
        if (rc != 0) out.error = tandem_last_error(client_);
        out.result = res;
        out.output = std::move(it->output);
        out.cgroup_at_spawn = std::move(it->cgroup_at_spawn);
        it->done->set_value(std::move(out));
        it = running_.erase(it);
      }
    }
    // Leaving: kill and reap what still runs, so no promise is left unset.
    for (Running& r : running_) {
      (void)tandem_tool_kill(client_, r.pid);
      tandem_tool_result res{};
      res.sz = sizeof res;
      ToolOutcome out;
      out.rc = tandem_tool_wait(client_, r.pid, 5000, &res);
      out.result = res;
      out.error = "the run stopped";
      r.done->set_value(std::move(out));
    }
    running_.clear();
  }

  tandem_client* client_ = nullptr;
  int open_rc_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> inbox_;
  bool quit_ = false;
  std::vector<Running> running_;  // runner thread only
  std::thread thread_;
};

// ---- tandemd's status -------------------------------------------------------------

// Samples `tandemctl status` every 250 ms: the tools' memory, and the host
// plane's state for the report. Not reachable: the run goes on without it.
class Monitor {
 public:
  explicit Monitor(std::string runtime_dir) : dir_(std::move(runtime_dir)) {
    first_ = query();
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return quit_; })) {
        lock.unlock();
        auto s = query();
        lock.lock();
        if (s) last_ = std::move(*s);
      }
    });
  }
  ~Monitor() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  const std::optional<json>& first() const { return first_; }
  std::uint64_t peak_tools_memory() const { return peak_; }
  json last() {
    std::lock_guard lock(mu_);
    return last_;
  }

 private:
  std::optional<json> query() {
    if (!conn_) {
      auto c = ipc::DaemonConnection::connect(dir_ + "/tandemd.sock");
      if (!c) return std::nullopt;
      if (!c->hello(wire::Role::CtlRead, "tandem-agents", std::nullopt, std::chrono::milliseconds(1000))) {
        return std::nullopt;
      }
      conn_ = std::move(*c);
    }
    auto body = conn_->ctl("status", std::chrono::milliseconds(1000));
    if (!body) {
      conn_.reset();
      return std::nullopt;
    }
    json j = json::parse(*body, nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    if (j.contains("host") && j["host"].contains("tools_memory_bytes")) {
      peak_ = std::max<std::uint64_t>(peak_, j["host"]["tools_memory_bytes"].get<std::uint64_t>());
    }
    return j;
  }

  std::string dir_;
  std::optional<ipc::DaemonConnection> conn_;  // monitor thread (and the constructor)
  std::optional<json> first_;
  std::atomic<std::uint64_t> peak_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  json last_;
  std::thread thread_;
};

// ---- one session -----------------------------------------------------------------

struct Shared {
  const ReplayFlags& flags;
  std::string host;  // "127.0.0.1:8000" part of the URL
  Runner& runner;
  sim::ToolCpuTable cpus;
  std::optional<sim::ToolMemTable> mem;  // --tool-mem: each call's peak drawn as the simulator draws it
  std::string toolburn;
  Clock::time_point t0;
  std::atomic<std::size_t> done{0};
  std::atomic<std::size_t> tools{0};
  std::atomic<std::size_t> resent{0};  // requests sent again after a stale keep-alive connection
};

// One streamed round: the first data event's arrival is the first token.
std::optional<std::string> send_round(httplib::Client& cli, const json& body, Shared& sh, RoundLog& log) {
  std::string buffer;
  std::string last;  // the last chunk before [DONE]
  std::string error;
  bool first = true;
  bool done = false;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, std::size_t len, std::uint64_t, std::uint64_t) {
    if (first) {
      log.first_token_s = since(sh.t0);
      first = false;
    }
    buffer.append(data, len);
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (!event.starts_with("data: ")) continue;
      event.erase(0, 6);
      if (event == "[DONE]") {
        done = true;
      } else if (event.find("\"error\"") != std::string::npos && event.find("\"choices\"") == std::string::npos) {
        error = event;
      } else {
        last = std::move(event);
      }
    }
    return !g_stop.load();
  };
  SendOutcome sent = send_fresh_if_stale(cli, std::move(req), &g_stop);
  if (sent.resent) sh.resent.fetch_add(1);
  const httplib::Result& res = sent.result;
  log.end_s = since(sh.t0);
  if (!res) return fmt::format("HTTP request failed: {}", httplib::to_string(res.error()));
  if (res->status != 200) return fmt::format("HTTP {}: {}", res->status, res->body.substr(0, 300));
  if (!error.empty()) return "stream error: " + error.substr(0, 300);
  if (!done || last.empty()) return std::string("the stream ended without [DONE]");
  json chunk = json::parse(last, nullptr, false);
  if (!chunk.is_discarded() && chunk.contains("usage")) {
    const json& u = chunk["usage"];
    log.prompt_tokens = u.value("prompt_tokens", 0u);
    if (u.contains("prompt_tokens_details")) log.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", 0u);
  }
  return std::nullopt;
}

// What tandem-toolburn --report says: its own wall time, and whether its
// /proc/self/cgroup names its session's tools/ folder in some hierarchy (the
// v2 line "0::/…/tools/<id>/<call>", or a v1 line).
struct BurnReport {
  double wall_s = -1;  // < 0: no report
  bool in_session_cgroup = false;
};
BurnReport read_report(const std::string& output, std::uint64_t session) {
  BurnReport r;
  json j = json::parse(output, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return r;
  if (j.contains("wall_s") && j["wall_s"].is_number()) r.wall_s = j["wall_s"].get<double>();
  const std::string want = fmt::format("/tools/{:016x}/", session);
  if (j.contains("cgroup") && j["cgroup"].is_array()) {
    for (const json& line : j["cgroup"]) {
      if (line.is_string() && line.get<std::string>().find(want) != std::string::npos) r.in_session_cgroup = true;
    }
  }
  return r;
}

void run_session(const sim::SessionSpec& spec, std::size_t index, SessionLog& log, Shared& sh) {
  // Counted on every way out: the main thread waits for all of them.
  struct Done {
    Shared& sh;
    ~Done() { sh.done.fetch_add(1); }
  } done{sh};
  const double c = sh.flags.compress;
  log.name = fmt::format("{}#{}", spec.name, index);
  log.arrival_s = spec.arrival_s / c;
  const auto arrive = sh.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(log.arrival_s));
  while (Clock::now() < arrive && !g_stop.load()) {
    std::this_thread::sleep_for(std::min<Clock::duration>(arrive - Clock::now(), std::chrono::milliseconds(100)));
  }
  if (g_stop.load()) {
    log.error = "the run stopped before the session arrived";
    return;
  }
  auto [rc, session] = sh.runner.open_session(log.name).get();
  if (rc != 0) {
    log.error = fmt::format("tandem_session_open: {}", std::strerror(-rc));
    return;
  }
  httplib::Client cli(sh.host);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(3600);
  cli.set_keep_alive(true);
  cli.set_tcp_nodelay(true);  // the request goes out in two writes: Nagle would hold the second for a delayed ACK
  const ClientRegistration registered(&cli);
  std::string prompt = log.name;
  for (std::size_t r = 0; r < spec.rounds.size() && log.error.empty(); ++r) {
    const sim::RoundSpec& round = spec.rounds[r];
    if (g_stop.load()) {
      log.error = "the run stopped";
      break;
    }
    // Each prompt extends the last one's text, so the engine serves the
    // session's previous context from its cache (the simulator's rule).
    prompt += " r";
    RoundLog rl;
    rl.submit_s = since(sh.t0);
    json body = {{"prompt", prompt},
                 {"prompt_tokens", round.input_tokens},
                 {"max_tokens", round.output_tokens},
                 {"session_id", log.name},
                 {"stream", true},
                 {"tool_follows", !round.tool.empty()}};
    // The tool the round's output calls, as a real engine would read it
    // from the generated tool call: step policies learn durations per kind.
    if (!round.tool.empty()) body["tool"] = round.tool;
    if (auto err = send_round(cli, body, sh, rl)) {
      log.error = fmt::format("round {}: {}", r, *err);
      break;
    }
    log.rounds.push_back(rl);
    if (round.tool.empty()) continue;

    ToolStep step = tool_step(round, sh.cpus, c, sh.flags.tool_mem_mb);
    // What one attempt of the step did, as the run records it.
    const auto tool_log = [&](const ToolOutcome& out, double call_s) {
      ToolLog t;
      t.kind = round.tool;
      t.nominal_s = step.wall_s;
      t.wall_s = static_cast<double>(out.result.wall_ns) * 1e-9;
      t.call_s = call_s;
      const BurnReport report = read_report(out.output, session);
      t.run_s = report.wall_s >= 0 ? report.wall_s : t.wall_s;
      t.cpu_s = static_cast<double>(out.result.cpu_ns) * 1e-9;
      t.peak_mb = static_cast<double>(out.result.peak_memory_bytes) / (1024.0 * 1024.0);
      t.exit_code = out.result.exit_code;
      t.reason = out.result.reason;
      t.memory_kill = t.reason == TANDEM_TOOL_OOM_KILLED || t.reason == TANDEM_TOOL_KILLED_MEMORY;
      t.placed = out.result.cgroup_id != 0;
      t.verified = t.placed && (report.in_session_cgroup ||
                                out.cgroup_at_spawn.find(fmt::format("/tools/{:016x}/", session)) != std::string::npos);
      return t;
    };
    // With --tool-mem, the call's memory as tandem-sim draws it (sim/node.cc:
    // keyed by the session and the round, re-drawn per attempt) and in its
    // shape: a quarter of the peak from the start, the burst's ramp to the
    // peak and its hold at the drawn points of the call's progress
    // (sim/host_memory.h; times compressed as the call's), held at the
    // simulator's default cap (sim::kToolMemCapMib). A tool killed for memory
    // runs again after the retry delay, as the simulator's agents do; every
    // kill is logged.
    const std::uint64_t key = sim::mix64(base::session_id(log.name) ^ sim::mix64(static_cast<std::uint64_t>(r) + 1));
    ToolOutcome out;
    ToolLog t;  // the last attempt's
    for (std::uint64_t attempt = 0;; ++attempt) {
      std::vector<std::string> shape;  // --mem-burst and --mem-base-mb, with --tool-mem
      if (sh.mem) {
        const sim::ToolMemDraw draw = sh.mem->draw(round.tool, sim::mix64(key + attempt), round.tool_seconds);
        const double peak =
            sim::capped_peak(draw.peak_bytes * spec.mem_scale * sh.flags.tool_mem_scale, sim::kToolMemCapMib);
        step.mem_mb = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(peak / (1024.0 * 1024.0))));
        const auto base_mb =
            static_cast<std::uint64_t>(std::llround(static_cast<double>(step.mem_mb) * sim::kResidualShare));
        shape = {"--mem-burst",
                 fmt::format("{:.6f},{:.6f},{:.6f}", draw.start_s / c, draw.ramp_s / c, draw.burst_s / c),
                 "--mem-base-mb", std::to_string(base_mb)};
      }
      std::vector<std::string> argv = {sh.toolburn,
                                       "--cpu-seconds",
                                       fmt::format("{:.6f}", step.cpu_s),
                                       "--wall-seconds",
                                       fmt::format("{:.6f}", step.wall_s),
                                       "--mem-mb",
                                       std::to_string(step.mem_mb),
                                       "--report"};
      argv.insert(argv.end(), shape.begin(), shape.end());
      const auto asked = Clock::now();
      out = sh.runner.spawn(session, round.tool, std::move(argv)).get();
      const double call_s = std::chrono::duration<double>(Clock::now() - asked).count();
      sh.tools.fetch_add(1);
      if (out.rc != 0) break;
      t = tool_log(out, call_s);
      if (!t.memory_kill || !sh.mem || attempt + 1 >= kMemoryRetries || g_stop.load()) break;
      t.retried = true;
      log.tools.push_back(t);
      std::this_thread::sleep_for(std::chrono::duration<double>(sh.flags.retry_delay_s / c));
    }
    if (out.rc != 0) {
      log.error = fmt::format("round {}: tool {}: {} ({})", r, round.tool, out.error, std::strerror(-out.rc));
      break;
    }
    log.tools.push_back(t);
    if (t.exit_code != 0) {
      log.error = fmt::format("round {}: tool {} ended with {} ({})", r, round.tool, t.exit_code, out.result.message);
    }
  }
  log.complete = log.error.empty();
  log.finish_s = since(sh.t0);
  sh.runner.close_session(session, log.complete);
}

// ---- run ---------------------------------------------------------------------------

std::optional<json> get_json(const std::string& host, const std::string& path) {
  httplib::Client cli(host);
  cli.set_connection_timeout(2);
  cli.set_read_timeout(5);
  auto res = cli.Get(path);
  if (!res || res->status != 200) return std::nullopt;
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

EngineTotals totals(const json& stats) {
  EngineTotals e;
  const json& t = stats.at("tokens");
  e.prompt_tokens = t.at("prompt").get<std::uint64_t>();
  e.reused_tokens = t.at("reused").get<std::uint64_t>();
  e.new_tokens = t.at("new").get<std::uint64_t>();
  e.recomputed_tokens = t.at("recomputed").get<std::uint64_t>();
  e.computed_tokens = t.at("computed").get<std::uint64_t>();
  e.preemptions = t.at("preemptions").get<std::uint64_t>();
  e.busy_s = stats.at("time").at("busy_s").get<double>();
  e.pinned_block_seconds = stats.at("time").at("pinned_block_seconds").get<double>();
  return e;
}

EngineTotals minus(const EngineTotals& a, const EngineTotals& b) {
  EngineTotals d;
  d.prompt_tokens = a.prompt_tokens - b.prompt_tokens;
  d.reused_tokens = a.reused_tokens - b.reused_tokens;
  d.new_tokens = a.new_tokens - b.new_tokens;
  d.recomputed_tokens = a.recomputed_tokens - b.recomputed_tokens;
  d.computed_tokens = a.computed_tokens - b.computed_tokens;
  d.preemptions = a.preemptions - b.preemptions;
  d.busy_s = a.busy_s - b.busy_s;
  d.pinned_block_seconds = a.pinned_block_seconds - b.pinned_block_seconds;
  return d;
}

std::string default_toolburn() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "tandem-toolburn";
  return (self.parent_path() / "tandem-toolburn").string();
}

int fail(const std::string& message) {
  fmt::print(stderr, "tandem-agents: {}\n", message);
  return 1;
}

int run(const ReplayFlags& flags) {
  // The workload: the simulator's code, so both see the same sessions.
  auto preset = flags.preset_file.empty() ? sim::find_preset(flags.preset) : sim::load_preset_file(flags.preset_file);
  if (!preset) return fail(flags.preset_file.empty() ? preset.error().message() : preset.error().context());
  std::vector<sim::SessionSpec> pool;
  std::string workload_name;
  if (!flags.trace.empty()) {
    auto loaded = sim::load_trace(flags.trace);
    if (!loaded) return fail(loaded.error().message());
    pool = std::move(*loaded);
    workload_name = flags.trace.substr(flags.trace.find_last_of('/') + 1);
  } else {
    auto gen = sim::synthetic_pool(flags.synthetic, flags.sessions ? flags.sessions : 20, flags.seed);
    if (!gen) return fail(gen.error().message());
    pool = std::move(*gen);
    workload_name = flags.synthetic;
  }
  scale_tokens(pool, flags.token_scale);
  sim::ArrivalSpec arrivals;
  arrivals.rate_sps = flags.rate;
  arrivals.poisson = flags.poisson;
  arrivals.sessions = flags.sessions ? flags.sessions : pool.size();
  arrivals.seed = flags.seed;
  arrivals.max_model_len = preset->max_model_len;
  auto workload = sim::make_workload(pool, workload_name, arrivals);
  if (!workload) return fail(workload.error().message());
  sim::ToolCpuTable cpus;
  if (!flags.tool_cpu.empty()) {
    if (auto r = cpus.apply(flags.tool_cpu); !r) return fail(r.error().message());
  }
  const std::string toolburn = flags.toolburn.empty() ? default_toolburn() : flags.toolburn;
  if (::access(toolburn.c_str(), X_OK) != 0) {
    return fail(fmt::format("the tool stand-in {} is not executable: {} (build tandem-toolburn or pass --toolburn)",
                            toolburn, std::strerror(errno)));
  }

  // The engine: its policy (what tandemd sent it), and a check that it runs
  // at this compression with this preset.
  std::string host = flags.url.substr(std::string_view("http://").size());
  if (auto slash = host.find('/'); slash != std::string::npos) host.resize(slash);
  auto before = get_json(host, "/stats");
  if (!before) return fail(fmt::format("no engine answers at {}/stats (start tandem-engine-emu first)", flags.url));
  if (!before->contains("tokens") || !before->contains("time") || !before->contains("engine")) {
    return fail(fmt::format(
        "{}/stats lacks the engine's token and time counters: is it tandem-engine-emu of this build?", flags.url));
  }
  // A real-time engine (tandem-llama) runs at its own speed with the pool
  // it has; the emulator at --speedup C with a named preset.
  const bool realtime = before->value("realtime", false);
  if (realtime) {
    if (flags.preset_file.empty()) {
      return fail("the engine runs in real time (tandem-llama): give --preset-file with its calibrated preset");
    }
    const auto& e = before->at("engine");
    if (e.value("blocks_total", 0u) != preset->gpu_blocks || e.value("block_size", 0u) != preset->block_size) {
      return fail(fmt::format("the engine's pool is {} blocks of {} tokens, the preset's {} of {}",
                              e.value("blocks_total", 0u), e.value("block_size", 0u), preset->gpu_blocks,
                              preset->block_size));
    }
  } else {
    if (!flags.preset_file.empty()) {
      return fail("--preset-file is for a real-time engine (tandem-llama); the emulator serves a named --preset");
    }
    const double speedup = before->value("speedup", 0.0);
    if (std::fabs(speedup - flags.compress) > 1e-9 * flags.compress) {
      return fail(fmt::format("the engine runs with --speedup {} but --compress is {}: they must match", speedup,
                              flags.compress));
    }
    if (before->value("model", "") != preset->name) {
      return fail(
          fmt::format("the engine serves preset '{}' but --preset is '{}'", before->value("model", ""), preset->name));
    }
  }
  const std::string policy = before->value("policy", "fcfs");

  const std::string runtime_dir = !flags.runtime_dir.empty()                     ? flags.runtime_dir
                                  : std::getenv("TANDEM_RUNTIME_DIR") != nullptr ? std::getenv("TANDEM_RUNTIME_DIR")
                                                                                 : "/run/tandem";
  Monitor monitor(runtime_dir);
  Runner runner(runtime_dir);
  if (runner.open_rc() != 0) return fail(fmt::format("tandem_runner_open: {}", std::strerror(-runner.open_rc())));

  const double span_s = workload->sessions.empty() ? 0 : workload->sessions.back().arrival_s / flags.compress;
  const double timeout = flags.timeout_s > 0 ? flags.timeout_s : 4 * span_s + 120;
  if (!flags.quiet) {
    fmt::print(stderr,
               "tandem-agents: {} sessions ({} rounds) of {} at {} sessions/s, compressed {}x: arrivals over {:.0f} s; "
               "policy {}; tandemd {}\n",
               workload->sessions.size(), workload->rounds, workload_name, flags.rate, flags.compress, span_s, policy,
               monitor.first() ? "reachable" : "not reachable (tools run without cgroups)");
  }

  std::optional<sim::ToolMemTable> mem;
  if (!flags.tool_mem.empty()) {
    mem.emplace();
    if (flags.tool_mem != "on") {
      if (auto r = mem->apply(flags.tool_mem); !r) return fail("--tool-mem: " + r.error().message());
    }
  }
  const std::optional<MemoryStall> stall_before = memory_stall();
  Shared sh{flags, host, runner, cpus, mem, toolburn, Clock::now(), {}, {}, {}};
  std::vector<SessionLog> logs(workload->sessions.size());
  std::vector<std::thread> threads;
  threads.reserve(logs.size());
  std::atomic<std::size_t> finished{0};
  for (std::size_t i = 0; i < logs.size(); ++i) {
    threads.emplace_back([&, i] {
      run_session(workload->sessions[i], i, logs[i], sh);
      finished.fetch_add(1);
    });
  }
  // Progress every 5 s; the timeout stops the rest.
  bool timed_out = false;
  for (auto next = Clock::now();;) {
    if (sh.done.load() == logs.size()) break;
    if (g_stop.load()) break;
    if (since(sh.t0) > timeout) {
      timed_out = true;
      g_stop.store(true);
      break;
    }
    if (!flags.quiet && Clock::now() >= next) {
      fmt::print(stderr, "tandem-agents: {:6.1f} s  sessions done {}/{}  tool calls {}\n", since(sh.t0), sh.done.load(),
                 logs.size(), sh.tools.load());
      next += std::chrono::seconds(5);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Stopped: cut the requests in flight until every session has seen it (a
  // session may start a request between its check and this).
  while (g_stop.load() && finished.load() < threads.size()) {
    stop_clients();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : threads) t.join();
  const double wall_s = since(sh.t0);
  const std::optional<MemoryStall> stall_after = memory_stall();
  monitor.stop();
  if (g_stop.load() && !timed_out) {
    const auto complete = std::count_if(logs.begin(), logs.end(), [](const SessionLog& l) { return l.complete; });
    fmt::print(stderr, "tandem-agents: interrupted after {:.1f} s ({} of {} sessions complete): no results written\n",
               wall_s, complete, logs.size());
    return 130;
  }
  auto after = get_json(host, "/stats");
  if (!after) return fail("the engine stopped answering before the run ended");

  // Metrics, in trace seconds, with the simulator's code. A real-time
  // engine's steps took real time: in trace time they cost C times more.
  sim::SimConfig config;
  config.preset = realtime ? trace_time_preset(*preset, flags.compress) : *preset;
  if (realtime) {
    if (const sched::PolicyEntry* entry = sched::find_policy(policy); entry != nullptr) {
      for (const auto& [name, v] : cost_params(*preset, flags.compress)) {
        for (const sched::ParamSpec& spec : entry->params) {
          if (spec.name == name) config.params[name] = std::clamp(v, spec.min, spec.max);
        }
      }
    }
  }
  config.limits.max_seqs = after->at("engine").value("max_seqs", preset->max_seqs);
  config.limits.token_budget = after->at("engine").value("token_budget", preset->token_budget);
  config.engines = 1;
  config.tool_cores = flags.tool_cores;
  config.policy = policy;
  for (const auto& [name, v] : flags.params) config.params[name] = v;
  config.tool_cpu = cpus;
  // The stand-in tool's own start (fork, exec, its runtime) costs CPU its
  // step does not ask for, and on a busy core it waits for it at a whole
  // core's demand: the prediction runs what this run measured as each call's
  // start phase, on top of its time (docs/replay.md "The prediction").
  const double start_cpu_s = tool_start_cpu_s(logs, cpus);
  config.tool_start_s = start_cpu_s * flags.compress;
  config.tool_start_extra = true;
  if (mem) {
    // Host memory as the live run has it: the tools' budget is tandemd's
    // ([memory] tools_budget, given here as --host-mem-gib); the agents'
    // own processes sit outside it, so sessions hold no baseline.
    config.tool_mem = true;
    config.tool_mem_table = *mem;
    config.tool_mem_scale = flags.tool_mem_scale;
    // Live, the tools may pass tandemd's budget up to what the machine has;
    // only the rules hold them back. --host-mem-gib overrides the machine.
    config.host_mem_gib = flags.host_mem_gib > 0 ? flags.host_mem_gib : node_memory_gib();
    config.tools_budget_mib = static_cast<double>(flags.tools_budget_mib);
    config.session_mem_mib = 0;
    config.retry_delay_s = flags.retry_delay_s;
    // tandemd runs its memory rules whatever the policy, on the memory
    // controller the host has; its stall kill's delay is wall time, C
    // times longer in the prediction's trace time.
    config.host_rules = "all";
    config.host_rule_config.stall_kill_after =
        base::from_seconds(base::to_seconds(config.host_rule_config.stall_kill_after) * flags.compress);
    // Its other two clocks are wall time as well: it samples the tools and
    // runs the rules every 250 ms (sched::kHostMemoryPeriod), and the
    // kernel's PSI avg10 averages over 10 s; in trace time both are C times
    // longer. The prediction leaves them at every control tick and 10 s:
    // stretched, they made fcfs's predicted E2E 1.5-2.4x shorter than live,
    // against 0.9-1.2x unstretched (docs/results.md "Live, memory-bound").
    const json status = monitor.first().value_or(json());
    const json* plane = status.is_object() && status.contains("host") ? &status["host"] : nullptr;
    config.memory_v1 = plane != nullptr && plane->is_object() && plane->contains("cgroups") &&
                       (*plane)["cgroups"].is_string() && memory_on_v1((*plane)["cgroups"].get<std::string>());
  }
  const std::vector<double> ideal = sim::ideal_times(*workload, config);
  EngineTotals engine = minus(totals(*after), totals(*before));
  if (realtime) engine.busy_s *= flags.compress;
  const Assembled a = assemble(logs, ideal, engine, flags.compress, flags.tool_cores, workload->capped_rounds);

  RunSummary summary;
  summary.preset = std::string(preset->name);
  summary.workload = workload_name;
  summary.policy = policy;  // with its --param settings, the run's label in compare
  for (const auto& [name, v] : flags.params) summary.policy += fmt::format(" {}={}", name, v);
  summary.rate = flags.rate;
  summary.compress = flags.compress;
  summary.sessions = logs.size();
  summary.wall_s = wall_s;
  summary.tool_start_ms = start_cpu_s * 1000;
  if (stall_before && stall_after && wall_s > 0) {
    summary.mem_psi_some_pct =
        100.0 * static_cast<double>(stall_after->some_us - stall_before->some_us) * 1e-6 / wall_s;
    summary.mem_psi_full_pct =
        100.0 * static_cast<double>(stall_after->full_us - stall_before->full_us) * 1e-6 / wall_s;
  }
  summary.measured = sim::compute_metrics(a.records, a.counters);
  for (const sim::SessionRecord& r : a.records) summary.e2e_s.push_back(r.finish_s - r.arrival_s);
  summary.ttft_s = a.ttft_s;
  std::vector<std::pair<double, double>> calls;
  for (const SessionLog& s : logs) {
    for (const ToolLog& t : s.tools) calls.emplace_back(t.nominal_s, t.run_s);
  }
  summary.long_stretch = mean_stretch(calls, kLongToolWallS);
  summary.logs = &logs;
  summary.engine_stats = *after;
  summary.daemon_first = monitor.first().value_or(json());
  summary.daemon_last = monitor.last();
  summary.peak_tools_memory = monitor.peak_tools_memory();
  summary.timed_out = timed_out;
  summary.interrupted = g_stop.load() && !timed_out;

  // The simulator's prediction: the same workload, node and policy.
  auto predicted = sim::simulate(*workload, config, ideal);
  if (predicted) {
    summary.predicted = sim::compute_metrics(predicted->sessions, predicted->counters);
    for (const sim::SessionRecord& r : predicted->sessions) summary.predicted_e2e_s.push_back(r.finish_s - r.arrival_s);
    std::vector<std::pair<double, double>> sim_calls;
    for (const sim::ToolCallRecord& t : predicted->tool_calls) sim_calls.emplace_back(t.nominal_s, t.wall_s);
    summary.predicted_long_stretch = mean_stretch(sim_calls, kLongToolWallS * flags.compress);
    for (const sim::SessionRecord& r : predicted->sessions) {
      summary.predicted_ttft_s.insert(summary.predicted_ttft_s.end(), r.ttft_s.begin(), r.ttft_s.end());
    }
  } else {
    summary.prediction_error = predicted.error().message();
  }

  print_run(stdout, summary);
  if (const std::size_t resent = sh.resent.load(); resent > 0 && !flags.quiet) {
    fmt::print(stderr, "tandem-agents: requests sent again because the engine had closed their idle connection: {}\n",
               resent);
  }
  if (!flags.out.empty()) {
    if (auto w = write_run(summary, flags.out); !w) return fail(w.error().message());
    if (!flags.quiet) fmt::print(stderr, "tandem-agents: run written to {}\n", flags.out);
  }
  const std::size_t completed = a.records.size();
  if (timed_out) {
    return fail(fmt::format("timed out after {:.0f} s: {} of {} sessions completed", timeout, completed, logs.size()));
  }
  if (completed != logs.size()) {
    for (const SessionLog& s : logs) {
      if (!s.complete) {
        return fail(fmt::format("{} of {} sessions did not complete; the first: {}: {}", logs.size() - completed,
                                logs.size(), s.name, s.error));
      }
    }
  }
  return 0;
}

void on_signal(int) { g_stop.store(true); }

int agents_main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  auto flags = parse_replay_flags(args);
  if (!flags) {
    fmt::print(stderr, "tandem-agents: {}\n", flags.error());
    return 2;
  }
  switch (flags->mode) {
    case ReplayFlags::Mode::kHelp:
      fmt::print("{}", replay_usage());
      return 0;
    case ReplayFlags::Mode::kDaemonConfig: {
      std::optional<sim::Preset> realtime;
      if (!flags->preset_file.empty()) {
        auto p = sim::load_preset_file(flags->preset_file);
        if (!p) {
          fmt::print(stderr, "tandem-agents: {}\n", p.error().context());
          return 2;
        }
        realtime = *p;
      }
      auto c = daemon_config(flags->policy, flags->compress, flags->subtree, flags->tool_cpus,
                             realtime ? &*realtime : nullptr, flags->params, flags->tools_budget_mib);
      if (!c) {
        fmt::print(stderr, "tandem-agents: {}\n", c.error());
        return 2;
      }
      fmt::print("{}", c->toml);
      for (const std::string& w : c->clamped) fmt::print(stderr, "tandem-agents: {}\n", w);
      return 0;
    }
    case ReplayFlags::Mode::kCompare: {
      auto r = compare_runs(stdout, flags->inputs, flags->json, flags->sim_json, flags->plot);
      if (!r) {
        fmt::print(stderr, "tandem-agents: {}\n", r.error().message());
        return 1;
      }
      return 0;
    }
    case ReplayFlags::Mode::kRun:
      break;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return run(*flags);
}

}  // namespace
}  // namespace tandem::testbed

int main(int argc, char** argv) {
  // Only allocation and a malformed answer from the engine's /stats can
  // throw here (std::bad_alloc, nlohmann's type errors): say so.
  try {
    return tandem::testbed::agents_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-agents: %s\n", e.what());
    return 1;
  }
}
