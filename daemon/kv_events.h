// KV events for routers (docs/daemon.md "KV events for routers"): the block
// hashes engines report in KV_BLOCKS records, published over ZMQ in vLLM's
// KV event format so that llm-d's KV-cache indexer and NVIDIA Dynamo's ZMQ
// relay can follow what each engine holds.
//
// Format ([kv_events §1–§3], docs/sources.md: vLLM vllm/distributed/kv_events.py and its subscriber example
// examples/online_serving/kv_events_subscriber.py, v0.10–v0.11 line; the
// decoder of llm-d-kv-cache-manager pkg/kvcache/kvevents/events.go and
// pool.go reads the same): msgspec `array_like` structs, so every struct is
// a msgpack array and a tagged event is [tag, fields…]:
//
//   KVEventBatch  = [ts (float64, Unix seconds), [event, …]]
//   BlockStored   = ["BlockStored", [hash, …], parent | nil, [] (token_ids),
//                    block_size, nil (lora_id), "GPU" | "CPU" (medium),
//                    nil (lora_name)]
//   BlockRemoved  = ["BlockRemoved", [hash, …], "GPU" | "CPU"]
//
// Hashes are msgpack unsigned integers (vLLM's ExternalBlockHash may be an
// int; llm-d decodes []uint64). The batch leaves data_parallel_rank out
// (optional in vLLM's struct, and llm-d accepts two-element batches).
// token_ids is always empty: records do not carry token ids (ipc/records.h
// KV_BLOCKS). lora_name is sent as nil: newer vLLM decoders require the
// field, older ones ignore trailing fields.
//
// Transport (vLLM ZmqEventPublisher): a PUB socket, each batch one
// multipart message [topic, seq as 8 bytes big-endian, payload]. tandemd
// keeps one sequence per engine, counting every batch it built, so a batch
// dropped at the high-water mark shows as a gap. Sending never blocks:
// ZMQ_XPUB_NODROP makes a full queue answer EAGAIN under ZMQ_DONTWAIT
// instead of dropping silently, and the caller counts the drop. libzmq runs
// one I/O thread of its own; it shares nothing with the daemon's loop but
// the socket's queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "daemon/config.h"
#include "ipc/records.h"

namespace tandem::daemon {

// One vLLM event being built.
struct KvBlockEvent {
  ipc::KvBlocksOp op = ipc::KvBlocksOp::kStored;
  ipc::KvMedium medium = ipc::KvMedium::kGpu;
  std::optional<std::uint64_t> parent;  // BlockStored only
  std::uint32_t block_size = 0;         // BlockStored only
  std::vector<std::uint64_t> hashes;
};

// "GPU" or "CPU", vLLM's medium strings.
std::string_view medium_name(ipc::KvMedium medium);

// The msgpack bytes of a KVEventBatch of `events` stamped `ts` (Unix seconds).
std::string encode_kv_batch(double ts, std::span<const KvBlockEvent> events);

// Checks an endpoint tandemd can bind or connect a PUB socket to:
// tcp://HOST:PORT (HOST a name, an IPv4 address, [IPv6] or *; PORT 1..65535)
// or ipc:///absolute/path (at most 107 bytes). Errors (EINVAL) say what is
// wrong with it.
base::Result<void> check_kv_endpoint(std::string_view endpoint);

// Checks a topic pattern: printable ASCII, at most kMaxTopicBytes, "{engine}"
// the only placeholder.
inline constexpr std::size_t kMaxTopicBytes = 256;
base::Result<void> check_kv_topic(std::string_view pattern);
// The topic of one engine: `pattern` with "{engine}" replaced by its name.
std::string kv_topic(std::string_view pattern, std::string_view engine);

// Bounds of what one engine's records can make the daemon hold between
// flushes: the batch is published when either is reached.
inline constexpr std::size_t kMaxKvBatchEvents = 256;
inline constexpr std::size_t kMaxKvBatchHashes = 2048;

// One engine's events since the last flush. Consecutive records of one
// session and op join one event: stored records when each names the last
// hash of the one before as its parent (the chain libtandem splits), removed
// records when their medium matches. Thread-safety: one thread.
class KvEventBatch {
 public:
  // Whether adding a record could pass the bounds: flush first.
  bool full() const {
    return events_.size() >= kMaxKvBatchEvents || hashes_ + ipc::kKvBlocksPerRecord > kMaxKvBatchHashes;
  }
  bool empty() const { return events_.empty(); }
  std::size_t events() const { return events_.size(); }
  // REQUIRES: !full(); `r` validated by ipc::RecordDecoder.
  void add(const ipc::KvBlocks& r, std::uint64_t session);
  // The encoded batch; the batch is empty afterwards.
  std::string take(double ts);

 private:
  std::vector<KvBlockEvent> events_;
  std::uint64_t last_session_ = 0;
  std::size_t hashes_ = 0;
};

// The PUB socket. Thread-safety: one thread.
class KvPublisher {
 public:
  // Binds (or with `connect`, connects) a PUB socket with high-water mark
  // `hwm` messages. Errors name the endpoint and libzmq's reason
  // ("bind tcp://127.0.0.1:5557: Address already in use").
  static base::Result<std::unique_ptr<KvPublisher>> open(const std::string& endpoint, bool connect, int hwm);
  ~KvPublisher();
  KvPublisher(const KvPublisher&) = delete;
  KvPublisher& operator=(const KvPublisher&) = delete;

  // Queues [topic, seq (8 bytes big-endian), payload] without blocking.
  // False when the queue is at its high-water mark or libzmq failed.
  bool send(std::string_view topic, std::uint64_t seq, std::string_view payload);

 private:
  KvPublisher(void* context, void* socket) : context_(context), socket_(socket) {}
  void* context_;
  void* socket_;
};

// [kv_events] as tandemd runs it: the PUB socket (none when off, or when it
// could not be had: that costs only this, logged once and said in state()),
// and each engine's batch published through it. What one engine can make it
// hold is its batch, bounded by kMaxKvBatchEvents and kMaxKvBatchHashes
// (published when full) and by the records it may send at all.
//
// Thread-safety: one thread.
class KvEventsOut {
 public:
  KvEventsOut() = default;
  // Opens the socket `config` names (nothing when its endpoint is empty).
  explicit KvEventsOut(const KvEventsConfig& config);
  bool on() const { return !config_.endpoint.empty(); }
  // "off", "bind tcp://…" / "connect tcp://…", or "off: <why>".
  const std::string& state() const { return state_; }
  // What published() and dropped() count: events (not batches).
  struct Sent {
    std::size_t published = 0;
    std::size_t dropped = 0;
  };
  // One KV_BLOCKS record of an engine into its `batch` (nothing when off);
  // a full batch is published first.
  Sent add(KvEventBatch& batch, std::uint64_t& seq, std::string_view engine, const ipc::KvBlocks& r,
           std::uint64_t session);
  // Publishes `batch` as engine `engine`'s next (`seq`, counted even when
  // dropped, so subscribers see the gap).
  Sent flush(KvEventBatch& batch, std::uint64_t& seq, std::string_view engine);

 private:
  KvEventsConfig config_;  // as the daemon started with it (a reload applies a change at the next start)
  std::unique_ptr<KvPublisher> publisher_;
  std::string state_ = "off";
};

}  // namespace tandem::daemon
