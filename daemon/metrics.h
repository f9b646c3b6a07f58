// Prometheus metrics (docs/metrics.md): the text exposition format, and the
// loopback HTTP endpoint tandemd serves it on from its io_uring loop.
//
// PromText writes the text format (version 0.0.4): each family's # HELP and
// # TYPE once, then its samples, label values escaped. The daemon builds the
// text from its own state at each scrape (CtlService::metrics_text); the same
// text answers `tandemctl metrics`.
//
// MetricsEndpoint is a deliberately small HTTP/1.x responder: it accepts on
// a TCP socket, reads one request per connection (GET /metrics, 8 KiB of
// header at most, 5 s at most), writes one response and closes. The loop
// owns it and arms its operations; it never blocks. Loopback only unless the
// operator allows remote scrapes ([metrics] allow_remote): the metrics are
// not authenticated.
//
// MetricsEndpoints is the set tandemd serves: the node's ([metrics] listen)
// and one per engine name ([metrics.engines], vLLM's metric names for a
// cluster router, docs/cluster.md).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
// "[::1]") and PORT 0..65535 (0: any free port); with `allow_remote`, any
// numeric IPv4 or [IPv6] address (0.0.0.0 and [::] included). EINVAL naming
// the problem otherwise.
struct ListenAddress {
  bool ipv6 = false;
  std::string host;  // numeric
  std::uint16_t port = 0;
};
base::Result<ListenAddress> parse_listen(std::string_view text, bool allow_remote = false);

// What a scrape answers: the text, or why there is none (503 with the reason).
using MetricsRender = std::function<base::Result<std::string>()>;

// Thread-safety: one thread (the loop's).
class MetricsEndpoint {
 public:
  static constexpr std::size_t kMaxConnections = 16;
  static constexpr std::size_t kMaxRequest = 8192;
  static constexpr base::Duration kTimeout = std::chrono::seconds(5);

  // Binds and listens. EADDRINUSE etc. name the address. `source` goes
  // into every tag the endpoint arms (Tag::source), to tell several apart.
  static base::Result<MetricsEndpoint> open(const ListenAddress& address, std::uint16_t source = 0);

  // "127.0.0.1:PORT" as bound (the port chosen when 0 was asked).
  const std::string& address() const { return bound_; }
  int listen_fd() const { return listen_.get(); }

  // Loop integration: arm() once; on(tag, res) for every kMetricsAccept and
  // kMetricsConn completion; expire() at every tick; close_all() before
  // the ring goes. `render` builds the body at a scrape.
  void arm(Uring& uring);
  void on(Tag tag, int res, Uring& uring, base::Time now, const MetricsRender& render);
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
  void respond(Conn& c, const MetricsRender& render);

  base::UniqueFd listen_;
  std::uint16_t source_ = 0;
  std::string bound_;
  std::map<std::uint32_t, Conn> conns_;
  std::uint32_t next_ = 1;
  std::uint64_t scrapes_ = 0;
  std::uint64_t errors_ = 0;
};

// The node's endpoint (source 0) and the engines' (source i + 1, in name
// order). An address that cannot be bound costs that endpoint, not the
// daemon: it is logged once and status shows "off: <why>".
// Thread-safety: one thread (the loop's).
class MetricsEndpoints {
 public:
  static constexpr std::size_t kMaxEngines = 64;  // [metrics.engines] entries

  struct Slot {
    std::string name;   // the engine's name; "" for the node's
    std::string asked;  // the configured address ("" = off)
    std::optional<MetricsEndpoint> endpoint;
    std::string error;  // why there is no endpoint ("" when there is one, or none was asked)
    // "HOST:PORT" as bound, "off" or "off: <why>".
    std::string listen() const;
  };
  // Renders the node's text, or an engine's by its name.
  struct Renderers {
    std::function<std::string()> node;
    std::function<base::Result<std::string>(std::string_view engine)> engine;
  };

  MetricsEndpoints() = default;
  // `listen` and `engines` as validated with the config.
  static MetricsEndpoints open(std::string_view listen, bool allow_remote,
                               const std::map<std::string, std::string>& engines);

  const Slot& node() const { return node_; }
  const std::vector<Slot>& engines() const { return engines_; }

  void arm(Uring& uring);
  void on(Tag tag, int res, Uring& uring, base::Time now, const Renderers& render);
  void expire(Uring& uring, base::Time now);
  void close_all(Uring& uring);

 private:
  Slot node_;
  std::vector<Slot> engines_;
};

}  // namespace tandem::daemon
