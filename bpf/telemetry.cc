// open_telemetry(): feature probing, and the eBPF telemetry (telemetry.h,
// telemetry.bpf.c for the kernel side, docs/telemetry.md).
//
// User space owns the maps' key sets: track() creates the group's `counters`
// entry and the cgroup's `live` entry before it inserts the cgroup into
// `tracked`, seeds the processes already in the cgroup into `procs`, and
// untrack() undoes all three. The kernel side only looks those entries up, so
// a late event never resurrects a deleted one. sample() sums the per-CPU
// values; drain_events() consumes the ring buffer.
#include "bpf/telemetry.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/parse.h"
#include "base/unique_fd.h"
#include "bpf/sampler.h"

#if TANDEM_HAVE_BPF
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "bpf/telemetry_abi.h"
#include "telemetry.skel.h"
#endif

namespace tandem::bpf {

std::size_t runq_bucket(std::uint64_t delay_ns) {
  const std::uint64_t us = delay_ns / 1000;
  if (us == 0) return 0;
  return std::min<std::size_t>(std::bit_width(us), kRunqBuckets - 1);
}

base::Result<std::uint64_t> cgroup_id_of(int dirfd) {
  struct statfs fs {};
  if (::fstatfs(dirfd, &fs) != 0) return base::errno_error("cgroup id: fstatfs");
  if (fs.f_type != CGROUP2_SUPER_MAGIC && fs.f_type != CGROUP_SUPER_MAGIC) {
    return base::make_error(EOPNOTSUPP, "cgroup id: not a cgroup directory");
  }
  // A kernfs file handle is the node's 64-bit id.
  alignas(file_handle) unsigned char storage[sizeof(file_handle) + 64] = {};
  auto* fh = reinterpret_cast<file_handle*>(storage);
  fh->handle_bytes = 64;
  int mount_id = 0;
  if (::name_to_handle_at(dirfd, "", fh, &mount_id, AT_EMPTY_PATH) != 0) {
    return base::errno_error("cgroup id: name_to_handle_at");
  }
  if (fh->handle_bytes != sizeof(std::uint64_t)) {
    return base::make_error(EOPNOTSUPP,
                            fmt::format("cgroup id: a {}-byte handle is not a kernfs id", fh->handle_bytes));
  }
  std::uint64_t id = 0;
  std::memcpy(&id, fh->f_handle, sizeof id);
  return id;
}

#if TANDEM_HAVE_BPF
namespace {

// Whether /proc/self/mountinfo lists a cgroup2 mount ("… - cgroup2 …").
bool has_cgroup2_mount(std::string_view mountinfo) {
  for (std::string_view line : base::split(mountinfo, '\n', /*skip_empty=*/true)) {
    const auto dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const auto fields = base::split(line.substr(dash + 3), ' ', /*skip_empty=*/true);
    if (!fields.empty() && fields[0] == "cgroup2") return true;
  }
  return false;
}

static_assert(sizeof(TandemBpfEvent) == 56);
static_assert(sizeof(TandemBpfCounters) == 248);
static_assert(sizeof(TandemBpfLive) == 8);
static_assert(sizeof(TandemBpfProc) == 8);
static_assert(sizeof(TandemBpfHealth) == 32);
static_assert(TANDEM_RUNQ_BUCKETS == kRunqBuckets);
static_assert(sizeof(ProcEvent::comm) == sizeof(TandemBpfEvent::comm));
static_assert(static_cast<int>(ProcEvent::Kind::kFork) == kTandemEventFork &&
              static_cast<int>(ProcEvent::Kind::kExec) == kTandemEventExec &&
              static_cast<int>(ProcEvent::Kind::kExit) == kTandemEventExit);

// libbpf logs through one process-wide callback. Warnings and info go to the
// last Options::log given and into a short tail that explains a failed load.
// Thread-safety: opened on one thread (Telemetry's contract).
struct LibbpfLog {
  std::function<void(std::string_view)> sink;  // Options::log of `owner`
  const void* owner = nullptr;                 // the open telemetry whose sink it is
  std::deque<std::string> tail;                // the last few lines
};
LibbpfLog& libbpf_log() {
  static LibbpfLog log;
  return log;
}

int on_libbpf_print(libbpf_print_level level, const char* format, va_list args) {
  if (level == LIBBPF_DEBUG) return 0;
  char line[1024];
  const int n = std::vsnprintf(line, sizeof line, format, args);
  if (n <= 0) return 0;
  std::string_view text(line, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof line - 1));
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  LibbpfLog& log = libbpf_log();
  log.tail.emplace_back(text);
  if (log.tail.size() > 4) log.tail.pop_front();
  if (log.sink) log.sink(text);
  return n;
}

std::string log_tail() {
  std::string out;
  for (const std::string& line : libbpf_log().tail) {
    if (!out.empty()) out += " | ";
    out += line;
  }
  return out;
}

base::Error libbpf_error(int err, std::string_view what) {
  // libbpf returns -errno (and sets errno) on failure.
  const int code = err < 0 ? -err : (errno > 0 ? errno : EIO);
  std::string tail = log_tail();
  return base::Error(code, tail.empty() ? std::string(what) : fmt::format("{} (libbpf: {})", what, tail));
}

struct SkeletonDeleter {
  void operator()(telemetry* skel) const { telemetry__destroy(skel); }
};
struct RingBufferDeleter {
  void operator()(ring_buffer* rb) const { ring_buffer__free(rb); }
};

// Power of two, at least one page: what a BPF ring buffer must be.
std::size_t ringbuf_size(std::size_t want) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return std::bit_ceil(std::max(want, page));
}

