// tandemd.toml → Config: the parser (validate(), compile() and reload_plan()
// are in daemon/config_check.cc).
//
// The parser walks the TOML tree table by table; each table has an explicit
// list of the keys it takes, so an unknown one is reported with the known
// ones. Type and range errors are found while walking (a value must be range
// checked before it is narrowed to its field); checks that only need the
// struct (paths, names, powers of two, the policy and its parameters) live in
// validate(), which also guards a Config built in code. The first error wins.
#include "daemon/config.h"
#include "daemon/config_keys.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <ranges>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "base/parse.h"
#include "base/unique_fd.h"

namespace tandem::daemon {
namespace {

using namespace config_keys;  // NOLINT(google-build-using-namespace): the tables this parser walks

std::string_view type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::none:
      return "nothing";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
  }
  return "an unknown type";
}

// "1000" is an id; "alice" is a name.
std::optional<std::int64_t> as_decimal(std::string_view s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  std::int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// getpwnam_r / getgrnam_r with a buffer that grows on ERANGE. Returns 0 and
// sets `found` (false for an unknown name), or an errno value.
template <class Entry, class IdT>
int lookup(int (*fn)(const char*, Entry*, char*, std::size_t, Entry**), IdT Entry::*id_field, const std::string& name,
           bool& found, IdT& id) {
  long hint = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::size_t size = hint > 0 ? static_cast<std::size_t>(hint) : 1024;
  for (;;) {
    std::vector<char> buf(size);
    Entry entry{};
    Entry* result = nullptr;
    int rc = fn(name.c_str(), &entry, buf.data(), buf.size(), &result);
    if (rc == ERANGE && size < (std::size_t{1} << 24)) {
      size *= 2;
      continue;
    }
    // Several libcs report "no such entry" as ENOENT, ESRCH, EBADF or EPERM
    // rather than rc 0 with a null result (getpwnam_r(3)).
    if (rc == 0 || rc == ENOENT || rc == ESRCH || rc == EBADF || rc == EPERM) {
      found = rc == 0 && result != nullptr;
      if (found) id = result->*id_field;
      return 0;
    }
    return rc;
  }
}

// Walks the TOML tree into a Config. Methods return false after recording
// the first error. Thread-safety: single use, one thread.
class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

  // `tandemctl policy set`: a one-key [policy] table through policy().
  base::Result<void> set_policy(const toml::table& policy_table, Config& config) {
    if (!policy(policy_table, config)) return base::propagate(std::move(*error_));
    return {};
  }

  base::Result<Config> run(std::string_view text) {
    toml::table root;
    try {
      root = toml::parse(text, source_);
    } catch (const toml::parse_error& e) {
      return base::make_error(EINVAL, fmt::format("{}: line {}, column {}: TOML syntax error: {}", source_,
                                                  e.source().begin.line, e.source().begin.column, e.description()));
    }
    Config config;
    config.source = std::string(source_);
    if (!top(root, config)) return base::propagate(std::move(*error_));
    if (auto ok = validate(config); !ok) return base::propagate(std::move(ok.error()));
    return config;
  }

 private:
  bool fail(std::string_view key, std::string_view problem, int code = EINVAL) {
    if (!error_) error_.emplace(code, fmt::format("{}: {}: {}", source_, key, problem));
    return false;
  }

  bool wrong_type(std::string_view key, const toml::node& n, std::string_view expected) {
    return fail(key, fmt::format("expected {}, got {}", expected, type_name(n)));
  }

  bool unknown(std::string_view key, const toml::node& n, std::string_view known) {
    return fail(key, fmt::format("unknown {} (known: {})", n.is_table() ? "table" : "key", known));
  }

  const toml::table* table(const toml::node& n, std::string_view key) {
    const toml::table* t = n.as_table();
    if (t == nullptr) wrong_type(key, n, "a table");
    return t;
  }

  bool string(const toml::node& n, std::string_view key, std::string& out) {
    const auto* v = n.as_string();
    if (v == nullptr) return wrong_type(key, n, "a string");
    out = v->get();
    return true;
  }

  bool boolean(const toml::node& n, std::string_view key, bool& out) {
    const auto* v = n.as_boolean();
    if (v == nullptr) return wrong_type(key, n, "a boolean");
    out = v->get();
    return true;
  }

  bool integer(const toml::node& n, std::string_view key, std::int64_t min, std::int64_t max, std::int64_t& out) {
    const auto* v = n.as_integer();
    if (v == nullptr) return wrong_type(key, n, "an integer");
    if (v->get() < min || v->get() > max) return fail(key, range_problem(min, max, v->get()));
    out = v->get();
    return true;
  }

  template <class S, std::size_t N>
  bool uint_table(const toml::node& n, std::string_view path, const UintKey<S> (&keys)[N], S& out) {
    const toml::table* t = table(n, path);
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      std::string key = dotted(path, k.str());
      const auto* spec = std::ranges::find(keys, k.str(), &UintKey<S>::name);
      if (spec == std::end(keys)) return unknown(key, v, join_keys(keys));
      std::int64_t value = 0;
      if (!integer(v, key, spec->min, spec->max, value)) return false;
      out.*(spec->field) = static_cast<std::uint32_t>(value);
    }
    return true;
  }

  bool top(const toml::table& root, Config& c) {
    for (auto&& [k, v] : root) {
      std::string_view key = k.str();
      bool ok = true;
      if (key == "runtime_dir") {
        ok = string(v, key, c.runtime_dir);
      } else if (key == "log_level") {
        ok = string(v, key, c.log_level);
      } else if (key == "policy") {
        ok = policy(v, c);
      } else if (key == "roles") {
        ok = roles(v, c);
      } else if (key == "limits") {
        ok = uint_table(v, key, kLimitKeys, c.limits);
      } else if (key == "ipc") {
        ok = uint_table(v, key, kIpcKeys, c);
      } else if (key == "cgroups" || key == "tools" || key == "memory" || key == "telemetry") {
        ok = host(v, key, c.host);
      } else if (key == "metrics") {
        ok = metrics(v, c);
      } else if (key == "nvml") {
        ok = nvml(v, c.nvml);
      } else if (key == "kv_events") {
        ok = kv_events(v, c.kv_events);
      } else if (key == "gpu") {
        ok = gpu(v, c.gpu);
      } else {
        ok = unknown(key, v, join(kTopKeys));
      }
      if (!ok) return false;
    }
    return true;
  }

  bool policy(const toml::node& n, Config& c) {
    const toml::table* t = table(n, "policy");
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      std::string key = dotted("policy", k.str());
      bool ok = true;
      if (k.str() == "name") {
        ok = string(v, key, c.policy);
      } else if (k.str() == "tick_ms") {
        std::int64_t ms = 0;
        ok = integer(v, key, kMinTickMs, kMaxTickMs, ms);
        if (ok) c.tick = std::chrono::milliseconds(ms);
      } else if (k.str() == "params") {
        ok = params(v, key, c.policy_params);
      } else {
        ok = unknown(key, v, join(kPolicyKeys));
      }
      if (!ok) return false;
    }
    return true;
  }

  // Values only; which names and ranges are allowed depends on the policy,
  // which validate() checks once the whole [policy] table is read.
  bool params(const toml::node& n, std::string_view path, std::map<std::string, double>& out) {
    const toml::table* t = table(n, path);
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      std::string key = dotted(path, k.str());
      double value = 0;
      if (const auto* i = v.as_integer()) {
        value = static_cast<double>(i->get());
      } else if (const auto* f = v.as_floating_point()) {
        value = f->get();
      } else if (const auto* b = v.as_boolean()) {
        value = b->get() ? 1.0 : 0.0;  // switches are 0/1 parameters
      } else {
        return wrong_type(key, v, "a number or a boolean");
      }
      out[std::string(k.str())] = value;
    }
    return true;
  }

  bool roles(const toml::node& n, Config& c) {
    const toml::table* t = table(n, "roles");
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      std::string key = dotted("roles", k.str());
      const auto* name = std::ranges::find(kRoleNames, k.str());
      if (name == std::end(kRoleNames)) {
        return fail(key, fmt::format("unknown role (known: {})", join(kRoleNames)));
      }
      if (!grant(v, key, c.roles[static_cast<std::size_t>(name - std::begin(kRoleNames))])) return false;
    }
    return true;
  }

  bool grant(const toml::node& n, std::string_view path, RoleGrant& out) {
    const toml::table* t = table(n, path);
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      std::string key = dotted(path, k.str());
      bool ok = true;
      if (k.str() == "anyone") {
        ok = boolean(v, key, out.anyone);
      } else if (k.str() == "uids") {
        ok = ids(v, key, /*users=*/true, out.uids);
      } else if (k.str() == "gids") {
        ok = ids(v, key, /*users=*/false, out.gids);
      } else {
        ok = unknown(key, v, join(kGrantKeys));
      }
      if (!ok) return false;
    }
    return true;
  }

  bool size(const toml::node& n, std::string_view key, std::uint64_t& out) {
    if (const auto* i = n.as_integer()) {
      if (i->get() < 0) return fail(key, fmt::format("must not be negative, got {}", i->get()));
      out = static_cast<std::uint64_t>(i->get());
      return true;
    }
    const auto* str = n.as_string();
    if (str == nullptr) return wrong_type(key, n, "a byte count (an integer, or a string like \"512M\")");
    auto v = base::parse_size(str->get());
    if (!v) return fail(key, v.error().context());
    out = *v;
    return true;
  }

  bool duration(const toml::node& n, std::string_view key, base::Duration& out) {
    const auto* str = n.as_string();
    if (str == nullptr) return wrong_type(key, n, "a duration string like \"30s\"");
    auto v = base::parse_duration(str->get());
    if (!v) return fail(key, v.error().context());
    out = *v;
    return true;
  }

  bool number(const toml::node& n, std::string_view key, double& out) {
    if (const auto* i = n.as_integer()) {
      out = static_cast<double>(i->get());
    } else if (const auto* f = n.as_floating_point()) {
      out = f->get();
    } else {
      return wrong_type(key, n, "a number");
    }
    return true;
  }

  template <std::size_t N>
  bool one_of(const toml::node& n, std::string_view key, const std::string_view (&allowed)[N], std::string& out) {
    if (!string(n, key, out)) return false;
    if (std::ranges::find(allowed, out) == std::end(allowed)) {
      return fail(key, fmt::format("must be one of {}, got '{}'", join(allowed), out));
    }
    return true;
  }

  bool metrics(const toml::node& n, Config& c) {
    const toml::table* t = table(n, "metrics");
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      const std::string key = dotted("metrics", k.str());
      if (k.str() == "listen") {
        if (!string(v, key, c.metrics_listen)) return false;
      } else if (k.str() == "allow_remote") {
        if (!boolean(v, key, c.metrics_allow_remote)) return false;
      } else if (k.str() == "engines") {
        const toml::table* engines = table(v, key);
        if (engines == nullptr) return false;
        c.metrics_engines.clear();
        for (auto&& [name, address] : *engines) {
          // The name is checked (as a client name) in validate().
          if (!string(address, dotted(key, name.str()), c.metrics_engines[std::string(name.str())])) return false;
        }
      } else {
        return unknown(key, v, join(kMetricsKeys));
      }
    }
    return true;
  }

  // [gpu]: ranges are checked here (before narrowing) and in validate().
  bool gpu(const toml::node& n, GpuConfig& g) {
    const toml::table* t = table(n, "gpu");
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      const std::string key = dotted("gpu", k.str());
      const std::string_view name = k.str();
      std::int64_t i = 0;
      bool ok = true;
      if (name == "sm_min") {
        ok = integer(v, key, 1, 1024, i);
        g.sm_min = static_cast<std::uint32_t>(i);
      } else if (name == "grow_hold") {
        ok = integer(v, key, 1, 1000, i);
        g.grow_hold = static_cast<std::uint32_t>(i);
      } else if (name == "hold") {
        ok = integer(v, key, 1, 100000, i);
        g.hold = static_cast<std::uint32_t>(i);
      } else if (name == "alpha") {
        ok = number(v, key, g.alpha);
      } else if (name == "link_bytes_per_s") {
        ok = number(v, key, g.link_bytes_per_s);
      } else if (name == "offload_pressure") {
        ok = number(v, key, g.offload_pressure);
      } else if (name == "restore_pressure") {
        ok = number(v, key, g.restore_pressure);
      } else if (name == "allow_slowdown") {
        ok = boolean(v, key, g.allow_slowdown);
      } else {
        ok = unknown(key, v, join(kGpuKeys));
      }
      if (!ok) return false;
    }
    return true;
  }

  bool kv_events(const toml::node& n, KvEventsConfig& out) {
    const toml::table* t = table(n, "kv_events");
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      const std::string key = dotted("kv_events", k.str());
      bool ok = true;
      if (k.str() == "endpoint") {
        ok = string(v, key, out.endpoint);
      } else if (k.str() == "connect") {
        ok = boolean(v, key, out.connect);
      } else if (k.str() == "topic") {
        ok = string(v, key, out.topic);
      } else if (k.str() == "hwm") {
        std::int64_t hwm = 0;
        ok = integer(v, key, 1, kMaxKvEventsHwm, hwm);
        if (ok) out.hwm = static_cast<std::uint32_t>(hwm);
      } else {
        ok = unknown(key, v, join(kKvEventsKeys));
      }
      if (!ok) return false;
    }
    return true;
  }

  bool nvml(const toml::node& n, NvmlConfig& out) {
    const toml::table* t = table(n, "nvml");
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      const std::string key = dotted("nvml", k.str());
      bool ok = true;
      if (k.str() == "enabled") {
        ok = one_of(v, key, kNvmlModes, out.enabled);
      } else if (k.str() == "interval_ms") {
        std::int64_t ms = 0;
        ok = integer(v, key, kMinNvmlIntervalMs, kMaxNvmlIntervalMs, ms);
        if (ok) out.interval_ms = static_cast<std::uint32_t>(ms);
      } else if (k.str() == "library") {
        ok = string(v, key, out.library);
      } else {
        ok = unknown(key, v, join(kNvmlKeys));
      }
      if (!ok) return false;
    }
    return true;
  }

  bool strings(const toml::node& n, std::string_view key, std::vector<std::string>& out) {
    const toml::array* a = n.as_array();
    if (a == nullptr) return wrong_type(key, n, "an array of strings");
    out.clear();
    for (std::size_t i = 0; i < a->size(); ++i) {
      std::string s;
      if (!string(*a->get(i), fmt::format("{}[{}]", key, i), s)) return false;
      out.push_back(std::move(s));
    }
    return true;
  }

  // [cgroups], [tools], [memory], [telemetry].
  bool host(const toml::node& n, std::string_view table_name, HostConfig& h) {
    const toml::table* t = table(n, table_name);
    if (t == nullptr) return false;
    for (auto&& [k, v] : *t) {
      const std::string key = dotted(table_name, k.str());
      const std::string_view name = k.str();
      bool ok = true;
      if (table_name == "cgroups") {
        if (name == "mode") {
          ok = one_of(v, key, kCgroupModes, h.cgroups);
        } else if (name == "subtree") {
          ok = string(v, key, h.subtree);
        } else if (name == "root") {
          ok = string(v, key, h.root);
        } else if (name == "on_restart") {
          ok = one_of(v, key, kRestartModes, h.on_restart);
        } else if (name == "adopt_grace") {
          ok = duration(v, key, h.adopt_grace);
        } else if (name == "engine_cpus") {
          ok = string(v, key, h.engine_cpus);
        } else if (name == "tool_cpus") {
          ok = string(v, key, h.tool_cpus);
        } else {
          ok = unknown(key, v, join(kCgroupKeys));
        }
      } else if (table_name == "tools") {
        std::int64_t pct = 0;  // an integer key's value
        if (name == "memory_high") {
          ok = size(v, key, h.memory_high);
        } else if (name == "memory_max") {
          ok = size(v, key, h.memory_max);
        } else if (name == "pids_max") {
          ok = size(v, key, h.pids_max);
        } else if (name == "cpu_max_percent") {
          ok = integer(v, key, 0, 100000, pct);
          h.cpu_max_percent = static_cast<std::uint32_t>(pct);
        } else if (name == "bubblewrap") {
          ok = string(v, key, h.bubblewrap);
        } else if (name == "bubblewrap_args") {
          ok = strings(v, key, h.bubblewrap_args);
        } else if (name == "pool_max") {
          ok = integer(v, key, 0, kMaxPool, pct);
          h.pool_max = static_cast<std::uint32_t>(pct);
        } else if (name == "pool_per_session") {
          ok = integer(v, key, 1, kMaxPoolPerSession, pct);
          h.pool_per_session = static_cast<std::uint32_t>(pct);
        } else if (name == "pool_idle") {
          ok = duration(v, key, h.pool_idle);
        } else if (name == "ahead") {
          ok = boolean(v, key, h.ahead);
        } else {
          ok = unknown(key, v, join(kToolKeys));
        }
      } else if (table_name == "memory") {
        if (name == "pressure_high") {
          ok = number(v, key, h.pressure_high);
        } else if (name == "pressure_critical") {
          ok = number(v, key, h.pressure_critical);
        } else if (name == "tools_budget") {
          ok = size(v, key, h.tools_budget);
        } else if (name == "stall_kill_after") {
          ok = duration(v, key, h.stall_kill_after);
        } else if (name == "protect_low") {
          ok = size(v, key, h.protect_low);
        } else {
          ok = unknown(key, v, join(kMemoryKeys));
        }
      } else {
        if (name == "mode") {
          ok = one_of(v, key, kTelemetryModes, h.telemetry);
        } else {
          ok = unknown(key, v, join(kTelemetryKeys));
        }
      }
      if (!ok) return false;
    }
    return true;
  }

  // uid_t and gid_t are both 32-bit unsigned on Linux; one routine serves both.
  static_assert(std::is_same_v<uid_t, gid_t>);

  bool ids(const toml::node& n, std::string_view path, bool users, std::vector<uid_t>& out) {
    const toml::array* a = n.as_array();
    if (a == nullptr) return wrong_type(path, n, "an array");
    std::string_view what = users ? "user" : "group";
    out.clear();
    for (std::size_t i = 0; i < a->size(); ++i) {
      const toml::node& el = *a->get(i);
      std::string key = fmt::format("{}[{}]", path, i);
      std::int64_t id = 0;
      if (el.is_integer()) {
        if (!integer(el, key, 0, kMaxId, id)) return false;
      } else if (const auto* str = el.as_string()) {
        if (auto dec = as_decimal(str->get())) {
          if (*dec > kMaxId) return fail(key, range_problem(0, kMaxId, *dec));
          id = *dec;
        } else if (!resolve(str->get(), users, key, id)) {
          return false;
        }
      } else {
        return wrong_type(key, el, fmt::format("a {} id or name", what));
      }
      out.push_back(static_cast<uid_t>(id));
    }
    return true;
  }

  bool resolve(const std::string& name, bool users, std::string_view key, std::int64_t& id) {
    bool found = false;
    int rc = 0;
    if (users) {
      uid_t uid = 0;
      rc = lookup(getpwnam_r, &passwd::pw_uid, name, found, uid);
      id = uid;
    } else {
      gid_t gid = 0;
      rc = lookup(getgrnam_r, &group::gr_gid, name, found, gid);
      id = gid;
    }
    std::string_view what = users ? "user" : "group";
    if (rc != 0) return fail(key, fmt::format("cannot look up {} '{}': {}", what, name, std::strerror(rc)), rc);
    if (!found) return fail(key, fmt::format("unknown {} '{}'", what, name));
    return true;
  }

  std::string_view source_;
  std::optional<base::Error> error_;
};

}  // namespace

