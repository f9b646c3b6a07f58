// KV events for routers: the msgpack encoder, the per-engine batch and the
// ZMQ PUB socket (daemon/kv_events.h).
#include "daemon/kv_events.h"

#include <zmq.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tandem::daemon {
namespace {

// The few msgpack forms a batch needs (https://github.com/msgpack/msgpack/blob/master/spec.md).
class Packer {
 public:
  explicit Packer(std::string& out) : out_(out) {}

  void array(std::size_t n) {
    if (n < 16) {
      byte(0x90 | static_cast<std::uint8_t>(n));
    } else if (n <= 0xffff) {
      byte(0xdc);
      big_endian(static_cast<std::uint16_t>(n));
    } else {
      byte(0xdd);
      big_endian(static_cast<std::uint32_t>(n));
    }
  }
  void str(std::string_view s) {
    if (s.size() < 32) {
      byte(0xa0 | static_cast<std::uint8_t>(s.size()));
    } else if (s.size() <= 0xff) {
      byte(0xd9);
      byte(static_cast<std::uint8_t>(s.size()));
    } else {
      byte(0xda);
      big_endian(static_cast<std::uint16_t>(s.size()));
    }
    out_.append(s);
  }
  void uint(std::uint64_t v) {
    if (v < 128) {
      byte(static_cast<std::uint8_t>(v));
    } else if (v <= 0xff) {
      byte(0xcc);
      byte(static_cast<std::uint8_t>(v));
    } else if (v <= 0xffff) {
      byte(0xcd);
      big_endian(static_cast<std::uint16_t>(v));
    } else if (v <= 0xffffffff) {
      byte(0xce);
      big_endian(static_cast<std::uint32_t>(v));
    } else {
      byte(0xcf);
      big_endian(v);
    }
  }
  void nil() { byte(0xc0); }
  void float64(double v) {
    byte(0xcb);
    big_endian(std::bit_cast<std::uint64_t>(v));
  }

 private:
  void byte(std::uint8_t b) { out_.push_back(static_cast<char>(b)); }
  template <class T>
  void big_endian(T v) {
    for (int shift = static_cast<int>(sizeof(T) * 8) - 8; shift >= 0; shift -= 8) {
      byte(static_cast<std::uint8_t>(v >> shift));
    }
  }
  std::string& out_;
};

bool printable(std::string_view s) {
  return std::ranges::all_of(s, [](char c) { return c >= 0x20 && c <= 0x7e; });
}

std::unexpected<base::Error> bad_endpoint(std::string_view endpoint, std::string_view why) {
  return base::make_error(EINVAL, fmt::format("'{}': {}", endpoint, why));
}

}  // namespace

std::string_view medium_name(ipc::KvMedium medium) { return medium == ipc::KvMedium::kCpu ? "CPU" : "GPU"; }

std::string encode_kv_batch(double ts, std::span<const KvBlockEvent> events) {
  std::string out;
  Packer p(out);
  p.array(2);
  p.float64(ts);
  p.array(events.size());
  for (const KvBlockEvent& e : events) {
    if (e.op == ipc::KvBlocksOp::kStored) {
      p.array(8);
      p.str("BlockStored");
      p.array(e.hashes.size());
      for (std::uint64_t h : e.hashes) p.uint(h);
      if (e.parent) {
        p.uint(*e.parent);
      } else {
        p.nil();
      }
      p.array(0);  // token_ids: not carried (ipc/records.h KV_BLOCKS)
      p.uint(e.block_size);
      p.nil();  // lora_id
      p.str(medium_name(e.medium));
      p.nil();  // lora_name
    } else {
      p.array(3);
      p.str("BlockRemoved");
      p.array(e.hashes.size());
      for (std::uint64_t h : e.hashes) p.uint(h);
      p.str(medium_name(e.medium));
    }
  }
  return out;
}

