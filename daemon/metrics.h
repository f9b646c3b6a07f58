// Prometheus metrics (docs/metrics.md): the text exposition format, and the
// loopback HTTP endpoint tandemd serves it on from its io_uring loop.
//
// PromText writes the text format (version 0.0.4): each family's # HELP and
// # TYPE once, then its samples, label values escaped. The daemon builds the
// text from its own state at each scrape (CtlService::metrics_text); the same
// text answers `tandemctl metrics`.
//
// MetricsEndpoint is a deliberately small HTTP/1.x responder: it accepts on
// a loopback TCP socket, reads one request per connection (GET /metrics,
// 8 KiB of header at most, 5 s at most), writes one response and closes.
// The loop owns it and arms its operations; it never blocks. Loopback only:
// the metrics are not authenticated.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "daemon/uring.h"

namespace tandem::daemon {

class PromText {
 public:
  using Labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

  // Declares a family (once; later calls with the same name are ignored)
  // and writes one sample of it. `type` is "gauge" or "counter" (counter
  // names end in _total).
  void gauge(std::string_view name, std::string_view help, double value, Labels labels = {});
  void counter(std::string_view name, std::string_view help, double value, Labels labels = {});
  const std::string& text() const { return out_; }

 private:
  void sample(std::string_view name, std::string_view help, std::string_view type, double value, Labels labels);
  std::string out_;
  std::map<std::string, bool, std::less<>> declared_;
};

// "HOST:PORT" with HOST a loopback address (127.0.0.0/8, "localhost", or
// "[::1]") and PORT 0..65535 (0: any free port). "" is off. EINVAL naming
// the problem otherwise.
struct ListenAddress {
  bool ipv6 = false;
  std::string host;  // numeric
  std::uint16_t port = 0;
};
base::Result<ListenAddress> parse_listen(std::string_view text);

// Thread-safety: one thread (the loop's).
class MetricsEndpoint {
 public:
  static constexpr std::size_t kMaxConnections = 16;
  static constexpr std::size_t kMaxRequest = 8192;
  static constexpr base::Duration kTimeout = std::chrono::seconds(5);

  // Binds and listens. EADDRINUSE etc. name the address.
  static base::Result<MetricsEndpoint> open(const ListenAddress& address);

  // "127.0.0.1:PORT" as bound (the port chosen when 0 was asked).
  const std::string& address() const { return bound_; }
  int listen_fd() const { return listen_.get(); }

  // Loop integration: arm() once; on(tag, res) for every kMetricsAccept and
  // kMetricsConn completion; expire() at every tick; close_all() before
  // the ring goes. `render` builds the body at a scrape.
  void arm(Uring& uring);
  void on(Tag tag, int res, Uring& uring, base::Time now, const std::function<std::string()>& render);
  void expire(Uring& uring, base::Time now);
  void close_all(Uring& uring);

  std::uint64_t scrapes() const { return scrapes_; }
  std::uint64_t errors() const { return errors_; }  // bad requests, timeouts, short writes

 private:
  struct Conn {
    base::UniqueFd fd;
    std::string buf;
    base::Time since{};
  };
  MetricsEndpoint() = default;
  void close_conn(std::uint32_t id, Uring& uring);
  void respond(Conn& c, const std::function<std::string()>& render);

  base::UniqueFd listen_;
  std::string bound_;
  std::map<std::uint32_t, Conn> conns_;
  std::uint32_t next_ = 1;
  std::uint64_t scrapes_ = 0;
  std::uint64_t errors_ = 0;
};

}  // namespace tandem::daemon
