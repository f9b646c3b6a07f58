// daemon/metrics.h: the Prometheus text writer, the listen address, and the
// endpoint driven through a real io_uring as the loop drives it.
#include "daemon/metrics.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/clock.h"
#include "tests/loopback_http.h"

namespace tandem::daemon {
namespace {

using ::testing::HasSubstr;

TEST(PromText, DeclaresEachFamilyOnceAndEscapesLabels) {
  PromText p;
  p.gauge("tandem_sessions", "live sessions by state", 3, {{"state", "acting"}});
  p.gauge("tandem_sessions", "ignored: declared already", 0, {{"state", "paused"}});
  p.counter("tandem_records_total", "records\nby result", 12, {{"result", "accepted"}});
  p.gauge("tandem_kv_blocks", "blocks", 1.5, {{"engine", "we\"ird\\name\n"}, {"state", "free"}});
  p.gauge("tandem_uptime_seconds", "uptime", 0.25);
  EXPECT_EQ(p.text(),
            "# HELP tandem_sessions live sessions by state\n"
            "# TYPE tandem_sessions gauge\n"
            "tandem_sessions{state=\"acting\"} 3\n"
            "tandem_sessions{state=\"paused\"} 0\n"
            "# HELP tandem_records_total records\\nby result\n"
            "# TYPE tandem_records_total counter\n"
            "tandem_records_total{result=\"accepted\"} 12\n"
            "# HELP tandem_kv_blocks blocks\n"
            "# TYPE tandem_kv_blocks gauge\n"
            "tandem_kv_blocks{engine=\"we\\\"ird\\\\name\\n\",state=\"free\"} 1.5\n"
            "# HELP tandem_uptime_seconds uptime\n"
            "# TYPE tandem_uptime_seconds gauge\n"
            "tandem_uptime_seconds 0.25\n");
}

TEST(PromText, SpecialValues) {
  PromText p;
  p.gauge("a", "a", std::numeric_limits<double>::quiet_NaN());
  p.gauge("b", "b", std::numeric_limits<double>::infinity());
  p.gauge("c", "c", 1e20);
  EXPECT_THAT(p.text(), HasSubstr("a NaN\n"));
  EXPECT_THAT(p.text(), HasSubstr("b +Inf\n"));
  EXPECT_THAT(p.text(), HasSubstr("c 1e+20\n"));
}

TEST(ParseListen, LoopbackOnly) {
  auto a = parse_listen("127.0.0.1:9464");
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->ipv6);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9464);
  auto l = parse_listen("localhost:0");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->host, "127.0.0.1");
  auto six = parse_listen("[::1]:80");
  ASSERT_TRUE(six);
  EXPECT_TRUE(six->ipv6);
  EXPECT_EQ(six->host, "::1");
  for (std::string_view bad : {"0.0.0.0:1", "192.168.1.1:1", "[::]:1", "[fe80::1]:1", "127.0.0.1:", ":9464",
                               "127.0.0.1:-1", "127.0.0.1:65536", "example.com:80", "[::1]", "9464"}) {
    auto r = parse_listen(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_THAT(r.error().message(), HasSubstr(std::string(bad))) << "names what was wrong";
  }
  EXPECT_THAT(parse_listen("10.1.1.1:1").error().message(), HasSubstr("loopback"));
}

TEST(ParseListen, AnyAddressWhenRemoteScrapesAreAllowed) {
  for (std::string_view ok : {"0.0.0.0:9465", "10.1.1.1:1", "[::]:80", "[fe80::1]:1", "127.0.0.1:0"}) {
    EXPECT_TRUE(parse_listen(ok, true)) << ok;
  }
  for (std::string_view bad : {"example.com:80", "0.0.0.0", "[::]"}) EXPECT_FALSE(parse_listen(bad, true)) << bad;
  EXPECT_THAT(parse_listen("0.0.0.0:1").error().message(), HasSubstr("allow_remote"));
}

TEST(UringTag, PacksItsSourceApartFromTheClient) {
  const Tag t{Op::kMetricsConn, 0xfffffffeu, 0xabcd};
  const Tag u = Tag::unpack(t.pack());
  EXPECT_EQ(u.op, Op::kMetricsConn);
  EXPECT_EQ(u.client, 0xfffffffeu);
  EXPECT_EQ(u.source, 0xabcd);
  EXPECT_NE(Tag{Op::kMetricsAccept}.pack(), (Tag{Op::kMetricsAccept, 0, 1}.pack()));
}

