#include "cpu/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstring>
#include <ctime>
#include <set>

#include <fmt/format.h>

#include "base/parse.h"

namespace tandem::cpu {
namespace {

constexpr std::array<std::string_view, kControllers> kControllerNames = {"cpu",    "cpuacct", "cpuset",
                                                                         "memory", "pids",    "freezer"};
constexpr std::size_t kMaxControlFile = 64 * 1024;

std::size_t index(Controller c) { return static_cast<std::size_t>(c); }

std::optional<Controller> controller_named(std::string_view n) {
  for (std::size_t i = 0; i < kControllers; ++i) {
    if (kControllerNames[i] == n) return static_cast<Controller>(i);
  }
  return std::nullopt;
}

base::Result<std::string> read_path(const std::string& path) { return read_file(AT_FDCWD, path.c_str()); }

// "a/b/c" split into parts; EINVAL for empty, ".", ".." or absolute paths.
base::Result<std::vector<std::string_view>> rel_parts(std::string_view rel) {
  std::vector<std::string_view> parts;
  if (rel.empty()) return parts;
  if (rel.front() == '/') return base::make_error(EINVAL, fmt::format("cgroup path '{}' must be relative", rel));
  for (std::string_view p : base::split(rel, '/')) {
    if (p.empty() || p == "." || p == "..") {
      return base::make_error(EINVAL, fmt::format("cgroup path '{}' has an empty, '.' or '..' part", rel));
    }
    if (p.size() > 255) return base::make_error(EINVAL, fmt::format("cgroup path '{}': a part is too long", rel));
  }
  return base::split(rel, '/');
}

base::Result<base::UniqueFd> open_dir(int at, const std::string& path) {
  base::UniqueFd fd(::openat(at, path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return base::errno_error(fmt::format("open cgroup {}", path));
  return fd;
}

// mkdir -p of `parts` beneath `base_fd`; returns the last directory's fd.
// `made(fd)` is called on each directory this call created, `passed(fd)` on
// each one that has a child in `parts` (created or not).
template <class Made, class Passed>
base::Result<base::UniqueFd> make_dirs(int base_fd, const std::vector<std::string_view>& parts, const std::string& what,
                                       Made&& made, Passed&& passed) {
  auto cur = base::UniqueFd(::fcntl(base_fd, F_DUPFD_CLOEXEC, 0));
  if (!cur) return base::errno_error(fmt::format("dup {}", what));
  std::string sofar;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string part(parts[i]);
    sofar += (sofar.empty() ? "" : "/") + part;
    bool created = false;
    if (::mkdirat(cur.get(), part.c_str(), 0755) == 0) {
      created = true;
    } else if (errno != EEXIST) {
      return base::errno_error(fmt::format("mkdir {}/{}", what, sofar));
    }
    auto next = open_dir(cur.get(), part);
    if (!next) return base::propagate(std::move(next.error()), what);
    if (created) {
      auto m = made(cur.get(), next->get());
      if (!m) return base::propagate(std::move(m.error()), fmt::format("{}/{}", what, sofar));
    }
    if (i + 1 < parts.size()) {
      auto p = passed(next->get());
      if (!p) return base::propagate(std::move(p.error()), fmt::format("{}/{}", what, sofar));
    }
    cur = std::move(*next);
  }
  return cur;
}

// Every cgroup directory beneath `dir` (depth first, children before parents),
// as paths relative to it; `dir` itself last as "".
base::Result<void> walk(int dir, const std::string& rel, std::vector<std::string>& out) {
  base::UniqueFd fd(::openat(dir, rel.empty() ? "." : rel.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return {};
    return base::errno_error(fmt::format("open {}", rel.empty() ? "." : rel));
  }
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return base::errno_error("fdopendir");
  (void)fd.release();
  std::vector<std::string> subdirs;
  while (const dirent* e = ::readdir(d)) {  // NOLINT(concurrency-mt-unsafe): one DIR per call
    if (e->d_type != DT_DIR || std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    subdirs.emplace_back(e->d_name);
  }
  ::closedir(d);
  for (const auto& s : subdirs) {
    auto r = walk(dir, rel.empty() ? s : fmt::format("{}/{}", rel, s), out);
    if (!r) return r;
  }
  out.push_back(rel);
  return {};
}

// A control-file write of the manager: write_file(), or the hook standing in for it.
base::Result<void> write_control(const TreeHooks& hooks, int dirfd, const char* name, std::string_view value) {
  return hooks.write ? hooks.write(dirfd, name, value) : write_file(dirfd, name, value);
}

// A new v1 cpuset cgroup starts with no cpus and no mems, and no task can
// join it until both are set: give it its parent's.
base::Result<void> inherit_cpuset(const TreeHooks& hooks, int parent, int made) {
  for (const char* f : {"cpuset.cpus", "cpuset.mems"}) {
    auto v = read_file(parent, f);
    if (!v) return base::propagate(std::move(v.error()));
    auto w = write_control(hooks, made, f, base::trim(*v));
    if (!w) return w;
  }
  return {};
}

void sleep_ms(int ms) {
  timespec ts{ms / 1000, static_cast<long>(ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

std::string format_bytes_or_max(std::uint64_t v) { return v == kUnlimited ? "max" : std::to_string(v); }

// Asks the v2 cgroup at `dir` (the subtree's parent) to enable `wanted` for
// its children; returns what it enables now. A cgroup with processes of its
// own cannot (the "no internal processes" rule: EBUSY). If the only one is
// this process — tandemd alone in its service cgroup, systemd's Delegate=yes —
// it moves itself into a "daemon" leaf, as systemd's delegation rules advise,
// and tries again. It never moves another process: with others there, the
// controllers stay off for the subtree, and the caller reports them missing.
base::Result<std::set<std::string>> delegate_from(int dir, const std::string& path,
                                                  const std::vector<std::string>& wanted, const Hierarchy& v2,
                                                  const TreeHooks& hooks) {
  auto words = [](std::string_view text) {
    std::set<std::string> out;
    for (auto w : base::split(base::trim(text), ' ', true)) out.emplace(w);
    return out;
  };
  auto available = read_file(dir, "cgroup.controllers");
  if (!available) return base::propagate(std::move(available.error()), path);
  auto enabled = read_file(dir, "cgroup.subtree_control");
  if (!enabled) return base::propagate(std::move(enabled.error()), path);
  const std::set<std::string> can = words(*available);
  std::set<std::string> on = words(*enabled);
  std::string request;
  for (const auto& w : wanted) {
    if (can.contains(w) && !on.contains(w)) request += fmt::format("{}+{}", request.empty() ? "" : " ", w);
  }
  if (request.empty()) return on;
  auto r = write_control(hooks, dir, "cgroup.subtree_control", request);
  if (!r && r.error().code() == EBUSY) {
    auto procs = read_file(dir, "cgroup.procs");
    auto pids = procs ? parse_pids(*procs) : base::Result<std::vector<int>>(std::vector<int>{});
    if (pids && pids->size() == 1 && pids->front() == ::getpid()) {
      const bool created = ::mkdirat(dir, "daemon", 0755) == 0;
      if (!created && errno != EEXIST) return base::errno_error(fmt::format("mkdir {}/daemon", path));
      auto leaf = open_dir(dir, "daemon");
      if (!leaf) return base::propagate(std::move(leaf.error()));
      if (created && hooks.made) {
        auto m = hooks.made(v2, leaf->get());
        if (!m) return base::propagate(std::move(m.error()), fmt::format("{}/daemon", path));
      }
      auto mv = write_control(hooks, leaf->get(), "cgroup.procs", "0");
      if (!mv) return base::propagate(std::move(mv.error()), fmt::format("move tandemd into {}/daemon", path));
      r = write_control(hooks, dir, "cgroup.subtree_control", request);
    }
  }
  if (!r) {
    // Not fatal: the knobs of these controllers are reported unsupported.
    return on;
  }
  enabled = read_file(dir, "cgroup.subtree_control");
  if (!enabled) return base::propagate(std::move(enabled.error()), path);
  return words(*enabled);
}

}  // namespace

std::string_view name(Controller c) { return kControllerNames[index(c)]; }

std::string Hierarchy::path() const { return root == "/" ? mount_point : mount_point + root; }

// ---- the plan -------------------------------------------------------------------

namespace {

std::string describe_hierarchies(const std::vector<Hierarchy>& hierarchies) {
  std::string out;
  for (const auto& h : hierarchies) {
    std::string cs;
    for (Controller c : h.controllers) cs += fmt::format("{}{}", cs.empty() ? "" : ",", name(c));
    out += fmt::format("{}{} {} {}", out.empty() ? "" : "; ", h.v2 ? "v2" : "v1", cs.empty() ? "-" : cs, h.path());
  }
  return out;
}

bool has(const std::vector<Controller>& cs, Controller c) { return std::ranges::find(cs, c) != cs.end(); }

}  // namespace

std::string CgroupPlan::v2_parent() const {
  if (v2 < 0) return {};
  const Hierarchy& h = hierarchies[static_cast<std::size_t>(v2)];
  return h.mount_point + h.root.substr(0, h.root.rfind('/'));
}

void CgroupPlan::take_v2(const std::set<std::string>& enabled) {
  if (v2 < 0) return;
  Hierarchy& h2 = hierarchies[static_cast<std::size_t>(v2)];
  std::vector<Controller> served;
  for (std::size_t i = 0; i < kControllers; ++i) {
    const auto c = static_cast<Controller>(i);
    if (has(h2.controllers, c) || (has(v2_ask, c) && enabled.contains(std::string(name(c))))) served.push_back(c);
  }
  h2.controllers = served;
  std::vector<Hierarchy> kept;
  int kept_v2 = -1;
  for (std::size_t i = 0; i < hierarchies.size(); ++i) {
    Hierarchy& h = hierarchies[i];
    if (static_cast<int>(i) == v2) {
      kept_v2 = static_cast<int>(kept.size());
    } else {
      std::erase_if(h.controllers, [&](Controller c) { return has(served, c); });
      if (h.controllers.empty()) continue;
    }
    kept.push_back(std::move(h));
  }
  hierarchies = std::move(kept);
  v2 = kept_v2;
  serving.fill(-1);
  for (std::size_t i = 0; i < hierarchies.size(); ++i) {
    for (Controller c : hierarchies[i].controllers) serving[index(c)] = static_cast<int>(i);
  }
  v2_ask.clear();
}

std::string CgroupPlan::describe() const { return describe_hierarchies(hierarchies); }

base::Result<CgroupPlan> plan_cgroups(std::string_view mountinfo, std::string_view self_cgroup,
                                      const ManagerOptions& options) {
  if (options.root.empty()) {
    auto parts = rel_parts(options.subtree);
    if (!parts) return base::propagate(std::move(parts.error()), "subtree");
    if (parts->empty()) return base::make_error(EINVAL, "subtree is empty: tandem needs a folder of its own");
  } else if (options.root.front() != '/' || options.root.find("/../") != std::string::npos ||
             options.root.ends_with("/..")) {
    return base::make_error(EINVAL, fmt::format("root '{}' must be an absolute path without '..'", options.root));
  }
  auto mounts = parse_mountinfo(mountinfo);
  if (!mounts) return base::propagate(std::move(mounts.error()));
  auto membership = parse_proc_cgroup(self_cgroup);
  if (!membership) return base::propagate(std::move(membership.error()));

  // Our own path in a mount's hierarchy, as seen on disk below its mount point.
  auto own_path = [&](const CgroupMount& m) -> std::optional<std::string> {
    for (const auto& cm : *membership) {
      bool match = false;
      if (m.v2) {
        match = cm.hierarchy == 0 && cm.controllers.empty();
      } else {
        std::set<std::string> a(cm.controllers.begin(), cm.controllers.end());
        std::set<std::string> b(m.controllers.begin(), m.controllers.end());
        match = cm.hierarchy != 0 && a == b;
      }
      if (!match) continue;
      if (m.root == "/") return cm.path;
      if (cm.path == m.root) return std::string("/");
      if (cm.path.starts_with(m.root + "/")) return cm.path.substr(m.root.size());
      return std::nullopt;  // we run outside what this mount shows
    }
    return std::nullopt;
  };
  auto subtree_of = [&](const std::string& own) {
    if (!options.root.empty()) return options.root;
    return own == "/" ? "/" + options.subtree : own + "/" + options.subtree;
  };

  CgroupPlan plan;
  // v2 first: it serves freezing, killing, cpu accounting and ids always.
  for (const auto& m : *mounts) {
    if (!m.v2 || plan.v2 >= 0) continue;
    auto own = own_path(m);
    if (!own) continue;
    Hierarchy h;
    h.v2 = true;
    h.favordynmods = m.favordynmods;
    h.mount_point = m.mount_point;
    h.root = subtree_of(*own);
    for (std::size_t i = 0; i < kControllers; ++i) {
      const auto c = static_cast<Controller>(i);
      if (!options.want[i]) continue;
      if (c == Controller::kCpuacct || c == Controller::kFreezer) {
        // cpu.stat and cgroup.freeze exist without controllers.
        h.controllers.push_back(c);
        plan.serving[i] = static_cast<int>(plan.hierarchies.size());
      } else {
        plan.v2_ask.push_back(c);  // if the parent hands it down (take_v2)
      }
    }
    plan.v2 = static_cast<int>(plan.hierarchies.size());
    plan.hierarchies.push_back(std::move(h));
  }
  for (const auto& m : *mounts) {
    if (m.v2) continue;
    Hierarchy h;
    for (const auto& cn : m.controllers) {
      auto c = controller_named(cn);
      if (c && options.want[index(*c)] && plan.serving[index(*c)] < 0) h.controllers.push_back(*c);
    }
    if (h.controllers.empty()) continue;
    auto own = own_path(m);
    if (!own) continue;
    h.mount_point = m.mount_point;
    h.favordynmods = m.favordynmods;
    h.root = subtree_of(*own);
    for (Controller c : h.controllers) plan.serving[index(c)] = static_cast<int>(plan.hierarchies.size());
    plan.hierarchies.push_back(std::move(h));
  }
  if (plan.hierarchies.empty()) {
    return base::make_error(ENOENT, "no cgroup hierarchy is mounted that this process can see itself in");
  }
  for (const Hierarchy& h : plan.hierarchies) {
    auto parts = rel_parts(std::string_view(h.root).substr(1));
    if (!parts) return base::propagate(std::move(parts.error()), "root");
  }
  return plan;
}

base::Result<void> validate(const Limits& l) {
  if (l.cpu_weight && (*l.cpu_weight < 1 || *l.cpu_weight > 10000)) {
    return base::make_error(EINVAL, fmt::format("cpu_weight {} is outside 1..10000", *l.cpu_weight));
  }
  if (l.cpu_max) {
    auto f = format_cpu_max(*l.cpu_max);
    if (!f) return base::propagate(std::move(f.error()), "cpu_max");
  }
  if (l.cpus && l.cpus->find_first_not_of("0123456789,-") != std::string::npos) {
    return base::make_error(EINVAL, fmt::format("cpus '{}' is not a cpu list like 0-3,6", *l.cpus));
  }
  if (l.pids_max && *l.pids_max == 0) return base::make_error(EINVAL, "pids_max 0 would forbid the tool itself");
  return {};
}

// ---- file access --------------------------------------------------------------

base::Result<std::string> read_file(int dirfd, const char* name) {
  base::UniqueFd fd(::openat(dirfd, name, O_RDONLY | O_CLOEXEC));
  if (!fd) return base::errno_error(fmt::format("open {}", name));
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return base::errno_error(fmt::format("read {}", name));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > kMaxControlFile) return base::make_error(EFBIG, fmt::format("{} is over 64 KiB", name));
  }
  return out;
}

base::Result<void> write_file(int dirfd, const char* name, std::string_view value) {
  base::UniqueFd fd(::openat(dirfd, name, O_WRONLY | O_CLOEXEC));
  if (!fd) return base::errno_error(fmt::format("open {}", name));
  for (;;) {
    ssize_t n = ::write(fd.get(), value.data(), value.size());
    if (n >= 0) return {};
    if (errno != EINTR) return base::errno_error(fmt::format("write '{}' to {}", value, name));
  }
}

base::Result<std::uint64_t> cgroup_id(int dirfd) {
  alignas(file_handle) unsigned char buf[sizeof(file_handle) + sizeof(std::uint64_t)] = {};
  auto* handle = reinterpret_cast<file_handle*>(buf);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  handle->handle_bytes = sizeof(std::uint64_t);
  int mount_id = 0;
  if (::name_to_handle_at(dirfd, "", handle, &mount_id, AT_EMPTY_PATH) != 0) {
    return base::errno_error("name_to_handle_at on a cgroup");
  }
  if (handle->handle_bytes != sizeof(std::uint64_t)) return base::make_error(EINVAL, "cgroup handle is not 8 bytes");
  std::uint64_t id = 0;
  std::memcpy(&id, buf + sizeof(file_handle), sizeof id);
  return id;
}

base::Result<Usage> read_usage(const CgroupDirs& dirs) {
  Usage u;
  const int v2 = dirs.v2_dir;
  const int cpuacct = dirs.v1_dir(dirs.cpuacct);
  const int memory = dirs.v1_dir(dirs.memory);
  const int cpu = dirs.v1_dir(dirs.cpu);
  if (cpuacct >= 0) {
    auto t = read_file(cpuacct, "cpuacct.usage");
    if (!t) return base::propagate(std::move(t.error()));
    auto ns = parse_cpuacct_usage_ns(*t);
    if (!ns) return base::propagate(std::move(ns.error()));
    u.cpu_ns = *ns;
  }
  const int cpu_stat_dir = cpu >= 0 ? cpu : v2;
  if (cpu_stat_dir >= 0) {
    auto t = read_file(cpu_stat_dir, "cpu.stat");
    if (!t) return base::propagate(std::move(t.error()));
    auto st = parse_cpu_stat(*t);
    if (!st) return base::propagate(std::move(st.error()));
    u.nr_throttled = st->nr_throttled;
    u.throttled_us = st->throttled_us;
    if (!u.cpu_ns && cpu_stat_dir == v2) u.cpu_ns = st->usage_us * 1000;
  }
  if (!u.cpu_ns && v2 >= 0 && cpu >= 0) {
    auto t = read_file(v2, "cpu.stat");
    if (t) {
      auto st = parse_cpu_stat(*t);
      if (st) u.cpu_ns = st->usage_us * 1000;
    }
  }
  auto number = [](int dir, const char* file) -> base::Result<std::uint64_t> {
    auto t = read_file(dir, file);
    if (!t) return base::propagate(std::move(t.error()));
    return base::parse_int<std::uint64_t>(base::trim(*t));
  };
  if (memory >= 0) {
    auto cur = number(memory, "memory.usage_in_bytes");
    if (!cur) return base::propagate(std::move(cur.error()), "memory.usage_in_bytes");
    u.memory_bytes = *cur;
    auto peak = number(memory, "memory.max_usage_in_bytes");
    if (!peak) return base::propagate(std::move(peak.error()), "memory.max_usage_in_bytes");
    u.memory_peak = *peak;
    auto oc = read_file(memory, "memory.oom_control");
    if (!oc) return base::propagate(std::move(oc.error()));
    auto parsed = parse_oom_control(*oc);
    if (!parsed) return base::propagate(std::move(parsed.error()));
    u.oom_kills = parsed->oom_kill;
    u.memory_stalled = parsed->under_oom;
  } else if (v2 >= 0) {
    // Present only where v2's memory controller is enabled for this cgroup.
    if (auto cur = number(v2, "memory.current")) {
      u.memory_bytes = *cur;
      if (auto peak = number(v2, "memory.peak")) u.memory_peak = *peak;
      auto ev = read_file(v2, "memory.events");
      if (!ev) return base::propagate(std::move(ev.error()));
      auto parsed = parse_memory_events(*ev);
      if (!parsed) return base::propagate(std::move(parsed.error()));
      u.oom_kills = parsed->oom_kill;
      u.memory_high_events = parsed->high;
    }
  }
  return u;
}

// ---- the manager -----------------------------------------------------------------

CgroupManager::~CgroupManager() = default;

base::Result<CgroupPlan> plan_cgroups(const ManagerOptions& options) {
  auto mi = read_path(options.mountinfo_path);
  if (!mi) return base::propagate(std::move(mi.error()));
  auto sc = read_path(options.self_cgroup_path);
  if (!sc) return base::propagate(std::move(sc.error()));
  return plan_cgroups(*mi, *sc, options);
}

base::Result<std::unique_ptr<CgroupManager>> CgroupManager::open(const ManagerOptions& options) {
  auto plan = plan_cgroups(options);
  if (!plan) return base::propagate(std::move(plan.error()), "cgroups");
  return open_plan(std::move(*plan), options.hooks);
}

base::Result<std::unique_ptr<CgroupManager>> CgroupManager::open_plan(CgroupPlan plan, TreeHooks hooks) {
  std::unique_ptr<CgroupManager> m(new CgroupManager());
  m->hooks_ = std::move(hooks);
  auto r = m->init(std::move(plan));
  if (!r) return base::propagate(std::move(r.error()), "cgroups");
  return m;
}

base::Result<void> CgroupManager::init(CgroupPlan plan) {
  if (plan.hierarchies.empty()) return base::make_error(ENOENT, "the plan has no cgroup hierarchy");
  if (plan.v2 >= 0) {
    // The controllers v2 hands to our subtree: those the root's parent
    // enables for its children. Ask it to enable the ones we want.
    std::set<std::string> available;
    const std::string parent_dir = plan.v2_parent();
    auto pfd = open_dir(AT_FDCWD, parent_dir);
    if (pfd) {
      std::vector<std::string> wanted;
      wanted.reserve(plan.v2_ask.size());
      for (Controller c : plan.v2_ask) wanted.emplace_back(name(c));
      auto enabled =
          delegate_from(pfd->get(), parent_dir, wanted, plan.hierarchies[static_cast<std::size_t>(plan.v2)], hooks_);
      if (!enabled) return base::propagate(std::move(enabled.error()));
      available = std::move(*enabled);
    } else if (pfd.error().code() != ENOENT) {
      return base::propagate(std::move(pfd.error()));
    }  // a configured root whose parent does not exist yet: no controllers handed down
    plan.take_v2(available);
  }
  hierarchies_ = std::move(plan.hierarchies);
  serving_ = plan.serving;
  v2_ = plan.v2;

  // The subtree's root in each hierarchy.
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    const Hierarchy& h = hierarchies_[i];
    auto mount = open_dir(AT_FDCWD, h.mount_point);
    if (!mount) return base::propagate(std::move(mount.error()));
    auto parts = rel_parts(std::string_view(h.root).substr(1));
    if (!parts) return base::propagate(std::move(parts.error()), "root");
    auto fd = make_dirs(
        mount->get(), *parts, h.mount_point, [&](int parent, int dir) { return made(h, parent, dir); },
        [](int) -> base::Result<void> { return {}; });
    if (!fd) {
      return base::propagate(std::move(fd.error()), fmt::format("create the subtree {}", h.path()));
    }
    if (h.v2) {
      auto en = enable_v2_controllers(fd->get());
      if (!en) return base::propagate(std::move(en.error()), h.path());
    }
    root_.dirs.push_back(std::move(*fd));
  }
  auto id = id_of(root_.dirs[v2_ >= 0 ? static_cast<std::size_t>(v2_) : 0].get());
  if (!id) return base::propagate(std::move(id.error()));
  root_.id = *id;
  return {};
}

base::Result<void> CgroupManager::made(const Hierarchy& h, int parent, int dir) const {
  if (hooks_.made) {
    auto m = hooks_.made(h, dir);
    if (!m) return m;
  }
  // A new v1 cpuset cgroup needs its parent's cpus and mems.
  if (!h.v2 && has(h.controllers, Controller::kCpuset)) return inherit_cpuset(hooks_, parent, dir);
  return {};
}

int CgroupManager::remove_dir(const std::string& path) const {
  if (hooks_.removing) hooks_.removing(path);
  return ::rmdir(path.c_str());
}

base::Result<void> CgroupManager::write(int dir, const char* name, std::string_view value) const {
  return write_control(hooks_, dir, name, value);
}

base::Result<std::uint64_t> CgroupManager::id_of(int dir) const { return hooks_.id ? hooks_.id(dir) : cgroup_id(dir); }

base::Result<void> CgroupManager::enable_v2_controllers(int dirfd) const {
  if (v2_ < 0) return {};
  std::string want;
  for (Controller c : hierarchies_[static_cast<std::size_t>(v2_)].controllers) {
    if (c == Controller::kCpuacct || c == Controller::kFreezer) continue;
    want += fmt::format("{}+{}", want.empty() ? "" : " ", name(c));
  }
  if (want.empty()) return {};
  auto have = read_file(dirfd, "cgroup.subtree_control");
  if (!have) return base::propagate(std::move(have.error()));
  const auto names = base::split(base::trim(*have), ' ', true);
  bool missing = false;
  for (auto w : base::split(want, ' ')) {
    if (std::ranges::find(names, w.substr(1)) == names.end()) missing = true;
  }
  if (!missing) return {};
  // Inside the subtree only leaves hold processes, so this cannot meet EBUSY.
  return write(dirfd, "cgroup.subtree_control", want);
}

std::uint32_t CgroupManager::unsupported() const {
  std::uint32_t u = 0;
  if (serving(Controller::kCpu) < 0) u |= kNoCpuWeight | kNoCpuMax;
  if (serving(Controller::kMemory) < 0) u |= kNoMemoryHigh | kNoMemoryMax | kNoMemoryLow;
  if (serving(Controller::kMemory) >= 0 && !hierarchies_[static_cast<std::size_t>(serving(Controller::kMemory))].v2) {
    u |= kNoMemoryLow;
  }
  if (serving(Controller::kPids) < 0) u |= kNoPidsMax;
  if (serving(Controller::kCpuset) < 0) u |= kNoCpus;
  return u;
}

std::string CgroupManager::describe() const { return describe_hierarchies(hierarchies_); }

base::Result<Node> CgroupManager::create(std::string_view rel) {
  auto parts = rel_parts(rel);
  if (!parts) return base::propagate(std::move(parts.error()));
  Node node;
  node.rel = std::string(rel);
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    const Hierarchy& h = hierarchies_[i];
    auto fd = make_dirs(
        root_.dirs[i].get(), *parts, h.path(), [&](int parent, int dir) { return made(h, parent, dir); },
        [&](int passed) -> base::Result<void> {
          if (!h.v2) return {};
          return enable_v2_controllers(passed);
        });
    if (!fd) return base::propagate(std::move(fd.error()), fmt::format("create cgroup {}", rel));
    node.dirs.push_back(std::move(*fd));
  }
  auto id = id_of(node.dirs[v2_ >= 0 ? static_cast<std::size_t>(v2_) : 0].get());
  if (!id) return base::propagate(std::move(id.error()));
  node.id = *id;
  return node;
}

base::Result<Node> CgroupManager::open_node(std::string_view rel) const {
  auto parts = rel_parts(rel);
  if (!parts) return base::propagate(std::move(parts.error()));
  Node node;
  node.rel = std::string(rel);
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    auto fd = open_dir(root_.dirs[i].get(), rel.empty() ? "." : std::string(rel));
    if (!fd) return base::propagate(std::move(fd.error()), hierarchies_[i].path());
    node.dirs.push_back(std::move(*fd));
  }
  auto id = id_of(node.dirs[v2_ >= 0 ? static_cast<std::size_t>(v2_) : 0].get());
  if (!id) return base::propagate(std::move(id.error()));
  node.id = *id;
  return node;
}

base::Result<std::vector<std::string>> CgroupManager::children(std::string_view rel) const {
  auto parts = rel_parts(rel);
  if (!parts) return base::propagate(std::move(parts.error()));
  base::UniqueFd fd(
      ::openat(root_.dirs[0].get(), rel.empty() ? "." : std::string(rel).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return base::errno_error(fmt::format("open {}/{}", hierarchies_[0].path(), rel));
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return base::errno_error("fdopendir");
  (void)fd.release();
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) {  // NOLINT(concurrency-mt-unsafe): one DIR per call
    if (e->d_type == DT_DIR && std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      out.emplace_back(e->d_name);
    }
  }
  ::closedir(d);
  std::ranges::sort(out);
  return out;
}

base::Result<std::uint32_t> CgroupManager::apply(const Node& node, const Limits& l) const {
  auto valid = validate(l);
  if (!valid) return base::propagate(std::move(valid.error()));
  // What to write, in order; nothing is written unless every value formats.
  struct Write {
    Controller controller;
    const char* file;
    std::string value;
  };
  std::vector<Write> writes;
  std::uint32_t skipped = 0;
  auto served = [&](Controller c, std::uint32_t bits) {
    if (serving(c) >= 0) return true;
    skipped |= bits;
    return false;
  };
  auto v2 = [&](Controller c) { return hierarchies_[static_cast<std::size_t>(serving(c))].v2; };

  if (l.cpu_weight && served(Controller::kCpu, kNoCpuWeight)) {
    if (v2(Controller::kCpu)) {
      writes.push_back({Controller::kCpu, "cpu.weight", std::to_string(*l.cpu_weight)});
    } else {
      const std::uint64_t shares = std::max<std::uint64_t>(2, std::uint64_t{*l.cpu_weight} * 1024 / 100);
      writes.push_back({Controller::kCpu, "cpu.shares", std::to_string(shares)});
    }
  }
  if (l.cpu_max && served(Controller::kCpu, kNoCpuMax)) {
    if (v2(Controller::kCpu)) {
      writes.push_back({Controller::kCpu, "cpu.max", *format_cpu_max(*l.cpu_max)});  // validated above
    } else {
      // Unlimit first, so that the period change never meets an old quota.
      writes.push_back({Controller::kCpu, "cpu.cfs_quota_us", "-1"});
      writes.push_back({Controller::kCpu, "cpu.cfs_period_us", std::to_string(l.cpu_max->period_us)});
      if (l.cpu_max->quota_us) {
        writes.push_back({Controller::kCpu, "cpu.cfs_quota_us", std::to_string(*l.cpu_max->quota_us)});
      }
    }
  }
  const std::uint32_t memory_bits =
      (l.memory_high ? kNoMemoryHigh : 0u) | (l.memory_max ? kNoMemoryMax : 0u) | (l.memory_low ? kNoMemoryLow : 0u);
  if (memory_bits != 0 && served(Controller::kMemory, memory_bits)) {
    if (v2(Controller::kMemory)) {
      if (l.memory_max) writes.push_back({Controller::kMemory, "memory.max", format_bytes_or_max(*l.memory_max)});
      if (l.memory_high) writes.push_back({Controller::kMemory, "memory.high", format_bytes_or_max(*l.memory_high)});
      if (l.memory_low) writes.push_back({Controller::kMemory, "memory.low", format_bytes_or_max(*l.memory_low)});
    } else {
      if (l.memory_low) skipped |= kNoMemoryLow;
      if (l.memory_high || l.memory_max) {
        // v1 has one limit. At a high limit allocations stall (the OOM killer
        // off for the cgroup); at a max limit the OOM killer acts.
        const bool throttle = l.memory_high && *l.memory_high != kUnlimited;
        const std::uint64_t limit = throttle ? *l.memory_high : l.memory_max.value_or(kUnlimited);
        writes.push_back({Controller::kMemory, "memory.oom_control", throttle ? "1" : "0"});
        writes.push_back(
            {Controller::kMemory, "memory.limit_in_bytes", limit == kUnlimited ? "-1" : std::to_string(limit)});
      }
    }
  }
  if (l.pids_max && served(Controller::kPids, kNoPidsMax)) {
    writes.push_back({Controller::kPids, "pids.max", format_bytes_or_max(*l.pids_max)});
  }
  if (l.cpus && served(Controller::kCpuset, kNoCpus)) writes.push_back({Controller::kCpuset, "cpuset.cpus", *l.cpus});

  for (const Write& w : writes) {
    const int dir = node.dirs[static_cast<std::size_t>(serving(w.controller))].get();
    auto r = write(dir, w.file, w.value);
    if (!r) return base::propagate(std::move(r.error()), fmt::format("cgroup {}", node.rel));
  }
  return skipped;
}

base::Result<void> CgroupManager::freeze(const Node& node, bool frozen) const {
  const int h = serving(Controller::kFreezer);
  if (h < 0) return base::make_error(ENOTSUP, "no freezer: neither cgroup v2 nor the v1 freezer is mounted");
  const int dir = node.dirs[static_cast<std::size_t>(h)].get();
  if (hierarchies_[static_cast<std::size_t>(h)].v2) return write(dir, "cgroup.freeze", frozen ? "1" : "0");
  return write(dir, "freezer.state", frozen ? "FROZEN" : "THAWED");
}

base::Result<std::vector<int>> CgroupManager::processes(const Node& node) const {
  std::set<int> all;
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    std::vector<std::string> dirs;
    auto w = walk(node.dirs[i].get(), "", dirs);
    if (!w) return base::propagate(std::move(w.error()), fmt::format("{}/{}", hierarchies_[i].path(), node.rel));
    for (const auto& d : dirs) {
      auto fd = open_dir(node.dirs[i].get(), d.empty() ? "." : d);
      if (!fd) continue;  // removed meanwhile
      auto text = read_file(fd->get(), "cgroup.procs");
      if (!text) {
        if (text.error().code() == ENOENT || text.error().code() == ENODEV) continue;
        return base::propagate(std::move(text.error()));
      }
      auto pids = parse_pids(*text);
      if (!pids) return base::propagate(std::move(pids.error()));
      all.insert(pids->begin(), pids->end());
    }
  }
  return std::vector<int>(all.begin(), all.end());
}

base::Result<void> CgroupManager::kill(const Node& node, int timeout_ms) const {
  const bool v2 = v2_ >= 0;
  const int freezer = serving(Controller::kFreezer);
  for (int waited = 0;; ++waited) {
    auto pids = processes(node);
    if (!pids) return base::propagate(std::move(pids.error()));
    if (pids->empty()) return {};
    if (waited >= timeout_ms) {
      return base::make_error(EBUSY, fmt::format("cgroup {}: {} processes left after SIGKILL (first {})", node.rel,
                                                 pids->size(), pids->front()));
    }
    if (v2) {
      auto r = write(node.dirs[static_cast<std::size_t>(v2_)].get(), "cgroup.kill", "1");
      if (!r && r.error().code() != ENOENT) return r;
    }
    // Members seen only in v1 (a process that joined some hierarchies), or
    // no cgroup.kill: freeze so none forks or exits meanwhile (its pid then
    // cannot be reused), kill each, thaw so they die.
    const bool freeze_first = !v2 && freezer >= 0;
    if (freeze_first) (void)freeze(node, true);
    for (int pid : *pids) ::kill(pid, SIGKILL);
    if (freeze_first) (void)freeze(node, false);
    sleep_ms(1);
  }
}

base::Result<void> CgroupManager::remove(const Node& node) const {
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    std::vector<std::string> dirs;
    auto w = walk(node.dirs[i].get(), "", dirs);
    if (!w) return base::propagate(std::move(w.error()));
    const std::string base = hierarchies_[i].path() + (node.rel.empty() ? "" : "/" + node.rel);
    for (const auto& d : dirs) {  // children first
      const std::string path = d.empty() ? base : fmt::format("{}/{}", base, d);
      if (remove_dir(path) != 0 && errno != ENOENT) return base::errno_error(fmt::format("rmdir {}", path));
    }
  }
  return {};
}

base::Result<void> CgroupManager::remove_leaf(const Node& node) const {
  if (node.rel.empty()) return base::make_error(EINVAL, "remove_leaf: not the subtree's root");
  // v2 first: it is where a process of the cgroup always is, so a busy
  // cgroup fails here, before any hierarchy lost its directory.
  std::vector<std::size_t> order;
  if (v2_ >= 0) order.push_back(static_cast<std::size_t>(v2_));
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    if (static_cast<int>(i) != v2_) order.push_back(i);
  }
  for (std::size_t i : order) {
    const std::string path = fmt::format("{}/{}", hierarchies_[i].path(), node.rel);
    if (remove_dir(path) != 0 && errno != ENOENT) return base::errno_error(fmt::format("rmdir {}", path));
  }
  return {};
}

