#include "cpu/parse.h"

#include <span>

#include <fmt/format.h>

#include "base/parse.h"

namespace tandem::cpu {
namespace {

base::Result<PsiLine> parse_psi_fields(std::string_view kind, std::span<const std::string_view> fields,
                                       std::string_view line) {
  PsiLine out;
  bool seen[4] = {false, false, false, false};
  for (std::string_view f : fields) {
    const auto eq = f.find('=');
    if (eq == std::string_view::npos) {
      return base::make_error(EINVAL, fmt::format("pressure: '{}' in '{}' is not key=value", f, line));
    }
    const std::string_view key = f.substr(0, eq);
    const std::string_view value = f.substr(eq + 1);
    if (key == "total") {
      auto v = base::parse_int<std::uint64_t>(value);
      if (!v) return base::propagate(std::move(v.error()), fmt::format("pressure: {} total", kind));
      out.total_us = *v;
      seen[3] = true;
      continue;
    }
    double* slot = key == "avg10" ? &out.avg10 : key == "avg60" ? &out.avg60 : key == "avg300" ? &out.avg300 : nullptr;
    if (slot == nullptr) continue;  // a field a newer kernel added
    auto v = base::parse_double(value);
    if (!v || *v < 0.0 || *v > 100.0) {
      return base::make_error(EINVAL, fmt::format("pressure: {} {} is not a percentage: '{}'", kind, key, value));
    }
    *slot = *v;
    seen[key == "avg10" ? 0 : key == "avg60" ? 1 : 2] = true;
  }
  for (bool s : seen) {
    if (!s) return base::make_error(EINVAL, fmt::format("pressure: '{}' lacks avg10, avg60, avg300 or total", line));
  }
  return out;
}

// Counters of a "key value" file: `set(key, value)` for each line.
template <class Set>
base::Result<void> for_each_counter(std::string_view file, std::string_view text, Set&& set) {
  auto pairs = base::parse_key_values(text);
  if (!pairs) return base::propagate(std::move(pairs.error()), file);
  for (const auto& [key, value] : *pairs) {
    auto v = base::parse_int<std::uint64_t>(value);
    if (!v) return base::propagate(std::move(v.error()), fmt::format("{}: {}", file, key));
    set(key, *v);
  }
  return {};
}

}  // namespace

base::Result<Psi> parse_psi(std::string_view text) {
  Psi out;
  bool some = false;
  for (std::string_view line : base::split(text, '\n', /*skip_empty=*/true)) {
    const auto fields = base::split(base::trim(line), ' ', /*skip_empty=*/true);
    if (fields.empty()) continue;
    const std::string_view kind = fields[0];
    if (kind != "some" && kind != "full") {
      return base::make_error(EINVAL, fmt::format("pressure: line '{}' is neither 'some' nor 'full'", line));
    }
    auto parsed = parse_psi_fields(kind, std::span(fields).subspan(1), line);
    if (!parsed) return base::propagate(std::move(parsed.error()));
    if (kind == "some") {
      out.some = *parsed;
      some = true;
    } else {
      out.full = *parsed;
    }
  }
  if (!some) return base::make_error(EINVAL, "pressure: no 'some' line");
  return out;
}

base::Result<CpuStat> parse_cpu_stat(std::string_view text) {
  CpuStat out;
  auto r = for_each_counter("cpu.stat", text, [&](std::string_view key, std::uint64_t v) {
    if (key == "usage_usec") out.usage_us = v;
    if (key == "user_usec") out.user_us = v;
    if (key == "system_usec") out.system_us = v;
    if (key == "nr_periods") out.nr_periods = v;
    if (key == "nr_throttled") out.nr_throttled = v;
    if (key == "throttled_usec") out.throttled_us = v;
    if (key == "throttled_time") out.throttled_us = v / 1000;  // v1: nanoseconds
  });
  if (!r) return base::propagate(std::move(r.error()));
  return out;
}

base::Result<std::uint64_t> parse_cpuacct_usage_ns(std::string_view text) {
  auto v = base::parse_int<std::uint64_t>(base::trim(text));
  if (!v) return base::propagate(std::move(v.error()), "cpuacct.usage");
  return *v;
}

base::Result<MemoryEvents> parse_memory_events(std::string_view text) {
  MemoryEvents out;
  auto r = for_each_counter("memory.events", text, [&](std::string_view key, std::uint64_t v) {
    if (key == "low") out.low = v;
    if (key == "high") out.high = v;
    if (key == "max") out.max = v;
    if (key == "oom") out.oom = v;
    if (key == "oom_kill") out.oom_kill = v;
  });
  if (!r) return base::propagate(std::move(r.error()));
  return out;
}

base::Result<CpuMax> parse_cpu_max(std::string_view text) {
  const auto fields = base::split(base::trim(text), ' ', /*skip_empty=*/true);
  if (fields.size() != 2) return base::make_error(EINVAL, fmt::format("cpu.max: '{}' is not 'MAX PERIOD'", text));
  CpuMax out;
  if (fields[0] != "max") {
    auto q = base::parse_int<std::uint64_t>(fields[0]);
    if (!q) return base::propagate(std::move(q.error()), "cpu.max quota");
    out.quota_us = *q;
  }
  auto p = base::parse_int<std::uint64_t>(fields[1]);
  if (!p || *p == 0) return base::make_error(EINVAL, fmt::format("cpu.max: bad period '{}'", fields[1]));
  out.period_us = *p;
  return out;
}

base::Result<std::string> format_cpu_max(const CpuMax& value) {
  constexpr std::uint64_t kMin = 1000;
  constexpr std::uint64_t kMaxPeriod = 1'000'000;
  if (value.period_us < kMin || value.period_us > kMaxPeriod) {
    return base::make_error(
        EINVAL, fmt::format("cpu.max: period {} µs is outside [{}, {}]", value.period_us, kMin, kMaxPeriod));
  }
  if (!value.quota_us) return fmt::format("max {}", value.period_us);
  if (*value.quota_us < kMin) {
    return base::make_error(EINVAL,
                            fmt::format("cpu.max: quota {} µs is below the kernel's {}", *value.quota_us, kMin));
  }
  return fmt::format("{} {}", *value.quota_us, value.period_us);
}

base::Result<std::vector<CgroupMembership>> parse_proc_cgroup(std::string_view text) {
  std::vector<CgroupMembership> out;
  for (std::string_view line : base::split(text, '\n', /*skip_empty=*/true)) {
    const auto first = line.find(':');
    const auto second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) {
      return base::make_error(EINVAL, fmt::format("/proc/<pid>/cgroup: '{}' is not 'ID:CONTROLLERS:PATH'", line));
    }
    CgroupMembership m;
    auto id = base::parse_int<unsigned>(line.substr(0, first));
    if (!id) return base::propagate(std::move(id.error()), "/proc/<pid>/cgroup hierarchy id");
    m.hierarchy = *id;
    for (std::string_view c : base::split(line.substr(first + 1, second - first - 1), ',', true)) {
      m.controllers.emplace_back(c);
    }
    m.path = std::string(line.substr(second + 1));  // a path may itself contain ':'
    if (m.path.empty() || m.path[0] != '/') {
      return base::make_error(EINVAL, fmt::format("/proc/<pid>/cgroup: path '{}' is not absolute", m.path));
    }
    out.push_back(std::move(m));
  }
  return out;
}