// A plain blocking HTTP exchange with the endpoint at `port`.
std::string exchange(std::uint16_t port, const std::string& request) {
  return tandem::test_support::loopback_exchange(port, request).value_or("connect failed");
}

class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto u = Uring::create(64);
    ASSERT_TRUE(u) << u.error().message();
    uring_ = std::move(*u);
    auto e = MetricsEndpoint::open(*parse_listen("127.0.0.1:0"));
    ASSERT_TRUE(e) << e.error().message();
    endpoint_.emplace(std::move(*e));
    port_ = static_cast<std::uint16_t>(std::stoi(endpoint_->address().substr(endpoint_->address().rfind(':') + 1)));
    endpoint_->arm(uring_);
  }
  void TearDown() override {
    if (endpoint_) endpoint_->close_all(uring_);
  }

  // Serves the loop on this thread while a client thread talks to it.
  std::string serve(const std::string& request) {
    std::string reply;
    std::thread client([&] { reply = exchange(port_, request); });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      auto n = uring_.wait(std::chrono::milliseconds(20), [&](Tag tag, int res) {
        endpoint_->on(tag, res, uring_, clock_.now(), [] { return std::string("tandem_up 1\n"); });
      });
      EXPECT_TRUE(n);
      if (!n || !reply.empty()) break;
    }
    client.join();
    return reply;
  }

  base::MonotonicClock clock_;
  Uring uring_;
  std::optional<MetricsEndpoint> endpoint_;
  std::uint16_t port_ = 0;
};

TEST_F(EndpointTest, ServesMetricsAndRefusesTheRest) {
  std::string ok = serve("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ok, HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(ok, HasSubstr("Content-Length: 12\r\n"));
  EXPECT_THAT(ok, HasSubstr("\r\n\r\ntandem_up 1\n"));
  EXPECT_EQ(endpoint_->scrapes(), 1u);

  EXPECT_THAT(serve("GET / HTTP/1.1\r\n\r\n"), HasSubstr("HTTP/1.1 404"));
  EXPECT_THAT(serve("POST /metrics HTTP/1.1\r\n\r\n"), HasSubstr("HTTP/1.1 405"));
  EXPECT_THAT(serve("garbage\r\n\r\n"), HasSubstr("HTTP/1.1 400"));
  std::string head = serve("HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(head, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(head, ::testing::Not(HasSubstr("tandem_up")));
  EXPECT_THAT(serve("GET /metrics HTTP/1.1\r\n" + std::string(MetricsEndpoint::kMaxRequest, 'x')),
              HasSubstr("HTTP/1.1 431"));
  EXPECT_EQ(endpoint_->scrapes(), 2u);
  EXPECT_EQ(endpoint_->errors(), 4u);
}

TEST_F(EndpointTest, SilentClientsExpire) {
  const int fd = tandem::test_support::loopback_connect(port_);
  ASSERT_GE(fd, 0);
  // Accept it.
  for (int i = 0; i < 10 && endpoint_->errors() == 0; ++i) {
    ASSERT_TRUE(uring_.wait(std::chrono::milliseconds(20), [&](Tag tag, int res) {
      endpoint_->on(tag, res, uring_, clock_.now(), [] { return std::string(); });
    }));
  }
  endpoint_->expire(uring_, clock_.now() + MetricsEndpoint::kTimeout + std::chrono::seconds(1));
  EXPECT_EQ(endpoint_->errors(), 1u);
  (void)uring_.wait(std::chrono::milliseconds(20), [&](Tag, int) {});
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "closed by the endpoint";
  ::close(fd);
}

TEST(MetricsEndpointOpen, PortInUseNamesTheAddress) {
  auto first = MetricsEndpoint::open(*parse_listen("127.0.0.1:0"));
  ASSERT_TRUE(first);
  auto second = MetricsEndpoint::open(*parse_listen(first->address()));
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), EADDRINUSE);
  EXPECT_THAT(second.error().message(), HasSubstr(first->address()));
}

}  // namespace
}  // namespace tandem::daemon