// Thread-safety: one thread (Telemetry's contract).
class EbpfTelemetry final : public Telemetry {
 public:
  static base::Result<std::unique_ptr<EbpfTelemetry>> create(const Options& options) {
    // Probes, cheapest first; each failure says what is missing.
    std::string mountinfo;
    base::UniqueFd proc(::open(options.proc_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!proc) return base::errno_error(fmt::format("open {}", options.proc_root));
    if (auto r = read_file_at(proc.get(), "self/mountinfo", mountinfo); !r) {
      return base::propagate(std::move(r.error()));
    }
    if (!has_cgroup2_mount(mountinfo)) return base::make_error(ENOENT, "no cgroup v2 hierarchy mounted");
    if (::access(options.btf_path.c_str(), R_OK) != 0) {
      return base::errno_error(fmt::format("no kernel BTF at {}", options.btf_path));
    }
    LibbpfLog& log = libbpf_log();
    log.sink = options.log;
    log.owner = nullptr;
    log.tail.clear();
    libbpf_set_print(on_libbpf_print);
    // The sink may capture what dies with the caller: keep it only as long
    // as the telemetry it was given with.
    struct DropSink {
      LibbpfLog& log;
      ~DropSink() {
        if (log.owner == nullptr) log.sink = nullptr;
      }
    } drop_sink{log};
    for (auto [type, name] :
         {std::pair{BPF_MAP_TYPE_RINGBUF, "ring buffer"}, std::pair{BPF_MAP_TYPE_TASK_STORAGE, "task storage"}}) {
      const int ok = libbpf_probe_bpf_map_type(type, nullptr);
      if (ok < 0) {
        return base::make_error(-ok, ok == -EPERM ? "bpf() not permitted (needs CAP_BPF and CAP_PERFMON, or root)"
                                                  : fmt::format("bpf() fails creating a {} map", name));
      }
      if (ok == 0) return base::make_error(EOPNOTSUPP, fmt::format("kernel lacks {} maps", name));
    }

    // (LIBBPF_OPTS is a GNU statement expression, not C++.)
    bpf_object_open_opts open_opts{};
    open_opts.sz = sizeof open_opts;
    open_opts.btf_custom_path = options.btf_path.c_str();  // CO-RE relocates against the probed BTF
    std::unique_ptr<telemetry, SkeletonDeleter> skel(telemetry__open_opts(&open_opts));
    if (!skel) return base::propagate(libbpf_error(0, "open BPF skeleton"));
    struct Size {
      bpf_map* map;
      std::size_t entries;
    };
    for (const Size& s : {Size{skel->maps.tracked, options.max_cgroups}, Size{skel->maps.live, options.max_cgroups},
                          Size{skel->maps.counters, options.max_groups}, Size{skel->maps.procs, options.max_processes},
                          Size{skel->maps.lineage, options.max_processes},
                          Size{skel->maps.events, ringbuf_size(options.ringbuf_bytes)}}) {
      if (s.entries == 0 || s.entries > UINT32_MAX) {
        return base::make_error(EINVAL, fmt::format("map {}: size {} out of range", bpf_map__name(s.map), s.entries));
      }
      if (int err = bpf_map__set_max_entries(s.map, static_cast<std::uint32_t>(s.entries)); err != 0) {
        return base::propagate(libbpf_error(err, fmt::format("size map {}", bpf_map__name(s.map))));
      }
    }
    skel->rodata->wakeup_interval_ns =
        static_cast<std::uint64_t>(std::max<std::int64_t>(0, options.wakeup_interval.count()));
    skel->rodata->wakeup_bytes = ringbuf_size(options.ringbuf_bytes) / 4;
    if (int err = telemetry__load(skel.get()); err != 0) {
      return base::propagate(libbpf_error(err, "load BPF programs"));
    }
    if (int err = telemetry__attach(skel.get()); err != 0) {
      return base::propagate(libbpf_error(err, "attach tp_btf programs"));
    }
    auto self = std::unique_ptr<EbpfTelemetry>(new EbpfTelemetry(std::move(skel)));
    if (options.measure_run_time) {
      // Statistics stay enabled while this fd is open.
      const int fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
      if (fd < 0) return base::propagate(libbpf_error(fd, "enable BPF run-time statistics"));
      self->stats_fd_ = base::UniqueFd(fd);
    }
    self->ring_.reset(ring_buffer__new(bpf_map__fd(self->skel_->maps.events), on_record, self.get(), nullptr));
    if (!self->ring_) return base::propagate(libbpf_error(0, "ring buffer"));
    const int cpus = libbpf_num_possible_cpus();
    if (cpus <= 0) return base::propagate(libbpf_error(cpus, "count possible CPUs"));
    self->cpus_ = static_cast<std::size_t>(cpus);
    log.owner = self.get();
    return self;
  }

  ~EbpfTelemetry() override {
    LibbpfLog& log = libbpf_log();
    if (log.owner == this) {
      log.sink = nullptr;
      log.owner = nullptr;
    }
  }
  EbpfTelemetry(const EbpfTelemetry&) = delete;
  EbpfTelemetry& operator=(const EbpfTelemetry&) = delete;

  Mode mode() const override { return Mode::kEbpf; }
  std::string_view describe() const override { return "ebpf (tp_btf, ringbuf, task storage)"; }
  int event_fd() const override { return ring_buffer__epoll_fd(ring_.get()); }

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
    const bool new_group = !stats_.contains(group);
    if (new_group) {
      std::vector<TandemBpfCounters> zero(cpus_);
      if (bpf_map_update_elem(fd(skel_->maps.counters), &group, zero.data(), BPF_NOEXIST) != 0 && errno != EEXIST) {
        return map_error(fmt::format("track cgroup {}: counters of group {}", cgroup_id, group));
      }
    }
    auto undo_group = [&] {
      if (new_group) bpf_map_delete_elem(fd(skel_->maps.counters), &group);
    };
    std::vector<TandemBpfLive> zero_live(cpus_);
    if (bpf_map_update_elem(fd(skel_->maps.live), &cgroup_id, zero_live.data(), BPF_ANY) != 0) {
      auto err = map_error(fmt::format("track cgroup {}: live count", cgroup_id));
      undo_group();
      return err;
    }
    if (bpf_map_update_elem(fd(skel_->maps.tracked), &cgroup_id, &group, BPF_ANY) != 0) {
      auto err = map_error(fmt::format("track cgroup {}", cgroup_id));
      bpf_map_delete_elem(fd(skel_->maps.live), &cgroup_id);
      undo_group();
      return err;
    }
    // From here the kernel counts what enters and leaves. Seed what is
    // already inside; a process the kernel has counted meanwhile (it forked
    // in or exec'd) already has its `procs` entry, so NOEXIST skips it.
    auto pids = read_pids(cg.dir.get());
    if (!pids) {
      bpf_map_delete_elem(fd(skel_->maps.tracked), &cgroup_id);
      bpf_map_delete_elem(fd(skel_->maps.live), &cgroup_id);
      undo_group();
      return base::propagate(std::move(pids.error()), fmt::format("track cgroup {}", cgroup_id));
    }
    const TandemBpfProc entry{cgroup_id};
    std::vector<std::int32_t> seeded;
    for (std::int32_t pid : *pids) {
      const auto tgid = static_cast<std::uint32_t>(pid);
      if (bpf_map_update_elem(fd(skel_->maps.procs), &tgid, &entry, BPF_NOEXIST) == 0) seeded.push_back(pid);
    }
    // One that exited between the read and its insert left a stale entry the
    // kernel will never remove: it is missing from a second read.
    if (auto again = read_pids(cg.dir.get()); again && !seeded.empty()) {
      std::sort(again->begin(), again->end());
      std::erase_if(seeded, [&](std::int32_t pid) {
        if (std::binary_search(again->begin(), again->end(), pid)) return false;
        const auto tgid = static_cast<std::uint32_t>(pid);
        TandemBpfProc now{};
        // Delete only our own entry; if the kernel already deleted it at the
        // exit, it also decremented the live count and the seed must stay.
        return bpf_map_lookup_elem(fd(skel_->maps.procs), &tgid, &now) == 0 && now.cgroup_id == cgroup_id &&
               bpf_map_delete_elem(fd(skel_->maps.procs), &tgid) == 0;
      });
    }
    cg.seeded = static_cast<std::int64_t>(seeded.size());
    stats_.try_emplace(group);
    cgroups_.emplace(cgroup_id, std::move(cg));
    return {};
  }