base::Result<void> check_kv_endpoint(std::string_view endpoint) {
  if (endpoint.size() > 256) return (bad_endpoint(endpoint.substr(0, 32), "longer than 256 bytes"));
  if (!printable(endpoint)) return (bad_endpoint(endpoint, "not printable ASCII"));
  if (endpoint.starts_with("ipc://")) {
    const std::string_view path = endpoint.substr(6);
    if (path.empty() || path.front() != '/') {
      return (bad_endpoint(endpoint, "an ipc:// endpoint needs an absolute path"));
    }
    if (path.size() > 107) return (bad_endpoint(endpoint, "the socket path is over 107 bytes"));
    return {};
  }
  if (!endpoint.starts_with("tcp://")) {
    return (bad_endpoint(endpoint, "must be tcp://HOST:PORT or ipc:///PATH"));
  }
  const std::string_view rest = endpoint.substr(6);
  const std::size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) return (bad_endpoint(endpoint, "no :PORT"));
  const std::string_view host = rest.substr(0, colon);
  const std::string_view port = rest.substr(colon + 1);
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || value == 0 || value > 65535) {
    return (bad_endpoint(endpoint, "the port must be a number in 1..65535"));
  }
  if (host.empty()) return (bad_endpoint(endpoint, "no host (use * for every address)"));
  if (host == "*") return {};
  if (host.front() == '[') {
    const bool v6 =
        host.size() > 2 && host.back() == ']' && std::ranges::all_of(host.substr(1, host.size() - 2), [](char c) {
          return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
        });
    if (!v6) return (bad_endpoint(endpoint, "a bracketed host must be an IPv6 address"));
    return {};
  }
  const bool name = std::ranges::all_of(
      host, [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'; });
  if (!name) return (bad_endpoint(endpoint, "the host must be a name, an address, [IPv6] or *"));
  return {};
}

base::Result<void> check_kv_topic(std::string_view pattern) {
  if (pattern.size() > kMaxTopicBytes) return base::make_error(EINVAL, "longer than 256 bytes");
  if (!printable(pattern)) return base::make_error(EINVAL, "not printable ASCII");
  std::string_view rest = pattern;
  for (std::size_t open = rest.find('{'); open != std::string_view::npos; open = rest.find('{')) {
    if (!rest.substr(open).starts_with("{engine}")) {
      return base::make_error(EINVAL, "the only placeholder is {engine}");
    }
    rest.remove_prefix(open + 8);
  }
  if (rest.find('}') != std::string_view::npos) return base::make_error(EINVAL, "a '}' outside {engine}");
  return {};
}

std::string kv_topic(std::string_view pattern, std::string_view engine) {
  std::string out;
  for (std::size_t at = pattern.find("{engine}"); at != std::string_view::npos; at = pattern.find("{engine}")) {
    out.append(pattern.substr(0, at));
    out.append(engine);
    pattern.remove_prefix(at + 8);
  }
  out.append(pattern);
  return out;
}

void KvEventBatch::add(const ipc::KvBlocks& r, std::uint64_t session) {
  const auto op = static_cast<ipc::KvBlocksOp>(r.op);
  const auto medium = static_cast<ipc::KvMedium>(r.medium);
  const bool has_parent = (r.header.flags & ipc::kKvBlocksHasParent) != 0;
  const std::span<const std::uint64_t> hashes(r.hashes, r.count);
  bool joins = false;
  if (!events_.empty() && session == last_session_) {
    const KvBlockEvent& last = events_.back();
    if (last.op == op && last.medium == medium) {
      joins = op == ipc::KvBlocksOp::kRemoved ||
              (has_parent && r.parent == last.hashes.back() && r.block_size == last.block_size);
    }
  }
  if (!joins) {
    KvBlockEvent e;
    e.op = op;
    e.medium = medium;
    if (op == ipc::KvBlocksOp::kStored) {
      if (has_parent) e.parent = r.parent;
      e.block_size = r.block_size;
    }
    events_.push_back(std::move(e));
  }
  events_.back().hashes.insert(events_.back().hashes.end(), hashes.begin(), hashes.end());
  hashes_ += hashes.size();
  last_session_ = session;
}

std::string KvEventBatch::take(double ts) {
  std::string out = encode_kv_batch(ts, events_);
  events_.clear();
  hashes_ = 0;
  last_session_ = 0;
  return out;
}

base::Result<std::unique_ptr<KvPublisher>> KvPublisher::open(const std::string& endpoint, bool connect, int hwm) {
  void* context = zmq_ctx_new();
  if (context == nullptr) return base::errno_error("zmq_ctx_new");
  void* socket = zmq_socket(context, ZMQ_PUB);
  auto fail = [&](std::string_view what) {
    const int err = zmq_errno();
    std::string message = fmt::format("{} {}: {}", what, endpoint, zmq_strerror(err));
    if (socket != nullptr) zmq_close(socket);
    zmq_ctx_term(context);
    return base::make_error(err > 0 ? err : EIO, message);
  };
  if (socket == nullptr) return fail("socket for");
  const int linger = 0;
  const int nodrop = 1;
  if (zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
      zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
      zmq_setsockopt(socket, ZMQ_XPUB_NODROP, &nodrop, sizeof nodrop) != 0) {
    return fail("options of");
  }
  if (connect ? zmq_connect(socket, endpoint.c_str()) != 0 : zmq_bind(socket, endpoint.c_str()) != 0) {
    return fail(connect ? "connect" : "bind");
  }
  return std::unique_ptr<KvPublisher>(new KvPublisher(context, socket));
}

KvPublisher::~KvPublisher() {
  zmq_close(socket_);
  zmq_ctx_term(context_);  // LINGER 0: queued messages are discarded, nothing waits
}

bool KvPublisher::send(std::string_view topic, std::uint64_t seq, std::string_view payload) {
  unsigned char seq_bytes[8];
  for (int i = 0; i < 8; ++i) seq_bytes[i] = static_cast<unsigned char>(seq >> (56 - 8 * i));
  // The first part decides: once it is queued the rest of the message is
  // (libzmq queues a multipart message whole or not at all).
  if (zmq_send(socket_, topic.data(), topic.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return false;
  if (zmq_send(socket_, seq_bytes, sizeof seq_bytes, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return false;
  return zmq_send(socket_, payload.data(), payload.size(), ZMQ_DONTWAIT) >= 0;
}

KvEventsOut::KvEventsOut(const KvEventsConfig& config) : config_(config) {
  if (config.endpoint.empty()) return;
  auto publisher = KvPublisher::open(config.endpoint, config.connect, static_cast<int>(config.hwm));
  if (publisher) {
    publisher_ = std::move(*publisher);
    state_ = fmt::format("{} {}", config.connect ? "connect" : "bind", config.endpoint);
    spdlog::info("kv_events: publishing on {}", state_);
  } else {
    state_ = "off: " + publisher.error().message();
    spdlog::warn("kv_events: {}; KV events are counted as dropped", publisher.error().message());
  }
}

KvEventsOut::Sent KvEventsOut::add(KvEventBatch& batch, std::uint64_t& seq, std::string_view engine,
                                   const ipc::KvBlocks& r, std::uint64_t session) {
  if (!on()) return {};  // nothing to publish or count
  Sent sent;
  if (batch.full()) sent = flush(batch, seq, engine);
  batch.add(r, session);
  return sent;
}

KvEventsOut::Sent KvEventsOut::flush(KvEventBatch& batch, std::uint64_t& seq, std::string_view engine) {
  const std::size_t events = batch.events();
  // vLLM stamps batches with time.time(): Unix seconds, wall clock (a
  // label for subscribers; nothing here decides by it).
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string payload = batch.take(ts);
  const std::uint64_t n = seq++;  // a dropped batch leaves a gap subscribers can see
  if (publisher_ && publisher_->send(kv_topic(config_.topic, engine), n, payload)) return {events, 0};
  return {0, events};
}

}  // namespace tandem::daemon
