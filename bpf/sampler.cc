// The sampling telemetry and the procfs/cgroupfs parsers (sampler.h).
#include "bpf/sampler.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "base/parse.h"
#include "base/unique_fd.h"

namespace tandem::bpf {

base::Result<std::vector<std::int32_t>> parse_pid_list(std::string_view text) {
  std::vector<std::int32_t> out;
  for (std::string_view line : base::split(text, '\n', /*skip_empty=*/true)) {
    auto pid = base::parse_int<std::int32_t>(base::trim(line));
    if (!pid || *pid <= 0) return base::make_error(EINVAL, fmt::format("pid list: bad line '{}'", line));
    out.push_back(*pid);
  }
  return out;
}

base::Result<SchedStat> parse_schedstat(std::string_view text) {
  const auto fields = base::split(base::trim(text), ' ', /*skip_empty=*/true);
  if (fields.size() < 3) return base::make_error(EINVAL, fmt::format("schedstat: '{}' has fewer than 3 fields", text));
  auto run = base::parse_int<std::uint64_t>(fields[0]);
  auto wait = base::parse_int<std::uint64_t>(fields[1]);
  auto slices = base::parse_int<std::uint64_t>(fields[2]);
  if (!run || !wait || !slices) return base::make_error(EINVAL, fmt::format("schedstat: not numbers: '{}'", text));
  return SchedStat{*run, *wait, *slices};
}

base::Result<ProcStat> parse_proc_stat(std::string_view text) {
  const auto open = text.find('(');
  const auto close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return base::make_error(EINVAL, "stat: no '(comm)'");
  }
  // After "comm) ": state, then ppid.
  const auto rest = base::split(text.substr(close + 1), ' ', /*skip_empty=*/true);
  if (rest.size() < 2) return base::make_error(EINVAL, "stat: too few fields after comm");
  auto ppid = base::parse_int<std::int32_t>(rest[1]);
  if (!ppid) return base::propagate(std::move(ppid.error()), "stat: ppid");
  return ProcStat{std::string(text.substr(open + 1, close - open - 1)), *ppid};
}

base::Result<std::uint64_t> parse_cpu_stat_usage_ns(std::string_view text) {
  auto pairs = base::parse_key_values(text);
  if (!pairs) return base::propagate(std::move(pairs.error()), "cpu.stat");
  for (const auto& [key, value] : *pairs) {
    if (key != "usage_usec") continue;
    auto us = base::parse_int<std::uint64_t>(value);
    if (!us) return base::propagate(std::move(us.error()), "cpu.stat: usage_usec");
    return *us * 1000;
  }
  return base::make_error(ENOENT, "cpu.stat: no usage_usec");
}

base::Result<void> read_file_at(int dirfd, const char* path, std::string& out) {
  base::UniqueFd fd(::openat(dirfd, path, O_RDONLY | O_CLOEXEC));
  if (!fd) return base::errno_error(fmt::format("open {}", path));
  out.clear();
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return base::errno_error(fmt::format("read {}", path));
    }
    if (n == 0) return {};
    out.append(buf, static_cast<std::size_t>(n));
  }
}

namespace {

// Sampled events wait here until drained; beyond this many the oldest
// undrained are dropped (and counted), so a daemon that stops draining does
// not grow without bound.
constexpr std::size_t kMaxPendingEvents = 1 << 16;

struct ThreadTimes {
  SchedStat last;
};

struct Process {
  std::int32_t ppid = 0;
  char comm[16] = {};
  std::unordered_map<std::int32_t, ThreadTimes> threads;
};

enum class UsageSource : std::uint8_t { kCpuStat, kCpuacct, kSchedstat };

struct Cgroup {
  std::uint64_t group = 0;
  base::UniqueFd dir;
  UsageSource usage = UsageSource::kSchedstat;
  std::uint64_t usage_last_ns = 0;
  std::unordered_map<std::int32_t, Process> procs;
};

// Thread-safety: one thread (Telemetry's contract).
class Sampler final : public Telemetry {
 public:
  Sampler(base::UniqueFd proc, const Options& options, std::string description)
      : proc_(std::move(proc)), clock_(options.clock), description_(std::move(description)) {}

  Mode mode() const override { return Mode::kSampling; }
  std::string_view describe() const override { return description_; }
  int event_fd() const override { return -1; }
  std::uint64_t lost_events() override { return lost_; }

