// What the daemon fuzz targets (fuzz_ctl, fuzz_resync) share: one
// in-process tandemd (tests/daemon/inprocess.h) that lives across inputs, a
// pool of clients with different credentials, a reader of the fuzzer's
// bytes, and the checks every answer must pass:
//   - every message the daemon sends verifies (ipc::verify_message);
//   - a successful ctl answer is valid UTF-8, fits one datagram, and is
//     JSON (metrics: Prometheus text);
//   - no handler threw (ServerStats::internal_errors stays 0);
//   - what the daemon holds stays within its limits (Footprint).
// A broken check aborts, which libFuzzer reports with the input.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/text.h"
#include "tests/daemon/inprocess.h"

namespace tandem::fuzzing {

// Takes bytes off the front of the input; past its end, zeros.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | u8();
    return v;
  }
  std::uint64_t u64() { return std::uint64_t{u32()} << 32 | u32(); }
  // A string of up to `max` bytes (its length first).
  std::string str(std::size_t max) {
    const std::size_t n = std::min<std::size_t>(u8() | (std::size_t{u8()} << 8), max);
    std::string s;
    for (std::size_t i = 0; i < n && !empty(); ++i) s.push_back(static_cast<char>(u8()));
    return s;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

[[noreturn]] inline void broken(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "daemon fuzz check failed: %s %s\n", what, detail.c_str());
  std::abort();
}

// Session names the inputs pick from, so that different clients meet on
// the same sessions (and a few are not UTF-8, or too long).
inline const std::vector<std::string>& names() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> v;
    for (int i = 0; i < 12; ++i) v.push_back("agent-" + std::to_string(i));
    v.emplace_back("agent-\xff\xfe", 8);
    v.emplace_back("x\n<0>pwned");
    v.emplace_back(std::string(300, 'n'));
    v.emplace_back(
        "\xe2\x80\xae"
        "evil");
    return v;
  }();
  return n;
}

class Driver {
 public:
  static constexpr int kClients =
      6;  // 0,1 runners (uid 0) · 2 runner (uid 1000) · 3 engine · 4 admin · 5 reader (nobody)

  Driver() {
    spdlog::set_level(spdlog::level::off);
    daemon_ = std::make_unique<testing::InProcessDaemon>(
        "[limits]\nsessions_per_client = 64\nmessages_per_s = 1000000\nrecords_per_s = 100000000\n"
        "tools_per_session = 8\ntools_per_client = 16\nmax_clients = 32\nclients_per_uid = 8\n"
        "reserved_clients = 4\n");
    if (!daemon_->ok()) broken("daemon did not start", daemon_->error());
    for (int i = 0; i < kClients; ++i) clients_.emplace_back();
  }

  testing::InProcessDaemon& daemon() { return *daemon_; }

  // Client `i`, connected (again, if it was dropped).
  testing::InProcessClient& client(int i) {
    auto& c = clients_[static_cast<std::size_t>(i)];
    if (c && (c->fd() < 0 || c->eof())) c.reset();
    if (!c) {
      const ucred cred = i == 2   ? ucred{::getpid(), 1000, 1000}
                         : i == 5 ? ucred{0, 65534, 65534}
                                  : ucred{::getpid(), 0, 0};
      c.emplace(daemon_->connect(cred));
      const wire::Role role = i <= 2   ? wire::Role::Runner
                              : i == 3 ? wire::Role::Engine
                              : i == 4 ? wire::Role::CtlAdmin
                                       : wire::Role::CtlRead;
      std::optional<ipc::EngineInfo> engine;
      if (i == 3) {
        engine = ipc::EngineInfo{};
        engine->block_size = 16;
        engine->total_blocks = 1000;
        engine->max_seqs = 64;
        engine->token_budget = 2048;
      }
      (void)c->hello(role, "fuzz-" + std::to_string(i), engine, static_cast<std::uint64_t>(i) + 1);
    }
    return *c;
  }
  void drop(int i) { clients_[static_cast<std::size_t>(i)].reset(); }

  // Runs the daemon a little, then checks every message any client got.
  void settle() {
    for (int i = 0; i < 4; ++i) daemon_->step(std::chrono::milliseconds(0));
    for (auto& c : clients_) {
      if (!c) continue;
      while (auto m = c->poll()) check(*m);
    }
    check_daemon();
  }

  static void check(const ipc::ReceivedMessage& m) {
    if (m.bytes.size() > ipc::kMaxMessageSize) broken("a message over the datagram limit");
    if (!ipc::verify_message(m.bytes)) broken("a message that does not verify");
    const wire::Message* msg = m.message();
    if (const auto* r = msg->payload_as_CtlResponse()) {
      const std::string_view body = r->body() != nullptr ? r->body()->string_view() : std::string_view();
      if (!base::valid_utf8(body)) broken("a ctl answer that is not UTF-8");
      if (r->status() == 0 && !body.starts_with("# HELP") && !body.empty() && body.front() == '{' &&
          !nlohmann::json::accept(body)) {
        broken("a ctl answer that is not JSON", std::string(body.substr(0, 200)));
      }
    }
    if (const auto* e = msg->payload_as_Error()) {
      if (e->message() != nullptr && !base::valid_utf8(e->message()->string_view())) broken("an Error not UTF-8");
    }
  }

  void check_daemon() {
    const auto& st = daemon_->server().stats();
    if (st.internal_errors != 0) broken("a handler threw");
    const auto f = daemon_->server().footprint();
    // 64 sessions per client, and as many held for dropped runner handles
    // (each connection of ours comes back as a new handle).
    if (f.session_meta > 64 * 64) broken("session meta grew past the limits", std::to_string(f.session_meta));
    if (f.pending_names > 64 * kClients) broken("pending names grew past the limits");
    if (f.clients > 32) broken("more clients than max_clients");
  }

 private:
  std::unique_ptr<testing::InProcessDaemon> daemon_;
  std::vector<std::optional<testing::InProcessClient>> clients_;
};

inline Driver& driver() {
  static Driver* d = new Driver();  // lives for the process: the fuzzer never returns
  return *d;
}

// A session id the input picks: one of names(), or any 64-bit value.
inline std::uint64_t pick_session(Bytes& in) {
  const std::uint8_t k = in.u8();
  if (k < 240) return base::session_id(names()[k % names().size()]);
  return in.u64();
}

}  // namespace tandem::fuzzing
