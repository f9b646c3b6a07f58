#include "tests/integration/harness.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace tandem::it {

TempDir::TempDir() {
  char tmpl[] = "/tmp/tandem-it-XXXXXX";
  const char* p = ::mkdtemp(tmpl);
  if (p == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process::~Process() { kill9(); }

void Process::start(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path,
                    const std::vector<std::string>& env) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0 || err < 0) ::_exit(126);
    ::dup2(out, 1);
    ::dup2(err, 2);
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    ::execv(args[0], args.data());
    ::_exit(127);
  }
}

void Process::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

int Process::stop(int sig, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, sig);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    ::usleep(5'000);
  }
  kill9();
  return -1;
}

Daemon::Daemon(std::string runtime_dir, const std::string& config_text)
    : dir_(std::move(runtime_dir)), socket_(dir_ + "/tandemd.sock"), config_path_(dir_ + "/tandemd.toml") {
  std::ofstream(config_path_) << config_text;
}

void Daemon::start() {
  proc_.start({TANDEMD_PATH, "--config", config_path_, "--runtime-dir", dir_}, dir_ + "/tandemd.out",
              dir_ + "/tandemd.log");
  ASSERT_TRUE(eventually([&] { return socket_accepts(socket_); })) << "tandemd did not come up:\n" << log();
}

std::string Daemon::log() const {
  std::ifstream in(dir_ + "/tandemd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

base::Result<base::UniqueFd> connect_to(const std::string& path) {
  base::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return base::errno_error("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return base::errno_error(fmt::format("connect {}", path));
  }
  return fd;
}

}  // namespace

bool socket_accepts(const std::string& path) { return connect_to(path).has_value(); }

base::Result<RawClient> RawClient::connect(const std::string& socket_path) {
  auto fd = connect_to(socket_path);
  if (!fd) return base::propagate(std::move(fd.error()));
  RawClient c;
  c.sock_ = std::move(*fd);
  return c;
}

base::Result<void> RawClient::send(const std::vector<std::uint8_t>& bytes) { return ipc::send_message(fd(), bytes); }

base::Result<void> RawClient::send_raw(const void* data, std::size_t size) {
  if (::send(fd(), data, size, MSG_NOSIGNAL) < 0) return base::errno_error("send");
  return {};
}

base::Result<ipc::ReceivedMessage> RawClient::recv(std::chrono::milliseconds timeout) {
  pollfd p{fd(), POLLIN, 0};
  const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (n == 0) return base::make_error(ETIMEDOUT, "no message in time");
  if (n < 0) return base::errno_error("poll");
  return ipc::recv_message(fd());
}

bool RawClient::closed_by_peer(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = recv(std::chrono::milliseconds(50));
    if (!m && m.error().code() == ECONNRESET) return true;
  }
  return false;
}

base::Result<void> RawClient::hello(wire::Role role, const std::string& name,
                                    const std::optional<ipc::EngineInfo>& engine) {
  if (auto s = send(ipc::build_hello(role, name, ::getpid(), engine)); !s) return s;
  auto m = recv();
  if (!m) return base::propagate(std::move(m.error()));
  const wire::Message* msg = m->message();
  if (msg->payload_type() == wire::Payload::Error) {
    const auto* e = msg->payload_as_Error();
    return base::make_error(e->code(), e->message() ? e->message()->str() : "");
  }
  if (msg->payload_type() != wire::Payload::Welcome) return base::make_error(EPROTO, "expected Welcome");
  client_id_ = msg->payload_as_Welcome()->client_id();
  if (m->fds.size() == 3) {
    auto ch = ipc::Channel::attach(std::move(m->fds[0]), std::move(m->fds[1]), std::move(m->fds[2]));
    if (!ch) return base::propagate(std::move(ch.error()));
    channel_ = std::move(*ch);
    auto ev = channel_->event_producer();
    auto dir = channel_->directive_consumer();
    if (!ev || !dir) return base::make_error(EIO, "attach rings");
    events_ = *ev;
    directives_ = *dir;
    event_bell_ = channel_->event_doorbell();
  }
  return {};
}

base::Result<nlohmann::json> RawClient::ctl(const std::string& command) {
  if (auto s = send(ipc::build_ctl_request(command, {}, true)); !s) return base::propagate(std::move(s.error()));
  while (true) {
    auto m = recv();
    if (!m) return base::propagate(std::move(m.error()));
    const wire::Message* msg = m->message();
    if (msg->payload_type() != wire::Payload::CtlResponse) continue;
    const auto* r = msg->payload_as_CtlResponse();
    const std::string body = r->body() ? r->body()->str() : "";
    if (r->status() != 0) return base::make_error(r->status(), body);
    return nlohmann::json::parse(body);
  }
}

bool RawClient::push(const ipc::Slot& slot) {
  if (!events_.try_push(slot)) return false;
  event_bell_.notify();
  return true;
}

std::vector<ipc::Record> RawClient::directives(std::chrono::milliseconds timeout) {
  std::vector<ipc::Record> out;
  ipc::RecordDecoder decoder(ipc::Direction::kToClient);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    ipc::Slot slot;
    while (directives_.try_pop(slot)) {
      ipc::Record r;
      if (decoder.decode(slot, r) == ipc::DecodeStatus::kOk) out.push_back(r);
    }
    ::usleep(2'000);
  }
  return out;
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
  auto j = c->ctl(command);
  if (!j) {
    ADD_FAILURE() << j.error().message();
    return {};
  }
  return *j;
}

}  // namespace tandem::it