  base::Result<void> track(std::uint64_t cgroup_id, std::uint64_t group, int dirfd) override {
    if (auto it = cgroups_.find(cgroup_id); it != cgroups_.end()) {
      if (it->second.group == group) return {};
      return base::make_error(
          EEXIST, fmt::format("track cgroup {}: already tracked into group {}", cgroup_id, it->second.group));
    }
    Cgroup cg;
    cg.group = group;
    cg.dir = base::UniqueFd(::fcntl(dirfd, F_DUPFD_CLOEXEC, 0));
    if (!cg.dir) return base::errno_error(fmt::format("track cgroup {}: dup", cgroup_id));
    if (auto usage = read_usage(cg.dir.get(), UsageSource::kCpuStat)) {
      cg.usage = UsageSource::kCpuStat;
      cg.usage_last_ns = *usage;
    } else if (auto acct = read_usage(cg.dir.get(), UsageSource::kCpuacct)) {
      cg.usage = UsageSource::kCpuacct;
      cg.usage_last_ns = *acct;
    }
    // The processes already inside: live, with their times so far as the
    // baseline (tracking counts from now), no events.
    auto pids = read_pids(cg.dir.get());
    if (!pids) return base::propagate(std::move(pids.error()), fmt::format("track cgroup {}", cgroup_id));
    for (std::int32_t pid : *pids) {
      Process p;
      if (!read_process(pid, p)) continue;  // gone already
      refresh_threads(pid, p, /*gs=*/nullptr, /*charge_run=*/false);
      cg.procs.emplace(pid, std::move(p));
    }
    stats_.try_emplace(group);
    cgroups_.emplace(cgroup_id, std::move(cg));
    recount_live();
    return {};
  }

  void untrack(std::uint64_t cgroup_id) override {
    cgroups_.erase(cgroup_id);
    recount_live();
  }

  void forget_group(std::uint64_t group) override {
    std::erase_if(cgroups_, [group](const auto& kv) { return kv.second.group == group; });
    stats_.erase(group);
  }

  std::size_t drain_events(const std::function<void(const ProcEvent&)>& sink) override {
    std::deque<ProcEvent> batch;
    batch.swap(pending_);
    for (const ProcEvent& e : batch) sink(e);
    return batch.size();
  }

  const std::unordered_map<std::uint64_t, GroupStats>& sample() override {
    const std::uint64_t now = now_ns();
    std::unordered_set<std::int32_t> seen;
    for (auto& [cgid, cg] : cgroups_) {
      GroupStats& gs = stats_[cg.group];
      if (cg.usage != UsageSource::kSchedstat) {
        if (auto usage = read_usage(cg.dir.get(), cg.usage); usage && *usage > cg.usage_last_ns) {
          gs.on_cpu_ns += *usage - cg.usage_last_ns;
          cg.usage_last_ns = *usage;
        }
      }
      // A cgroup that can no longer be read (removed) has no processes.
      auto pids = read_pids(cg.dir.get());
      seen.clear();
      if (pids) seen.insert(pids->begin(), pids->end());
      for (auto it = cg.procs.begin(); it != cg.procs.end();) {
        if (seen.contains(it->first)) {
          ++it;
          continue;
        }
        push_event(ProcEvent::Kind::kExit, it->first, it->second, cgid, cg.group, now);
        ++gs.exits;
        it = cg.procs.erase(it);
      }
      for (std::int32_t pid : seen) {
        auto it = cg.procs.find(pid);
        if (it == cg.procs.end()) {
          Process p;
          if (!read_process(pid, p)) continue;  // exited since cgroup.procs was read
          it = cg.procs.emplace(pid, std::move(p)).first;
          push_event(ProcEvent::Kind::kFork, pid, it->second, cgid, cg.group, now);
          ++gs.forks;
        }
        const bool charge_run = cg.usage == UsageSource::kSchedstat;
        if (refresh_threads(pid, it->second, &gs, charge_run)) {
          // Its counters went backwards: another process with the same pid,
          // whose times refresh_threads already counted from zero.
          push_event(ProcEvent::Kind::kExit, pid, it->second, cgid, cg.group, now);
          ++gs.exits;
          Process fresh;
          if (read_process(pid, fresh)) {
            fresh.threads = std::move(it->second.threads);
            push_event(ProcEvent::Kind::kFork, pid, fresh, cgid, cg.group, now);
            ++gs.forks;
            it->second = std::move(fresh);
          } else {
            cg.procs.erase(it);
          }
        }
      }
    }
    recount_live();
    return stats_;
  }

 private:
  std::uint64_t now_ns() const {
    if (clock_ != nullptr) return static_cast<std::uint64_t>(base::to_ns(clock_->now()));
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
  }

  base::Result<std::uint64_t> read_usage(int dir, UsageSource source) {
    if (source == UsageSource::kCpuStat) {
      auto r = read_file_at(dir, "cpu.stat", buf_);
      if (!r) return base::propagate(std::move(r.error()));
      return parse_cpu_stat_usage_ns(buf_);
    }
    auto r = read_file_at(dir, "cpuacct.usage", buf_);
    if (!r) return base::propagate(std::move(r.error()));
    return base::parse_int<std::uint64_t>(base::trim(buf_));
  }