  void untrack(std::uint64_t cgroup_id) override {
    auto it = cgroups_.find(cgroup_id);
    if (it == cgroups_.end()) return;
    bpf_map_delete_elem(fd(skel_->maps.tracked), &cgroup_id);
    bpf_map_delete_elem(fd(skel_->maps.live), &cgroup_id);
    // Its processes stop counting anywhere: drop their `procs` entries, so a
    // later track() of the cgroup seeds them afresh. No process can enter the
    // map for this cgroup any more, and one forked in before is already
    // listed in cgroup.procs when its fork is traced.
    if (auto pids = read_pids(it->second.dir.get())) {
      for (std::int32_t pid : *pids) {
        const auto tgid = static_cast<std::uint32_t>(pid);
        TandemBpfProc now{};
        if (bpf_map_lookup_elem(fd(skel_->maps.procs), &tgid, &now) == 0 && now.cgroup_id == cgroup_id) {
          bpf_map_delete_elem(fd(skel_->maps.procs), &tgid);
        }
      }
    }
    cgroups_.erase(it);
  }

  std::vector<std::int32_t> lineage(std::uint64_t group) override {
    std::vector<std::int32_t> out;
    const int map = fd(skel_->maps.lineage);
    std::uint32_t key = 0;
    std::uint32_t next = 0;
    const std::uint32_t* prev = nullptr;
    while (bpf_map_get_next_key(map, prev, &next) == 0) {
      std::uint64_t g = 0;
      if (bpf_map_lookup_elem(map, &next, &g) == 0 && g == group) out.push_back(static_cast<std::int32_t>(next));
      key = next;
      prev = &key;
    }
    return out;
  }

