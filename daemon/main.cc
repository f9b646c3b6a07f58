// tandemd: the node's resource manager for agentic LLM inference.
//
//   tandemd [--config FILE] [--runtime-dir DIR] [--policy NAME] [--log-level L]
//   tandemd --check-config [--config FILE]
//
// Runs in the foreground, unprivileged if need be (tests and the demo use
// --runtime-dir in a temporary directory). Under systemd (Type=notify-reload)
// it reports READY / RELOADING / STOPPING / WATCHDOG with sd_notify. Logs go
// to stderr with <N> syslog priority prefixes, which journald understands.
#include <systemd/sd-daemon.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "daemon/config.h"
#include "daemon/effects.h"
#include "daemon/host_plane.h"
#include "daemon/log.h"
#include "daemon/server.h"

namespace {

using namespace tandem;

constexpr const char* kDefaultConfig = "/etc/tandem/tandemd.toml";

constexpr const char* kUsage = R"(usage: tandemd [options]

  --config FILE       configuration file (default /etc/tandem/tandemd.toml;
                      built-in defaults when that file does not exist)
  --runtime-dir DIR   where the socket lives (overrides runtime_dir)
  --policy NAME       policy to run (overrides [policy] name)
  --log-level LEVEL   trace, debug, info, warn or error (overrides log_level)
  --check-config      validate the configuration, print it, and exit
  --version           print the version and exit
  -h, --help          this text

Signals: SIGHUP reloads the configuration (all or nothing), SIGTERM and SIGINT
stop the daemon. See tandemd(8), docs/config.md and docs/daemon.md.
)";

void setup_logging(std::string_view level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_st>();
  spdlog::set_default_logger(daemon::make_logger(std::move(sink), level));
}

class SystemdNotifier final : public daemon::Notifier {
 public:
  SystemdNotifier() {
    std::uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0) usec_ = usec;
  }
  void ready() override { sd_notify(0, "READY=1"); }
  void reloading() override {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const auto usec = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000 + static_cast<std::uint64_t>(ts.tv_nsec) / 1000;
    sd_notify(0, fmt::format("RELOADING=1\nMONOTONIC_USEC={}", usec).c_str());
  }
  void stopping() override { sd_notify(0, "STOPPING=1"); }
  void watchdog() override { sd_notify(0, "WATCHDOG=1"); }
  void status(const std::string& text) override { sd_notify(0, fmt::format("STATUS={}", text).c_str()); }
  std::uint64_t watchdog_usec() const override { return usec_; }

 private:
  std::uint64_t usec_ = 0;
};

struct Flags {
  std::optional<std::string> config;
  std::optional<std::string> runtime_dir;
  std::optional<std::string> policy;
  std::optional<std::string> log_level;
  bool check = false;
};

// Reads the config file (or the defaults) and applies the command line.
base::Result<daemon::Compiled> load(const Flags& flags) {
  daemon::Config cfg;
  const std::string path = flags.config.value_or(kDefaultConfig);
  if (flags.config || std::filesystem::exists(path)) {
    auto parsed = daemon::load_config(path);
    if (!parsed) return base::propagate(std::move(parsed.error()));
    cfg = std::move(*parsed);
  }
  if (flags.runtime_dir) cfg.runtime_dir = *flags.runtime_dir;
  if (flags.policy) cfg.policy = *flags.policy;
  if (flags.log_level) cfg.log_level = *flags.log_level;
  return daemon::CompiledConfig::compile(std::move(cfg));
}

int usage_error(const std::string& what) {
  std::fprintf(stderr, "tandemd: %s (see --help)\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::optional<std::string>& out) -> bool {
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    if (arg == "--config") {
      if (!value(flags.config)) return usage_error("--config needs a file");
    } else if (arg == "--runtime-dir") {
      if (!value(flags.runtime_dir)) return usage_error("--runtime-dir needs a directory");
    } else if (arg == "--policy") {
      if (!value(flags.policy)) return usage_error("--policy needs a name");
    } else if (arg == "--log-level") {
      if (!value(flags.log_level)) return usage_error("--log-level needs a level");
    } else if (arg == "--check-config") {
      flags.check = true;
    } else if (arg == "--version") {
      std::printf("tandemd 0.1.0\n");
      return 0;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      return usage_error(fmt::format("unknown argument '{}'", arg));
    }
  }

  auto config = load(flags);
  if (!config) {
    std::fprintf(stderr, "tandemd: %s\n", config.error().message().c_str());
    return flags.check ? 1 : 2;
  }
  if (flags.check) {
    std::printf("%s", daemon::describe(config->config->config()).c_str());
    std::printf("configuration OK\n");
    return 0;
  }
  setup_logging(config->config->config().log_level);

  // The signals the loop reads from its signalfd: blocked before anything
  // could start a thread. SIGPIPE is never wanted (sends use MSG_NOSIGNAL).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  // The host plane (cgroups, tool placement, telemetry), unless configured
  // off or — in mode "auto" — impossible here (not root, no cgroupfs).
  std::unique_ptr<daemon::HostPlane> host;
  const daemon::HostConfig& host_config = config->config->config().host;
  if (host_config.cgroups != "off") {
    auto plane = daemon::HostPlane::open(host_config, base::MonotonicClock().now());
    if (plane) {
      host = std::move(*plane);
    } else if (host_config.cgroups == "on") {
      spdlog::critical("cannot start: host plane: {}", plane.error().message());
      return 1;
    } else {
      spdlog::warn("host plane off: {}; tools run without cgroups ([cgroups] mode = \"off\" silences this)",
                   plane.error().message());
    }
  }
  daemon::RecordingEffects recording;  // the GPU plane (issue 9) joins the host plane here
  daemon::HostEffects& effects = host ? static_cast<daemon::HostEffects&>(*host) : recording;
  SystemdNotifier notifier;
  auto server = daemon::Server::create(std::move(*config), effects, notifier, [&flags] { return load(flags); });
  if (!server) {
    spdlog::critical("cannot start: {}", server.error().message());
    return 1;
  }
  auto ran = (*server)->run();
  if (!ran) {
    spdlog::critical("loop failed: {}", ran.error().message());
    return 1;
  }
  return 0;
}