  base::Result<std::vector<std::int32_t>> read_pids(int dir) {
    auto r = read_file_at(dir, "cgroup.procs", buf_);
    if (!r) return base::propagate(std::move(r.error()));
    return parse_pid_list(buf_);
  }

  // ppid and comm of `pid`; false if it is gone.
  bool read_process(std::int32_t pid, Process& out) {
    if (!read_file_at(proc_.get(), fmt::format("{}/stat", pid).c_str(), buf_)) return false;
    auto st = parse_proc_stat(buf_);
    if (!st) return false;
    out.ppid = st->ppid;
    const std::size_t n = std::min(st->comm.size(), sizeof out.comm - 1);
    std::memcpy(out.comm, st->comm.data(), n);
    out.comm[n] = '\0';
    return true;
  }

  // Reads every thread's schedstat of `pid` and adds what grew since the last
  // read to `gs` (its on-CPU time too with `charge_run`: the cgroup has no
  // usage file); with `gs` null, only records. Returns true if a known
  // thread's counters went backwards (the pid was reused).
  bool refresh_threads(std::int32_t pid, Process& p, GroupStats* gs, bool charge_run) {
    base::UniqueFd task_fd(
        ::openat(proc_.get(), fmt::format("{}/task", pid).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!task_fd) return false;
    DIR* dir = ::fdopendir(task_fd.get());
    if (dir == nullptr) return false;
    // fdopendir took the fd; closedir closes it.
    [[maybe_unused]] const int owned_by_dir = task_fd.release();
    std::unordered_set<std::int32_t> alive;
    bool went_back = false;
    while (const dirent* de = ::readdir(dir)) {
      auto tid = base::parse_int<std::int32_t>(de->d_name);
      if (!tid) continue;  // "." and ".."
      if (!read_file_at(::dirfd(dir), fmt::format("{}/schedstat", *tid).c_str(), buf_)) continue;
      auto now = parse_schedstat(buf_);
      if (!now) continue;
      alive.insert(*tid);
      auto [it, is_new] = p.threads.try_emplace(*tid);
      SchedStat before = is_new ? SchedStat{} : it->second.last;
      if (!is_new && (now->run_ns < before.run_ns || now->timeslices < before.timeslices)) {
        went_back = true;
        before = SchedStat{};
      }
      it->second.last = *now;
      if (gs == nullptr) continue;
      const std::uint64_t waits = now->timeslices - before.timeslices;
      const std::uint64_t waited = now->wait_ns >= before.wait_ns ? now->wait_ns - before.wait_ns : 0;
      if (charge_run) gs->on_cpu_ns += now->run_ns - before.run_ns;
      gs->runq_delay_ns += waited;
      gs->runq_waits += waits;
      if (waits > 0) gs->runq_hist[runq_bucket(waited / waits)] += waits;
    }
    ::closedir(dir);
    std::erase_if(p.threads, [&alive](const auto& kv) { return !alive.contains(kv.first); });
    return went_back;
  }

  void push_event(ProcEvent::Kind kind, std::int32_t pid, const Process& p, std::uint64_t cgid, std::uint64_t group,
                  std::uint64_t now) {
    if (pending_.size() >= kMaxPendingEvents) {
      pending_.pop_front();
      ++lost_;
    }
    ProcEvent e{};
    e.kind = kind;
    e.pid = pid;
    e.ppid = p.ppid;
    e.exit_code = -1;
    e.cgroup_id = cgid;
    e.group = group;
    e.timestamp_ns = now;
    std::memcpy(e.comm, p.comm, sizeof e.comm);
    pending_.push_back(e);
  }

  void recount_live() {
    for (auto& [group, gs] : stats_) gs.live_processes = 0;
    for (const auto& [cgid, cg] : cgroups_) {
      if (auto it = stats_.find(cg.group); it != stats_.end()) it->second.live_processes += cg.procs.size();
    }
  }

  base::UniqueFd proc_;
  const base::Clock* clock_;
  std::string description_;
  std::unordered_map<std::uint64_t, Cgroup> cgroups_;
  std::unordered_map<std::uint64_t, GroupStats> stats_;
  std::deque<ProcEvent> pending_;
  std::uint64_t lost_ = 0;
  std::string buf_;  // reused by every file read
};

}  // namespace

base::Result<std::unique_ptr<Telemetry>> make_sampler(const Options& options, std::string_view why) {
  base::UniqueFd proc(::open(options.proc_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!proc) return base::errno_error(fmt::format("sampler: open {}", options.proc_root));
  return std::make_unique<Sampler>(std::move(proc), options, fmt::format("sampling (cgroupfs+/proc): {}", why));
}

base::Result<std::unique_ptr<Telemetry>> open_sampler() { return make_sampler(Options{}, "forced"); }

base::Result<std::unique_ptr<Telemetry>> open_sampler(const Options& options, std::string_view why) {
  return make_sampler(options, why);
}

}  // namespace tandem::bpf