base::Result<Config> parse_config(std::string_view text, std::string_view source) { return Parser(source).run(text); }

base::Result<Config> load_config(const std::string& path) {
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return base::errno_error(fmt::format("read config {}", path));
  std::string text;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::errno_error(fmt::format("read config {}", path));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxFileBytes) {
      return base::make_error(EFBIG, fmt::format("read config {}: larger than {} bytes", path, kMaxFileBytes));
    }
  }
  return parse_config(text, path);
}

base::Result<void> set_policy_key(Config& config, std::string_view key, std::string_view value) {
  // The value as the file would have it (a number, true/false, else a
  // string): the parser's tables judge its type and range.
  const auto put = [](toml::table& t, const std::string& k, std::string_view v) {
    if (v == "true" || v == "false") {
      t.insert(k, v == "true");
    } else if (auto i = base::parse_int<std::int64_t>(v)) {
      t.insert(k, *i);
    } else if (auto d = base::parse_double(v)) {
      t.insert(k, *d);
    } else {
      t.insert(k, std::string(v));
    }
  };
  toml::table policy;
  if (key == "name") {
    policy.insert("name", std::string(value));
  } else if (key == "tick_ms") {
    put(policy, "tick_ms", value);
  } else if (key == "params") {
    return base::make_error(EINVAL, "policy set: policy.params is a table: set one parameter by its name");
  } else {
    toml::table params;
    put(params, std::string(key), value);
    policy.insert("params", std::move(params));
  }
  Config next = config;
  if (key == "name" && value != next.policy) next.policy_params.clear();  // the old policy's parameters mean nothing
  if (auto ok = Parser("policy set").set_policy(policy, next); !ok) return ok;
  config = std::move(next);
  return {};
}

}  // namespace tandem::daemon
