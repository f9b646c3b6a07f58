// A fake cgroupfs for tests that run as a normal user: plain directories and
// files in a temporary directory, laid out as the kernel lays out cgroup v2,
// v1 or hybrid hierarchies (the approach of Facebook oomd's fixture tests),
// with a /proc/self/mountinfo and /proc/self/cgroup text describing them.
// cpu::CgroupManager and daemon::HostPlane run on it through the manager's
// ManagerOptions files and TreeHooks (cpu/cgroup.h); the hooks do what the
// kernel does on cgroupfs:
//   - made: a new cgroup gets its control files. On v2 the controllers'
//     files follow the parent's cgroup.subtree_control, as they do in the
//     kernel ("+memory" written there gives the children memory.*); on v1
//     those of the mount's controllers.
//   - removing: an rmdir takes the control files with it, unless the
//     cgroup has processes (cgroup.procs not empty) or child cgroups, when
//     the rmdir then fails (ENOTEMPTY where the kernel says EBUSY).
//   - id: a cgroup's id is its directory's inode number (as on cgroupfs).
//   - write: a write replaces the file's text, as on cgroupfs, and the
//     files that take a command show the state it leaves:
//     cgroup.subtree_control ("+cpu -io" against cgroup.controllers, ENOENT
//     for a controller the parent does not hand down), memory.oom_control
//     (oom_kill_disable), cgroup.procs and tasks (a pid joins; "0" is the
//     writer). Other files show what was written, without a newline.
// What a plain file cannot do: no write fails with EBUSY, memory.limit_in_bytes
// shows "-1" rather than the kernel's rounded maximum, and nothing happens to
// processes listed in cgroup.procs (kill() signals them, as it would, and
// they stay listed until the test clears them).
//
// Thread-safety: one thread; the hooks it hands out point at this object,
// which must outlive the manager using them.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "base/parse.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "cpu/cgroup.h"

namespace tandem::testing {

// One mounted hierarchy of the fake tree.
struct FakeMount {
  std::string dir;  // beneath the fake root: "unified", "cpu,cpuacct"
  bool v2 = false;
  // v1: the hierarchy's controllers ("cpu", "cpuacct", "name=systemd").
  // v2: what this process's cgroup may hand down (its cgroup.controllers).
  std::vector<std::string> controllers;
  // v2: what this process's cgroup already hands down (its cgroup.subtree_control).
  std::vector<std::string> enabled;
  std::string own;  // this process's cgroup in the hierarchy; "" = the fixture's
};

class FakeCgroupfs {
 public:
  // The controllers tandem uses from v2, as a systemd Delegate=yes service has them.
  static std::vector<FakeMount> pure_v2() {
    const std::vector<std::string> all = {"cpuset", "cpu", "io", "memory", "pids"};
    return {{"cgroup", true, all, {"cpuset", "cpu", "memory", "pids"}, ""}};
  }
  // This development machine: v1 controllers, and a cgroup2 at unified/ with
  // no controllers; the memory hierarchy places us elsewhere (own_memory).
  static std::vector<FakeMount> hybrid(const std::string& own_memory = "") {
    return {{"cpu", false, {"cpu"}, {}, ""},
            {"cpuacct", false, {"cpuacct"}, {}, ""},
            {"cpuset", false, {"cpuset"}, {}, ""},
            {"memory", false, {"memory"}, {}, own_memory},
            {"devices", false, {"devices"}, {}, ""},
            {"freezer", false, {"freezer"}, {}, ""},
            {"pids", false, {"pids"}, {}, ""},
            {"systemd", false, {"name=systemd"}, {}, ""},
            {"unified", true, {}, {}, ""}};
  }
  // v1 alone, cpu and cpuacct co-mounted as on older distributions.
  static std::vector<FakeMount> pure_v1() {
    return {{"cpu,cpuacct", false, {"cpu", "cpuacct"}, {}, ""},
            {"cpuset", false, {"cpuset"}, {}, ""},
            {"memory", false, {"memory"}, {}, ""},
            {"freezer", false, {"freezer"}, {}, ""},
            {"pids", false, {"pids"}, {}, ""}};
  }

