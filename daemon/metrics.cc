// Prometheus text and the loopback endpoint (daemon/metrics.h).
#include "daemon/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/parse.h"

namespace tandem::daemon {
namespace {

// A label value: backslash, double quote and newline escaped.
std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// HELP text: backslash and newline escaped.
std::string escape_help(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{}", v);  // the shortest text that reads back as v
}

}  // namespace

void PromText::gauge(std::string_view name, std::string_view help, double value, Labels labels) {
  sample(name, help, "gauge", value, labels);
}

void PromText::counter(std::string_view name, std::string_view help, double value, Labels labels) {
  sample(name, help, "counter", value, labels);
}

void PromText::sample(std::string_view name, std::string_view help, std::string_view type, double value,
                      Labels labels) {
  if (!declared_.contains(name)) {
    declared_.emplace(std::string(name), true);
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(help), name, type);
  }
  out_ += name;
  if (labels.size() > 0) {
    out_ += '{';
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!first) out_ += ',';
      first = false;
      out_ += fmt::format("{}=\"{}\"", k, escape_label(v));
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += number(value);
  out_ += '\n';
}

base::Result<ListenAddress> parse_listen(std::string_view text, bool allow_remote) {
  const auto bad = [&](std::string_view why) { return base::make_error(EINVAL, fmt::format("\"{}\": {}", text, why)); };
  ListenAddress a;
  std::string_view host;
  std::string_view port;
  if (text.starts_with('[')) {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("expected [ADDRESS]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    a.ipv6 = true;
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("expected HOST:PORT");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  auto p = base::parse_int<std::uint16_t>(port);
  if (!p) return bad("the port must be an integer in 0..65535");
  a.port = *p;
  if (host == "localhost") host = "127.0.0.1";
  if (a.ipv6) {
    in6_addr addr{};
    if (inet_pton(AF_INET6, std::string(host).c_str(), &addr) != 1) return bad("not an IPv6 address");
    if (!allow_remote && !IN6_IS_ADDR_LOOPBACK(&addr)) {
      return bad(
          "must be a loopback address ([::1]) unless [metrics] allow_remote = true: the metrics are not "
          "authenticated");
    }
  } else {
    in_addr addr{};
    if (inet_pton(AF_INET, std::string(host).c_str(), &addr) != 1) return bad("not an IPv4 address");
    if (!allow_remote && (ntohl(addr.s_addr) >> 24) != 127) {
      return bad(
          "must be a loopback address (127.0.0.0/8 or [::1]) unless [metrics] allow_remote = true: the metrics are "
          "not authenticated");
    }
  }
  a.host = std::string(host);
  return a;
}

base::Result<MetricsEndpoint> MetricsEndpoint::open(const ListenAddress& address, std::uint16_t source) {
  const std::string what = address.ipv6 ? fmt::format("[{}]:{}", address.host, address.port)
                                        : fmt::format("{}:{}", address.host, address.port);
  MetricsEndpoint e;
  e.source_ = source;
  e.listen_ =
      base::UniqueFd(::socket(address.ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!e.listen_) return base::errno_error("metrics: socket");
  const int one = 1;
  (void)::setsockopt(e.listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (address.ipv6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(address.port);
    (void)inet_pton(AF_INET6, address.host.c_str(), &s6->sin6_addr);
    len = sizeof *s6;
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(address.port);
    (void)inet_pton(AF_INET, address.host.c_str(), &s4->sin_addr);
    len = sizeof *s4;
  }
  if (::bind(e.listen_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return base::errno_error("metrics: bind " + what);
  }
  if (::listen(e.listen_.get(), 16) != 0) return base::errno_error("metrics: listen on " + what);
  len = sizeof ss;
  if (::getsockname(e.listen_.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return base::errno_error("metrics: getsockname");
  }
  const std::uint16_t port = address.ipv6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                          : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  e.bound_ = address.ipv6 ? fmt::format("[{}]:{}", address.host, port) : fmt::format("{}:{}", address.host, port);
  return e;
}

void MetricsEndpoint::arm(Uring& uring) { uring.accept(listen_.get(), Tag{Op::kMetricsAccept, 0, source_}); }

void MetricsEndpoint::on(Tag tag, int res, Uring& uring, base::Time now, const MetricsRender& render) {
  if (tag.op == Op::kMetricsAccept) {
    if (res >= 0) {
      if (conns_.size() >= kMaxConnections) {
        // The oldest waiting connection makes room (ids grow with time).
        ++errors_;
        close_conn(conns_.begin()->first, uring);
      }
      const std::uint32_t id = next_++;
      Conn& c = conns_[id];
      c.fd = base::UniqueFd(res);
      c.since = now;
      uring.poll_in(c.fd.get(), Tag{Op::kMetricsConn, id, source_});
    }
    arm(uring);
    return;
  }
  auto it = conns_.find(tag.client);
  if (it == conns_.end()) return;  // closed meanwhile
  Conn& c = it->second;
  char buf[2048];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      c.buf.append(buf, static_cast<std::size_t>(n));
      if (c.buf.size() > kMaxRequest) break;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      close_conn(it->first, uring);  // the peer left, or the socket failed
      return;
    }
    if (errno == EAGAIN) break;
  }
  if (c.buf.find("\r\n\r\n") == std::string::npos && c.buf.find("\n\n") == std::string::npos &&
      c.buf.size() <= kMaxRequest) {
    uring.poll_in(c.fd.get(), Tag{Op::kMetricsConn, it->first, source_});  // more of the request to come
    return;
  }
  respond(c, render);
  conns_.erase(it);  // its poll completed: nothing armed
}

void MetricsEndpoint::respond(Conn& c, const MetricsRender& render) {
  int status = 200;
  std::string reason = "OK";
  std::string body;
  std::string type = "text/plain; version=0.0.4; charset=utf-8";
  const std::string_view req(c.buf);
  const std::string_view line = req.substr(0, req.find('\n'));
  const auto parts = base::split(base::trim(line), ' ', true);
  if (c.buf.size() > kMaxRequest) {
    status = 431;
    reason = "Request Header Fields Too Large";
  } else if (parts.size() != 3 || !parts[2].starts_with("HTTP/1.")) {
    status = 400;
    reason = "Bad Request";
  } else if (parts[0] != "GET" && parts[0] != "HEAD") {
    status = 405;
    reason = "Method Not Allowed";
  } else if (parts[1] != "/metrics" && !parts[1].starts_with("/metrics?")) {
    status = 404;
    reason = "Not Found";
  }
  if (status == 200) {
    if (auto text = render()) {
      body = std::move(*text);
      ++scrapes_;
    } else {
      status = 503;
      reason = "Service Unavailable";
      body = fmt::format("503 {}: {}\n", reason, text.error().message());
      type = "text/plain; charset=utf-8";
      ++errors_;
    }
  } else {
    body = fmt::format("{} {}: tandemd serves GET /metrics\n", status, reason);
    type = "text/plain; charset=utf-8";
    ++errors_;
  }
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                status, reason, type, body.size());
  if (parts.empty() || parts[0] != "HEAD") out += body;
  // One non-blocking write into a send buffer sized for it: a scraper that
  // does not read gets a short response, never a stalled daemon.
  const int size = static_cast<int>(std::min<std::size_t>(out.size() + 4096, 8u << 20));
  (void)::setsockopt(c.fd.get(), SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  const ssize_t n = ::send(c.fd.get(), out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0 || static_cast<std::size_t>(n) != out.size()) ++errors_;
}

void MetricsEndpoint::expire(Uring& uring, base::Time now) {
  std::vector<std::uint32_t> old;
  for (const auto& [id, c] : conns_) {
    if (now - c.since > kTimeout) old.push_back(id);
  }
  for (std::uint32_t id : old) {
    ++errors_;
    close_conn(id, uring);
  }
}

void MetricsEndpoint::close_conn(std::uint32_t id, Uring& uring) {
  // Its POLLIN holds a reference to the file: cancel before closing. A late
  // completion finds no connection and is dropped.
  uring.cancel(Tag{Op::kMetricsConn, id, source_});
  conns_.erase(id);
}

void MetricsEndpoint::close_all(Uring& uring) {
  while (!conns_.empty()) close_conn(conns_.begin()->first, uring);
  uring.cancel(Tag{Op::kMetricsAccept, 0, source_});
}

std::string MetricsEndpoints::Slot::listen() const {
  if (endpoint) return endpoint->address();
  return error.empty() ? std::string("off") : "off: " + error;
}

MetricsEndpoints MetricsEndpoints::open(std::string_view listen, bool allow_remote,
                                        const std::map<std::string, std::string>& engines) {
  MetricsEndpoints out;
  const auto start = [&](Slot& slot, std::uint16_t source) {
    if (slot.asked.empty()) return;
    auto address = parse_listen(slot.asked, allow_remote);  // validated with the config
    auto endpoint = address ? MetricsEndpoint::open(*address, source) : std::unexpected(std::move(address.error()));
    if (endpoint) {
      slot.endpoint.emplace(std::move(*endpoint));
    } else {
      slot.error = endpoint.error().message();
      if (slot.name.empty()) {
        spdlog::warn("{}; serving metrics only through tandemctl metrics", slot.error);
      } else {
        spdlog::warn("{}; engine \"{}\" has no scrape endpoint of its own", slot.error, slot.name);
      }
    }
  };
  out.node_.asked = std::string(listen);
  start(out.node_, 0);
  for (const auto& [name, address] : engines) {
    if (out.engines_.size() == kMaxEngines) break;  // the config refuses more
    Slot& slot = out.engines_.emplace_back();
    slot.name = name;
    slot.asked = address;
    start(slot, static_cast<std::uint16_t>(out.engines_.size()));
  }
  return out;
}

void MetricsEndpoints::arm(Uring& uring) {
  if (node_.endpoint) node_.endpoint->arm(uring);
  for (Slot& e : engines_) {
    if (e.endpoint) e.endpoint->arm(uring);
  }
}

void MetricsEndpoints::on(Tag tag, int res, Uring& uring, base::Time now, const Renderers& render) {
  if (tag.source == 0) {
    if (node_.endpoint) {
      node_.endpoint->on(tag, res, uring, now, [&]() -> base::Result<std::string> { return render.node(); });
    }
    return;
  }
  if (tag.source > engines_.size()) return;  // not ours: nothing armed it
  Slot& e = engines_[tag.source - 1];
  if (e.endpoint) e.endpoint->on(tag, res, uring, now, [&] { return render.engine(e.name); });
}

void MetricsEndpoints::expire(Uring& uring, base::Time now) {
  if (node_.endpoint) node_.endpoint->expire(uring, now);
  for (Slot& e : engines_) {
    if (e.endpoint) e.endpoint->expire(uring, now);
  }
}

void MetricsEndpoints::close_all(Uring& uring) {
  if (node_.endpoint) node_.endpoint->close_all(uring);
  for (Slot& e : engines_) {
    if (e.endpoint) e.endpoint->close_all(uring);
  }
}

}  // namespace tandem::daemon
