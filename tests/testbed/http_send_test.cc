// send_fresh_if_stale (testbed/http_send.h) against a scripted HTTP server on
// a loopback socket: each connection it accepts follows a script of answers,
// so the server closing a kept-alive connection under a request is exact, not
// a race.
#include "testbed/http_send.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace tandem::testbed {
namespace {

enum class Answer {
  kServe,         // read the request; answer 200 "ok", connection kept
  kReset,         // read the request; reset the connection (the crossing close)
  kHalfAndReset,  // read the request; send half a response; reset
  kSlowReset,     // read the request; after longer than kStaleWithin, reset
};

class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::vector<Answer>> script) : script_(std::move(script)) {
    listen_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listen_ < 0 || bind(listen_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listen_, 8) != 0 ||
        getsockname(listen_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on loopback";
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~ScriptedServer() {
    quit_.store(true);
    if (thread_.joinable()) thread_.join();
    if (listen_ >= 0) close(listen_);
  }
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  int port() const { return port_; }
  int accepted() const { return accepted_.load(); }
  int requests() const { return requests_.load(); }

 private:
  bool wait_readable(int fd) {
    for (int waited_ms = 0; waited_ms < 10'000 && !quit_.load(); waited_ms += 50) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) return true;
    }
    return false;
  }
  // One request: headers, then Content-Length bytes of body.
  bool read_request(int fd) {
    std::string in;
    char buf[4096];
    for (;;) {
      const std::size_t end = in.find("\r\n\r\n");
      if (end != std::string::npos) {
        const std::size_t at = in.find("Content-Length: ");
        const std::size_t body = at == std::string::npos ? 0 : std::strtoul(in.c_str() + at + 16, nullptr, 10);
        if (in.size() >= end + 4 + body) return true;
      }
      if (!wait_readable(fd)) return false;
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<std::size_t>(n));
    }
  }
  static void send_all(int fd, const std::string& s) {
    for (std::size_t off = 0; off < s.size();) {
      const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<std::size_t>(n);
    }
  }
  static void reset(int fd) {
    const linger l{1, 0};  // close() sends RST
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
  }
  void run() {
    for (const std::vector<Answer>& answers : script_) {
      if (!wait_readable(listen_)) return;
      const int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      accepted_.fetch_add(1);
      bool open = true;
      for (const Answer a : answers) {
        if (!read_request(fd)) break;
        requests_.fetch_add(1);
        if (a == Answer::kServe) {
          send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok");
          continue;
        }
        if (a == Answer::kHalfAndReset) send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf");
        if (a == Answer::kSlowReset) std::this_thread::sleep_for(kStaleWithin + std::chrono::milliseconds(200));
        reset(fd);
        open = false;
        break;
      }
      if (open) close(fd);
    }
  }

  std::vector<std::vector<Answer>> script_;
  int listen_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> quit_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> requests_{0};
};

httplib::Request post() {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt":"x"})";
  req.set_header("Content-Type", "application/json");
  return req;
}

httplib::Client client(const ScriptedServer& server) {
  httplib::Client c("127.0.0.1", server.port());
  c.set_keep_alive(true);
  c.set_read_timeout(10);
  return c;
}

TEST(HttpSend, ARequestTheServerDroppedWithItsConnectionGoesOnceMoreOnANewOne) {
  ScriptedServer server({{Answer::kServe, Answer::kReset}, {Answer::kServe}});
  httplib::Client c = client(server);
  const SendOutcome first = send_fresh_if_stale(c, post());
  ASSERT_TRUE(first.result);
  EXPECT_FALSE(first.resent);
  const SendOutcome second = send_fresh_if_stale(c, post());
  ASSERT_TRUE(second.result) << httplib::to_string(second.result.error());
  EXPECT_TRUE(second.resent);
  EXPECT_EQ(second.result->status, 200);
  EXPECT_EQ(second.result->body, "ok");
  EXPECT_EQ(server.accepted(), 2);
  EXPECT_EQ(server.requests(), 3);
}

TEST(HttpSend, ItIsSentAgainOnceNotUntilItGoesThrough) {
  ScriptedServer server({{Answer::kReset}, {Answer::kReset}, {Answer::kServe}});
  httplib::Client c = client(server);
  const SendOutcome out = send_fresh_if_stale(c, post());
  ASSERT_FALSE(out.result);
  EXPECT_TRUE(out.resent);
  EXPECT_TRUE(out.result.error() == httplib::Error::Read || out.result.error() == httplib::Error::Write)
      << httplib::to_string(out.result.error());
  EXPECT_EQ(server.requests(), 2);
}

TEST(HttpSend, AResponseThatBeganIsNotServedTwice) {
  ScriptedServer server({{Answer::kHalfAndReset}, {Answer::kServe}});
  httplib::Client c = client(server);
  const SendOutcome out = send_fresh_if_stale(c, post());
  EXPECT_FALSE(out.result);
  EXPECT_FALSE(out.resent);
  EXPECT_EQ(server.requests(), 1);
}

TEST(HttpSend, AReadThatFailedLateMayHaveBeenServedAndIsNotSentAgain) {
  ScriptedServer server({{Answer::kSlowReset}, {Answer::kServe}});
  httplib::Client c = client(server);
  const SendOutcome out = send_fresh_if_stale(c, post());
  EXPECT_FALSE(out.result);
  EXPECT_FALSE(out.resent);
  EXPECT_EQ(server.requests(), 1);
}

TEST(HttpSend, NothingIsSentAgainOnceTheCallerStops) {
  ScriptedServer server({{Answer::kReset}, {Answer::kServe}});
  httplib::Client c = client(server);
  const std::atomic<bool> stop{true};
  const SendOutcome out = send_fresh_if_stale(c, post(), &stop);
  EXPECT_FALSE(out.result);
  EXPECT_FALSE(out.resent);
  EXPECT_EQ(server.requests(), 1);
}

TEST(HttpSend, TheCallersResponseHandlerStillRunsAndMayCancel) {
  ScriptedServer server({{Answer::kServe}});
  httplib::Client c = client(server);
  httplib::Request req = post();
  int seen = 0;
  req.response_handler = [&](const httplib::Response& r) {
    seen = r.status;
    return false;
  };
  const SendOutcome out = send_fresh_if_stale(c, std::move(req));
  EXPECT_EQ(seen, 200);
  ASSERT_FALSE(out.result);
  EXPECT_EQ(out.result.error(), httplib::Error::Canceled);
  EXPECT_FALSE(out.resent);
}

}  // namespace
}  // namespace tandem::testbed