  bool in_lineage(std::int32_t pid, std::uint64_t group) override {
    const auto tgid = static_cast<std::uint32_t>(pid);
    std::uint64_t g = 0;
    return bpf_map_lookup_elem(fd(skel_->maps.lineage), &tgid, &g) == 0 && g == group;
  }

  void forget_group(std::uint64_t group) override {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, cg] : cgroups_) {
      if (cg.group == group) ids.push_back(id);
    }
    for (std::uint64_t id : ids) untrack(id);
    bpf_map_delete_elem(fd(skel_->maps.counters), &group);
    stats_.erase(group);
  }

  std::size_t drain_events(const std::function<void(const ProcEvent&)>& sink) override {
    sink_ = &sink;
    drained_ = 0;
    ring_buffer__consume(ring_.get());
    sink_ = nullptr;
    return drained_;
  }

  const std::unordered_map<std::uint64_t, GroupStats>& sample() override {
    std::vector<TandemBpfCounters> per_cpu(cpus_);
    for (auto& [group, gs] : stats_) {
      gs.live_processes = 0;
      if (bpf_map_lookup_elem(fd(skel_->maps.counters), &group, per_cpu.data()) != 0) continue;
      GroupStats sum;
      for (const TandemBpfCounters& c : per_cpu) {
        sum.on_cpu_ns += c.on_cpu_ns;
        sum.runq_delay_ns += c.runq_delay_ns;
        sum.runq_waits += c.runq_waits;
        for (std::size_t b = 0; b < kRunqBuckets; ++b) sum.runq_hist[b] += c.runq_hist[b];
        sum.forks += c.forks;
        sum.execs += c.execs;
        sum.exits += c.exits;
      }
      gs = sum;  // live_processes: below
    }
    std::vector<TandemBpfLive> live(cpus_);
    for (const auto& [id, cg] : cgroups_) {
      std::int64_t n = cg.seeded;
      if (bpf_map_lookup_elem(fd(skel_->maps.live), &id, live.data()) == 0) {
        for (const TandemBpfLive& l : live) n += l.delta;
      }
      stats_[cg.group].live_processes += static_cast<std::uint64_t>(std::max<std::int64_t>(n, 0));
    }
    return stats_;
  }

  std::uint64_t bpf_run_ns() override {
    if (!stats_fd_) return 0;
    std::uint64_t ns = 0;
    bpf_program* prog = nullptr;
    bpf_object__for_each_program(prog, skel_->obj) {
      bpf_prog_info info{};
      std::uint32_t len = sizeof info;
      if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len) == 0) ns += info.run_time_ns;
    }
    return ns;
  }

  std::uint64_t lost_events() override {
    std::vector<TandemBpfHealth> per_cpu(cpus_);
    const std::uint32_t zero = 0;
    if (bpf_map_lookup_elem(fd(skel_->maps.health), &zero, per_cpu.data()) != 0) return 0;
    std::uint64_t n = 0;
    for (const TandemBpfHealth& h : per_cpu) n += h.events_dropped + h.procs_full;
    return n;
  }

 private:
  struct Cgroup {
    std::uint64_t group = 0;
    base::UniqueFd dir;
    std::int64_t seeded = 0;  // live processes found at track(), not counted by the kernel
  };

  explicit EbpfTelemetry(std::unique_ptr<telemetry, SkeletonDeleter> skel) : skel_(std::move(skel)) {}

  static int fd(const bpf_map* map) { return bpf_map__fd(map); }

  static std::unexpected<base::Error> map_error(std::string what) {
    const int code = errno;
    return base::make_error(code == E2BIG ? ENOSPC : code, std::move(what));
  }

  base::Result<std::vector<std::int32_t>> read_pids(int dir) {
    if (auto r = read_file_at(dir, "cgroup.procs", buf_); !r) return base::propagate(std::move(r.error()));
    return parse_pid_list(buf_);
  }

  static int on_record(void* ctx, void* data, std::size_t size) {
    auto* self = static_cast<EbpfTelemetry*>(ctx);
    if (size < sizeof(TandemBpfEvent) || self->sink_ == nullptr) return 0;
    TandemBpfEvent raw;
    std::memcpy(&raw, data, sizeof raw);
    ProcEvent e{};
    e.kind = static_cast<ProcEvent::Kind>(raw.kind);
    e.pid = raw.pid;
    e.ppid = raw.ppid;
    e.exit_code = raw.exit_code;
    e.cgroup_id = raw.cgroup_id;
    e.group = raw.group;
    e.timestamp_ns = raw.timestamp_ns;
    std::memcpy(e.comm, raw.comm, sizeof e.comm);
    e.comm[sizeof e.comm - 1] = '\0';
    ++self->drained_;
    (*self->sink_)(e);
    return 0;
  }

  // Declared before ring_ so the ring buffer is freed first.
  std::unique_ptr<telemetry, SkeletonDeleter> skel_;
  std::unique_ptr<ring_buffer, RingBufferDeleter> ring_;
  base::UniqueFd stats_fd_;  // BPF_ENABLE_STATS, with measure_run_time
  std::size_t cpus_ = 1;
  std::unordered_map<std::uint64_t, Cgroup> cgroups_;
  std::unordered_map<std::uint64_t, GroupStats> stats_;
  const std::function<void(const ProcEvent&)>* sink_ = nullptr;  // set during drain_events
  std::size_t drained_ = 0;
  std::string buf_;
};

}  // namespace
#endif  // TANDEM_HAVE_BPF

base::Result<std::unique_ptr<Telemetry>> open_telemetry(const Options& options) {
  if (options.force_sampling) return make_sampler(options, "forced by configuration");
#if TANDEM_HAVE_BPF
  auto ebpf = EbpfTelemetry::create(options);
  if (ebpf) return std::unique_ptr<Telemetry>(std::move(*ebpf));
  return make_sampler(options, fmt::format("eBPF unavailable: {}", ebpf.error().message()));
#else
  return make_sampler(options, "built without eBPF");
#endif
}

}  // namespace tandem::bpf
