#include "tests/integration/harness.h"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace tandem::it {

namespace {

testbed::TempDir make_temp_dir() {
  auto dir = testbed::TempDir::make("tandem-it-");
  if (!dir) throw std::runtime_error(dir.error().message());
  return std::move(*dir);
}

}  // namespace

TempDir::TempDir() : testbed::TempDir(make_temp_dir()) {}

void Process::start(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path,
                    const std::vector<std::string>& env) {
  if (auto r = child_.start(argv, out_path, err_path, env); !r) {
    throw std::runtime_error(fmt::format("start {}: {}", argv.empty() ? "" : argv[0], r.error().message()));
  }
}

int Process::stop(int sig, std::chrono::milliseconds timeout) {
  auto r = child_.wait(sig, timeout);
  return r ? *r : -1;
}

Daemon::Daemon(std::string runtime_dir, const std::string& config_text)
    : dir_(std::move(runtime_dir)), socket_(dir_ + "/tandemd.sock") {
  const std::string subtree = dir_.substr(dir_.rfind('/') + 1);
  testbed::DaemonOptions o;
  o.tandemd = TANDEMD_PATH;
  o.runtime_dir = dir_;
  o.config = config_text;
  if (o.config.find("[cgroups]") == std::string::npos)
    o.config += fmt::format("\n[cgroups]\nsubtree = \"{}\"\n", subtree);
  if (o.config.find("[metrics]") == std::string::npos) o.config += "\n[metrics]\nlisten = \"127.0.0.1:0\"\n";
  o.cgroup_subtree = subtree;  // the one every test daemon gets, swept as root
  auto d = testbed::DaemonProcess::create(std::move(o));
  if (!d) {
    ADD_FAILURE() << d.error().message();
    return;
  }
  daemon_ = std::move(*d);
}

void Daemon::start(const std::vector<std::string>& wrapper) {
  ASSERT_NE(daemon_, nullptr) << "tandemd's harness was not set up (see the failure above)";
  auto r = daemon_->start(wrapper);
  ASSERT_TRUE(r.has_value()) << r.error().message() << "\ntandemd.log:\n" << log();
}

void Daemon::kill9() {
  if (daemon_) daemon_->kill();
}

int Daemon::stop() {
  if (!daemon_ || daemon_->pid() <= 0) return -1;
  (void)daemon_->stop();  // the wait status tells the test what it needs
  return daemon_->wait_status().value_or(-1);
}

pid_t Daemon::pid() const { return daemon_ ? daemon_->pid() : -1; }

std::string Daemon::log() const { return daemon_ ? daemon_->log() : std::string(); }

bool socket_accepts(const std::string& path) { return RawClient::connect(path).has_value(); }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool alive(pid_t pid) {
  const std::string stat = slurp(fmt::format("/proc/{}/stat", pid));
  if (stat.empty()) return false;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

nlohmann::json ctl(const std::string& socket_path, const std::string& command) {
  auto c = RawClient::connect(socket_path);
  if (!c) {
    ADD_FAILURE() << c.error().message();
    return {};
  }
  if (auto h = c->hello(wire::Role::CtlRead, "it-ctl"); !h) {
    ADD_FAILURE() << h.error().message();
    return {};
  }
  auto body = c->ctl(command);
  if (!body) {
    ADD_FAILURE() << body.error().message();
    return {};
  }
  return nlohmann::json::parse(*body);
}

}  // namespace tandem::it