base::Result<OomControl> parse_oom_control(std::string_view text) {
  OomControl out;
  auto done = for_each_counter("memory.oom_control", text, [&](std::string_view key, std::uint64_t v) {
    if (key == "oom_kill_disable") out.oom_kill_disable = v != 0;
    if (key == "under_oom") out.under_oom = v != 0;
    if (key == "oom_kill") out.oom_kill = v;
  });
  if (!done) return base::propagate(std::move(done.error()));
  return out;
}

base::Result<std::vector<int>> parse_pids(std::string_view text) {
  std::vector<int> out;
  for (std::string_view line : base::split(text, '\n', /*skip_empty=*/true)) {
    auto pid = base::parse_int<int>(base::trim(line));
    if (!pid || *pid <= 0) return base::make_error(EINVAL, fmt::format("cgroup.procs: '{}' is not a pid", line));
    out.push_back(*pid);
  }
  return out;
}

namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo (octal).
std::string unescape_mount_field(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && s.size() - i >= 4) {
      const auto d = s.substr(i + 1, 3);
      if (d[0] >= '0' && d[0] <= '3' && d[1] >= '0' && d[1] <= '7' && d[2] >= '0' && d[2] <= '7') {
        out.push_back(static_cast<char>((d[0] - '0') * 64 + (d[1] - '0') * 8 + (d[2] - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

base::Result<std::vector<CgroupMount>> parse_mountinfo(std::string_view text) {
  std::vector<CgroupMount> out;
  for (std::string_view line : base::split(text, '\n', /*skip_empty=*/true)) {
    const auto fields = base::split(base::trim(line), ' ', /*skip_empty=*/true);
    // id parent maj:min root mount-point options [optional...] - fstype source super-options
    std::size_t dash = 0;
    for (std::size_t i = 6; i < fields.size(); ++i) {
      if (fields[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || dash + 2 >= fields.size()) {
      return base::make_error(EINVAL, fmt::format("mountinfo: malformed line '{}'", line));
    }
    const std::string_view fstype = fields[dash + 1];
    if (fstype != "cgroup" && fstype != "cgroup2") continue;
    CgroupMount m;
    m.v2 = fstype == "cgroup2";
    m.root = unescape_mount_field(fields[3]);
    m.mount_point = unescape_mount_field(fields[4]);
    if (dash + 3 < fields.size()) {
      for (std::string_view opt : base::split(fields[dash + 3], ',', /*skip_empty=*/true)) {
        if (opt == "favordynmods") m.favordynmods = true;
        if (m.v2) continue;
        if (opt == "rw" || opt == "ro" || opt.starts_with("release_agent=") || opt == "noprefix" ||
            opt == "clone_children" || opt == "xattr" || opt == "cpuset_v2_mode" || opt == "favordynmods") {
          continue;
        }
        m.controllers.emplace_back(opt);
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace tandem::cpu
