// tandemd's life as a service: --check-config, sd_notify (READY, RELOADING,
// STOPPING) to a NOTIFY_SOCKET, all-or-nothing SIGHUP reload, one daemon per
// runtime dir, and <N> priority prefixes on its log lines.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/integration/harness.h"

namespace tandem::it {
namespace {

using namespace std::chrono_literals;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs tandemd with `args` to completion; its exit status and output.
int run_tandemd(const std::string& dir, const std::vector<std::string>& args, std::string* out) {
  std::vector<std::string> argv = {TANDEMD_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p;
  std::remove((dir + "/run.out").c_str());
  p.start(argv, dir + "/run.out", dir + "/run.out");
  const int status = p.stop(0, 10s);  // signal 0: just wait
  *out = read_file(dir + "/run.out");
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Lifecycle, CheckConfigPrintsAGoodFileAndNamesTheProblemInABadOne) {
  TempDir dir;
  std::ofstream(dir.path() + "/good.toml") << "[policy]\nname = \"mars\"\n[limits]\nmax_clients = 8\n";
  std::ofstream(dir.path() + "/bad.toml") << "[limits]\nmax_clients = 0\n";
  std::string out;
  EXPECT_EQ(run_tandemd(dir.path(), {"--check-config", "--config", dir.path() + "/good.toml"}, &out), 0) << out;
  EXPECT_NE(out.find("mars"), std::string::npos) << out;
  EXPECT_NE(out.find("configuration OK"), std::string::npos) << out;
  EXPECT_EQ(run_tandemd(dir.path(), {"--check-config", "--config", dir.path() + "/bad.toml"}, &out), 1) << out;
  EXPECT_NE(out.find("limits.max_clients"), std::string::npos) << out;
  EXPECT_EQ(run_tandemd(dir.path(), {"--check-config", "--config", dir.path() + "/missing.toml"}, &out), 1) << out;
  EXPECT_NE(out.find("missing.toml"), std::string::npos) << out;
  EXPECT_EQ(run_tandemd(dir.path(), {"--bogus"}, &out), 2) << out;
  EXPECT_NE(out.find("--bogus"), std::string::npos) << out;
}

TEST(Lifecycle, OneDaemonPerRuntimeDir) {
  TempDir dir;
  Daemon daemon(dir.path());
  daemon.start();
  std::string out;
  EXPECT_EQ(run_tandemd(dir.path(), {"--runtime-dir", dir.path()}, &out), 1) << out;
  EXPECT_NE(out.find("another tandemd is running"), std::string::npos) << out;
  EXPECT_TRUE(socket_accepts(daemon.socket_path())) << "the first daemon's socket was left alone";
  EXPECT_EQ(daemon.stop(), 0);
}

// A NOTIFY_SOCKET that collects what sd_notify sends.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = base::UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  }
  // Everything received within `timeout`, joined by '\n'.
  std::string drain(std::chrono::milliseconds timeout) {
    std::string all;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      char buf[1024];
      const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        all.append(buf, static_cast<std::size_t>(n));
        all += '\n';
      } else {
        ::usleep(5'000);
      }
    }
    return all;
  }

 private:
  std::string path_;
  base::UniqueFd fd_;
};

// The harness itself (not it::Daemon): this config is the test's alone, and
// the daemon gets a NOTIFY_SOCKET.
TEST(Lifecycle, NotifiesTheServiceManagerAndReloadsAllOrNothing) {
  TempDir dir;
  NotifySocket notify(dir.path() + "/notify.sock");
  testbed::DaemonOptions options;
  options.tandemd = TANDEMD_PATH;
  options.runtime_dir = dir.path();
  options.config = "[policy]\nname = \"fcfs\"\n";
  options.env = {"NOTIFY_SOCKET=" + dir.path() + "/notify.sock"};
  auto made = testbed::DaemonProcess::create(std::move(options));
  ASSERT_TRUE(made.has_value()) << made.error().message();
  testbed::DaemonProcess& daemon = **made;
  auto started = daemon.start();
  ASSERT_TRUE(started.has_value()) << started.error().message() << "\n" << daemon.log();
  const std::string& socket = daemon.socket_path();
  EXPECT_NE(notify.drain(300ms).find("READY=1"), std::string::npos);
  EXPECT_EQ(ctl(socket, "status")["policy"]["name"], "fcfs");

  // A good change: the new policy, a new epoch.
  ASSERT_TRUE(daemon.write_config("[policy]\nname = \"mars\"\n").has_value());
  ::kill(daemon.pid(), SIGHUP);
  const std::string reload = notify.drain(500ms);
  EXPECT_NE(reload.find("RELOADING=1"), std::string::npos) << reload;
  EXPECT_NE(reload.find("MONOTONIC_USEC="), std::string::npos) << reload;
  EXPECT_NE(reload.find("READY=1"), std::string::npos) << reload;
  auto status = ctl(socket, "status");
  EXPECT_EQ(status["policy"]["name"], "mars");
  EXPECT_EQ(status["policy"]["epoch"], 2);

  // A bad file changes nothing.
  ASSERT_TRUE(daemon.write_config("[policy]\nname = \"nonesuch\"\n").has_value());
  ::kill(daemon.pid(), SIGHUP);
  notify.drain(300ms);
  status = ctl(socket, "status");
  EXPECT_EQ(status["policy"]["name"], "mars");
  EXPECT_EQ(status["policy"]["epoch"], 2);
  const std::string log = daemon.log();
  EXPECT_NE(log.find("<3>reload failed; the running configuration is unchanged"), std::string::npos) << log;
  EXPECT_NE(log.find("nonesuch"), std::string::npos) << log;

  // A setting that needs a restart refuses the whole reload.
  ASSERT_TRUE(daemon.write_config("[policy]\nname = \"fcfs\"\n[ipc]\nevent_slots = 8192\n").has_value());
  ::kill(daemon.pid(), SIGHUP);
  notify.drain(300ms);
  EXPECT_EQ(ctl(socket, "status")["policy"]["name"], "mars");
  EXPECT_NE(daemon.log().find("ipc.event_slots changed"), std::string::npos);

  auto stopped = daemon.stop();
  EXPECT_TRUE(stopped.has_value()) << stopped.error().message();
  EXPECT_NE(notify.drain(100ms).find("STOPPING=1"), std::string::npos);
  // Every log line carries a priority prefix.
  std::istringstream lines(daemon.log());
  for (std::string line; std::getline(lines, line);) {
    ASSERT_GE(line.size(), 3u);
    EXPECT_TRUE(line[0] == '<' && line[1] >= '0' && line[1] <= '7' && line[2] == '>') << line;
  }
  EXPECT_FALSE(socket_accepts(socket)) << "the socket is gone after a clean stop";
}

}  // namespace
}  // namespace tandem::it