base::Result<Usage> CgroupManager::usage(const Node& node) const { return read_usage(dirs(node)); }

base::Result<Psi> CgroupManager::pressure(const Node& node, std::string_view resource) const {
  if (v2_ < 0) return base::make_error(ENOTSUP, "per-cgroup pressure needs cgroup v2");
  if (resource != "cpu" && resource != "memory" && resource != "io") {
    return base::make_error(EINVAL, fmt::format("no pressure file for '{}'", resource));
  }
  const std::string file = fmt::format("{}.pressure", resource);
  auto text = read_file(node.dirs[static_cast<std::size_t>(v2_)].get(), file.c_str());
  if (!text) return base::propagate(std::move(text.error()));
  return parse_psi(*text);
}

CgroupDirs CgroupManager::dirs(const Node& node) const {
  CgroupDirs d;
  std::vector<int> v1_index(hierarchies_.size(), -1);
  for (std::size_t i = 0; i < hierarchies_.size(); ++i) {
    if (hierarchies_[i].v2) {
      d.v2_dir = node.dirs[i].get();
    } else {
      v1_index[i] = static_cast<int>(d.v1_dirs.size());
      d.v1_dirs.push_back(node.dirs[i].get());
    }
  }
  // The v1 hierarchy serving the controller, as an index among the v1 ones.
  auto v1 = [&](Controller c) {
    const int h = serving(c);
    return h < 0 ? -1 : v1_index[static_cast<std::size_t>(h)];
  };
  d.cpuacct = v1(Controller::kCpuacct);
  d.memory = v1(Controller::kMemory);
  d.cpu = v1(Controller::kCpu);
  return d;
}

}  // namespace tandem::cpu