  explicit FakeCgroupfs(std::vector<FakeMount> mounts, std::string own = "/test.slice/own.service")
      : mounts_(std::move(mounts)), own_(std::move(own)) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-fakecg-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    root_ = tmpl;
    std::string mountinfo =
        "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n";
    std::string self;
    int id = 30;
    unsigned hierarchy = static_cast<unsigned>(mounts_.size());
    for (const FakeMount& m : mounts_) {
      const std::filesystem::path point = root_ / m.dir;
      std::filesystem::create_directories(point);
      mountinfo += fmt::format("{} 22 0:{} / {} rw,nosuid,nodev,noexec,relatime shared:{} - {} {} rw{}{}\n", id, id,
                               escape(point.string()), id, m.v2 ? "cgroup2" : "cgroup", m.v2 ? "cgroup2" : "cgroup",
                               m.v2 ? ",nsdelegate" : ",", m.v2 ? "" : join(m.controllers, ","));
      ++id;
      // This process's cgroup and the ones above it, as the kernel has them.
      const std::string own_here = own_of(m);
      std::filesystem::path dir = point;
      populate_dir(m, dir, m.controllers);
      for (std::string_view part : base::split(own_here, '/', true)) {
        dir /= std::string(part);
        std::filesystem::create_directories(dir);
        populate_dir(m, dir, m.controllers);
      }
      if (m.v2) {
        write(dir / "cgroup.controllers", join(m.controllers, " ") + "\n");
        write(dir / "cgroup.subtree_control", join(m.enabled, " ") + "\n");
        self += fmt::format("0::{}\n", own_here);
      } else {
        self.insert(0, fmt::format("{}:{}:{}\n", hierarchy--, join(m.controllers, ","), own_here));
      }
      if (!m.v2 && std::ranges::find(m.controllers, "cpuset") != m.controllers.end()) {
        write(dir / "cpuset.cpus", "0-1\n");
        write(dir / "cpuset.mems", "0\n");
      }
    }
    mountinfo += "60 22 0:40 / /tmp rw,nosuid,nodev shared:30 - tmpfs tmpfs rw\n";
    mountinfo_ = mountinfo;
    self_cgroup_ = self;
    write(root_ / "mountinfo", mountinfo_);
    write(root_ / "self-cgroup", self_cgroup_);
    std::filesystem::create_directories(root_ / "proc" / "pressure");
    set_node_pressure("memory", 0.0);
    set_node_pressure("cpu", 0.0);
  }
  ~FakeCgroupfs() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  FakeCgroupfs(const FakeCgroupfs&) = delete;
  FakeCgroupfs& operator=(const FakeCgroupfs&) = delete;

  const std::filesystem::path& root() const { return root_; }
  const std::string& mountinfo() const { return mountinfo_; }
  const std::string& self_cgroup() const { return self_cgroup_; }
  // A procfs for the node's pressure files and the sampler (HostEnv::proc_root).
  std::filesystem::path proc() const { return root_ / "proc"; }

  cpu::TreeHooks hooks() const {
    cpu::TreeHooks h;
    h.made = [this](const cpu::Hierarchy& hierarchy, int dir) { return made(hierarchy, dir); };
    h.removing = [](const std::string& path) { removing(path); };
    h.id = [](int dir) -> base::Result<std::uint64_t> {
      struct stat st {};
      if (::fstat(dir, &st) != 0) return base::errno_error("fake cgroup id: fstat");
      return static_cast<std::uint64_t>(st.st_ino);
    };
    h.write = [](int dir, const char* name, std::string_view value) { return kernel_write(dir, name, value); };
    return h;
  }
  // The manager's options on this tree (subtree "tandem").
  cpu::ManagerOptions options() const {
    cpu::ManagerOptions o;
    o.mountinfo_path = (root_ / "mountinfo").string();
    o.self_cgroup_path = (root_ / "self-cgroup").string();
    o.hooks = hooks();
    return o;
  }

  // The directory of `rel` beneath the subtree ("tools/x"; "" = the subtree's
  // root) in mount `mount` (its dir), for subtree `subtree` under our own cgroup.
  std::filesystem::path dir(std::string_view mount, std::string_view rel = "",
                            std::string_view subtree = "tandem") const {
    std::filesystem::path p = own_dir(mount) / std::string(subtree);
    if (!rel.empty()) p /= std::string(rel);
    return p;
  }
  // Our own cgroup's directory in `mount`.
  std::filesystem::path own_dir(std::string_view mount) const {
    const FakeMount& m = find(mount);
    const std::string own = own_of(m);  // outlives split()'s views
    std::filesystem::path p = root_ / m.dir;
    for (std::string_view part : base::split(own, '/', true)) p /= std::string(part);
    return p;
  }
  std::string read(std::string_view mount, std::string_view rel, std::string_view file) const {
    return read(dir(mount, rel) / std::string(file));
  }
  void write(std::string_view mount, std::string_view rel, std::string_view file, std::string_view text) const {
    write(dir(mount, rel) / std::string(file), text);
  }
  bool has(std::string_view mount, std::string_view rel, std::string_view file = "") const {
    return ::access((file.empty() ? dir(mount, rel) : dir(mount, rel) / std::string(file)).c_str(), F_OK) == 0;
  }
  void set_procs(std::string_view mount, std::string_view rel, const std::vector<int>& pids) const {
    std::string text;
    for (int p : pids) text += fmt::format("{}\n", p);
    write(mount, rel, "cgroup.procs", text);
  }
  void set_node_pressure(std::string_view resource, double some_avg10) const {
    write(proc() / "pressure" / std::string(resource),
          fmt::format("some avg10={:.2f} avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 "
                      "total=0\n",
                      some_avg10));
  }

  static std::string read(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static void write(const std::filesystem::path& path, std::string_view text) {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  }

 private:
  static std::string join(const std::vector<std::string>& v, const char* sep) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
    return out;
  }
  // mountinfo's octal escapes of space, tab, newline and backslash.
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == ' ' || c == '\t' || c == '\n' || c == '\\') {
        out += fmt::format("\\{:03o}", static_cast<unsigned char>(c));
      } else {
        out += c;
      }
    }
    return out;
  }
  const FakeMount& find(std::string_view dir) const {
    for (const FakeMount& m : mounts_) {
      if (m.dir == dir) return m;
    }
    std::abort();  // a test names a mount it did not make
  }
  std::string own_of(const FakeMount& m) const { return m.own.empty() ? own_ : m.own; }

  // The control files of a cgroup, by the kernel's names and first values.
  // `controllers`: v1, the mount's; v2, those the parent hands down.
  static std::vector<std::pair<std::string, std::string>> files(bool v2, const std::vector<std::string>& controllers) {
    std::vector<std::pair<std::string, std::string>> f = {{"cgroup.procs", ""}};
    const std::string psi =
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    auto on = [&](const char* c) { return std::ranges::find(controllers, c) != controllers.end(); };
    if (v2) {
      // cpu.stat has the throttling keys only where the cpu controller is on.
      const std::string cpu_stat = on("cpu") ? "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\n"
                                               "nr_throttled 0\nthrottled_usec 0\n"
                                             : "usage_usec 0\nuser_usec 0\nsystem_usec 0\n";
      f.insert(f.end(), {{"cgroup.controllers", join(controllers, " ") + "\n"},
                         {"cgroup.subtree_control", "\n"},
                         {"cgroup.events", "populated 0\nfrozen 0\n"},
                         {"cgroup.freeze", "0\n"},
                         {"cgroup.kill", ""},
                         {"cgroup.threads", ""},
                         {"cgroup.type", "domain\n"},
                         {"cpu.stat", cpu_stat},
                         {"cpu.pressure", psi},
                         {"io.pressure", psi},
                         {"memory.pressure", psi}});
      if (on("cpu")) f.insert(f.end(), {{"cpu.weight", "100\n"}, {"cpu.max", "max 100000\n"}});
      if (on("cpuset")) f.insert(f.end(), {{"cpuset.cpus", "\n"}, {"cpuset.mems", "\n"}});
      if (on("memory")) {
        f.insert(f.end(), {{"memory.current", "0\n"},
                           {"memory.peak", "0\n"},
                           {"memory.high", "max\n"},
                           {"memory.max", "max\n"},
                           {"memory.low", "0\n"},
                           {"memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"}});
      }
      if (on("pids")) f.insert(f.end(), {{"pids.max", "max\n"}, {"pids.current", "0\n"}});
      return f;
    }
    f.emplace_back("tasks", "");
    if (on("cpu")) {
      f.insert(f.end(), {{"cpu.shares", "1024\n"},
                         {"cpu.cfs_quota_us", "-1\n"},
                         {"cpu.cfs_period_us", "100000\n"},
                         {"cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n"}});
    }
    if (on("cpuacct")) f.emplace_back("cpuacct.usage", "0\n");
    if (on("cpuset")) f.insert(f.end(), {{"cpuset.cpus", "\n"}, {"cpuset.mems", "\n"}});
    if (on("memory")) {
      f.insert(f.end(), {{"memory.limit_in_bytes", "9223372036854771712\n"},
                         {"memory.usage_in_bytes", "0\n"},
                         {"memory.max_usage_in_bytes", "0\n"},
                         {"memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"}});
    }
    if (on("pids")) f.insert(f.end(), {{"pids.max", "max\n"}, {"pids.current", "0\n"}});
    if (on("freezer")) f.emplace_back("freezer.state", "THAWED\n");
    return f;
  }
  static void populate_dir(const FakeMount& m, const std::filesystem::path& dir,
                           const std::vector<std::string>& controllers) {
    for (const auto& [name, text] : files(m.v2, controllers)) write(dir / name, text);
  }

  base::Result<void> made(const cpu::Hierarchy& h, int dir) const {
    const FakeMount* mount = nullptr;
    for (const FakeMount& m : mounts_) {
      if ((root_ / m.dir).string() == h.mount_point) mount = &m;
    }
    if (mount == nullptr) return base::make_error(EINVAL, fmt::format("fake cgroupfs: no mount {}", h.mount_point));
    std::vector<std::string> controllers = mount->controllers;
    if (mount->v2) {
      // What the parent's cgroup.subtree_control hands down ("+cpu" as written, "cpu" as the fixture set it).
      controllers.clear();
      base::UniqueFd parent(::openat(dir, "..", O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!parent) return base::errno_error("fake cgroupfs: open ..");
      auto text = cpu::read_file(parent.get(), "cgroup.subtree_control");
      if (!text) return base::propagate(std::move(text.error()), "fake cgroupfs");
      for (std::string_view w : base::split(base::trim(*text), ' ', true)) {
        if (w.front() == '-') continue;
        if (w.front() == '+') w.remove_prefix(1);
        controllers.emplace_back(w);
      }
    }
    for (const auto& [name, text] : files(mount->v2, controllers)) {
      base::UniqueFd fd(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (!fd) return base::errno_error(fmt::format("fake cgroupfs: create {}", name));
      if (!text.empty() && ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        return base::errno_error(fmt::format("fake cgroupfs: write {}", name));
      }
    }
    return {};
  }
  // The kernel's side of a write(2) to control file `name` (TreeHooks::write).
  static base::Result<void> kernel_write(int dir, const char* name, std::string_view value) {
    base::UniqueFd fd(::openat(dir, name, O_WRONLY | O_CLOEXEC));  // a missing file: ENOENT, as on cgroupfs
    if (!fd) return base::errno_error(fmt::format("open {}", name));
    auto old = cpu::read_file(dir, name);
    if (!old) return base::propagate(std::move(old.error()));
    auto words = [](std::string_view text) {
      std::set<std::string> out;
      for (std::string_view w : base::split(base::trim(text), ' ', true)) out.emplace(w);
      return out;
    };
    const std::string_view file(name);
    std::string text(value);
    if (file == "cgroup.subtree_control") {
      auto available = cpu::read_file(dir, "cgroup.controllers");
      if (!available) return base::propagate(std::move(available.error()));
      const std::set<std::string> can = words(*available);
      std::set<std::string> on = words(*old);
      for (std::string_view w : base::split(base::trim(value), ' ', true)) {
        const std::string c(w.substr(1));
        if (w.front() == '+' && can.contains(c)) {
          on.insert(c);
        } else if (w.front() == '-') {
          on.erase(c);
        } else {
          return base::make_error(w.front() == '+' ? ENOENT : EINVAL, fmt::format("write '{}' to {}", value, name));
        }
      }
      text.clear();
      for (const char* c : {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}) {
        if (on.contains(c)) text += fmt::format("{}{}", text.empty() ? "" : " ", c);
      }
      text += "\n";
    } else if (file == "memory.oom_control") {
      text.clear();
      for (std::string_view line : base::split(*old, '\n', true)) {
        text += line.starts_with("oom_kill_disable ") ? fmt::format("oom_kill_disable {}", base::trim(value))
                                                      : std::string(line);
        text += "\n";
      }
    } else if (file == "cgroup.procs" || file == "tasks") {
      const std::string pid = base::trim(value) == "0" ? std::to_string(::getpid()) : std::string(base::trim(value));
      text = *old + pid + "\n";
    }
    if (::ftruncate(fd.get(), 0) != 0 ||
        ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      return base::errno_error(fmt::format("write '{}' to {}", value, name));
    }
    return {};
  }
  static void removing(const std::string& path) {
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      if (e.is_directory()) return;  // child cgroups: rmdir fails
      files.push_back(e.path());
    }
    if (ec) return;
    if (!base::trim(read(std::filesystem::path(path) / "cgroup.procs")).empty()) return;  // busy
    for (const auto& f : files) std::filesystem::remove(f, ec);
  }

  std::vector<FakeMount> mounts_;
  std::string own_;
  std::filesystem::path root_;
  std::string mountinfo_;
  std::string self_cgroup_;
};

}  // namespace tandem::testing
