// One simulated inference engine: vLLM-V1-like continuous batching hosting a
// sched::StepScheduler unchanged (docs/sim.md "Engine model").
//
//   - paged KV in blocks of block_size tokens; a request holds the blocks of
//     the tokens it has computed plus the one being generated;
//   - prefix caching: a round's full blocks go, when freed, to a cache of
//     free-but-reusable blocks evicted least-recently-freed first and, within
//     a session, from its tail (vLLM frees a request's blocks tail first into
//     its free queue). Only a session's own earlier rounds share its prefix
//     (agent sessions do not share contexts with each other here);
//   - pins: KV a policy holds against eviction between rounds. While the
//     session's next round waits, the pin stays (the scheduler sees the
//     blocks as that request's, referenced, as vLLM counts a hit on blocks
//     another holder references); when the round is scheduled it takes the
//     pinned blocks over as its own prefix hit;
//   - preemption by recompute (the blocks go to the prefix cache, as in vLLM),
//     offload to host memory over PCIe (the blocks are freed to the cache when
//     the copy is done, serialised on one link per engine) and reload from it
//     (added to the step that schedules the request);
//   - step time from the preset's calibrated model.
// Planning and allocation happen when a step starts; tokens, first tokens and
// round ends are delivered when it ends.
//
// The engine checks its own conservation at every step (held + pinned +
// offloading + cached + free = pool) and counts every computed token as new
// or recomputed; violations are counted in `Engine::violations()` (a
// simulator bug or a scheduler that planned more than fits), never ignored.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/policy.h"
#include "sim/metrics.h"
#include "sim/preset.h"

namespace tandem::sim {

using sched::Duration;
using sched::EngineId;
using sched::SessionId;
using sched::Time;

// Per-session facts that outlive one engine (a session can move): owned by
// the host, one per session, at a stable address.
struct SessionContent {
  std::uint32_t computed_high = 0;  // tokens of the current content computed at least once
  std::uint32_t host_tokens = 0;    // full-block tokens with a copy in host memory
};

// One round handed to an engine.
struct RoundWork {
  SessionId session = 0;
  std::uint32_t round = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t output_tokens = 0;  // the round generates exactly this many
  std::uint32_t shared_prefix = 0;  // tokens of the prompt equal to the session's previous context
  bool last_round = false;
  sched::ToolKind tool = 0;  // the tool that follows (0: none or unknown)
  std::uint8_t priority = 0;
  Time submitted{};
  SessionContent* content = nullptr;
};

// What the engine reports to its host.
class EngineHost {
 public:
  virtual ~EngineHost() = default;
  virtual void first_token(EngineId engine, const RoundWork& work, Time now) = 0;
  // The round generated its last token; `blocks` is the KV it held.
  virtual void round_done(EngineId engine, const RoundWork& work, std::uint32_t blocks, std::uint32_t context_tokens,
                          Time now) = 0;
  virtual void kv_changed(EngineId engine, SessionId session, sched::KvChange change, std::uint32_t blocks,
                          Time now) = 0;
  // The round produced a token in the step that ended at `now`;
  // `output_tokens` counts its tokens so far (for streaming hosts, e.g.
  // tandem-engine-emu). The simulator does not need it.
  virtual void token(EngineId /*engine*/, const RoundWork& /*work*/, std::uint32_t /*output_tokens*/, Time /*now*/) {}
};

// Where a KV block is, in the engine's accounting.
enum class KvPlace : std::uint8_t {
  kFree,        // free, not reusable (not per session)
  kHeld,        // allocated to the session's queued or running request
  kPinned,      // held between rounds by a pin
  kCached,      // free but reusable as the session's prefix
  kOffloading,  // being copied to host memory
};

// Optional observer of the engine's block accounting, for a host that backs
// the counts with real memory (testbed/kv_pool.h). The engine reports every
// move of blocks between places as it happens; it never reads anything back,
// so an observer cannot change what the engine does. Blocks moving to kFree
// leave from the tail of the session's KV (the partial block, or the end of
// a cached prefix); other moves take the front (the prefix) in order.
// Thread-safety: called on the engine's thread.
class KvObserver {
 public:
  virtual ~KvObserver() = default;
  virtual void moved(SessionId session, KvPlace from, KvPlace to, std::uint32_t blocks) = 0;
  // A step computes tokens [first_token, first_token + tokens) of the
  // session's held KV (written when the step starts; blocks are allocated).
  // `samples`: the step samples the session's next token from the last of
  // them (a prefill that completes its target, or a decode).
  virtual void computed(SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) = 0;
  // A step reloads tokens [first_token, first_token + tokens) from the
  // session's host copy into its held KV.
  virtual void reloaded(SessionId session, std::uint32_t first_token, std::uint32_t tokens) = 0;
  // A preemption by swap copies tokens [0, tokens) of the session's KV to
  // host memory, before its blocks are released (moved() follows). An
  // observer that keeps no copies of its own ignores it.
  virtual void swapped(SessionId /*session*/, std::uint32_t /*tokens*/) {}
};

// Host memory for KV copies, shared by the engines of a node (CPU DRAM: any
// engine reloads a copy over its own link). A finite pool evicts the least
// recently stored or used copy to make room. Thread-safety: one thread.
class HostPool {
 public:
  // `capacity_blocks` 0: unlimited.
  explicit HostPool(std::uint64_t capacity_blocks = 0) : capacity_(capacity_blocks) {}

  // `tokens` full-block tokens of `session` (content `c`) are now in host
  // memory. Makes room by evicting other sessions' copies, least recently
  // used first. Returns false (and stores nothing) if the copy alone is
  // larger than the pool.
  bool store(SessionId session, SessionContent& c, std::uint32_t tokens, std::uint32_t block_size, Time now);
  // The copy served a reload: most recently used.
  void touch(SessionId session, Time now);
  // How long the least recently stored or used copy has been idle (zero: none).
  Duration oldest_idle(Time now) const;
  // The session's content was cut (a rewritten context) or it ended.
  void cut(SessionId session, SessionContent& c, std::uint32_t tokens, std::uint32_t block_size);
  std::uint64_t capacity_blocks() const { return capacity_; }
  std::uint64_t used_blocks() const { return used_; }
  std::uint64_t peak_blocks() const { return peak_; }
  std::uint64_t evicted_blocks() const { return evicted_; }

 private:
  struct Copy {
    SessionContent* content = nullptr;
    std::uint64_t blocks = 0;
    std::uint64_t lru_key = 0;
    Time used{};  // stored or last reloaded
  };
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t evicted_ = 0;
  std::unordered_map<SessionId, Copy> copies_;
  std::map<std::uint64_t, SessionId> lru_;
  std::uint64_t next_key_ = 1;
};

struct EngineLimits {
  std::uint32_t token_budget = 8192;
  std::uint32_t max_seqs = 1024;
  // Multiplies the time an offload takes on the host link (the engine's
  // clock, not a step). The simulator leaves it at 1; tandem-engine-emu sets
  // 1 / speedup, since it divides step times but runs offloads on real time.
  double link_time_scale = 1.0;
};

// Thread-safety: one thread (the simulation's).
class Engine {
 public:
  Engine(EngineId id, const Preset& preset, EngineLimits limits, sched::StepScheduler& scheduler, EngineHost& host,
         RunCounters& counters);
  // Its requests point into its own session table (Req::kv).
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  EngineId id() const { return id_; }
  const sched::EngineParams& params() const { return params_; }

  // A runnable round. The session's earlier KV on this engine (pinned or
  // cached) and its host copy are cut to `shared_prefix`.
  void submit(const RoundWork& work, Time now);
  // Tokens of a round's prompt that `session`'s KV here (pinned, cached or
  // copied to the host) would serve now, given the prompt shares
  // `shared_prefix` tokens with its previous context.
  std::uint32_t prefix_hit(SessionId session, std::uint32_t shared_prefix, const SessionContent& content) const;
  // Forgets a finished session's KV (pins, cache, host copy).
  void end_session(SessionId session, Time now);

  // Control-plane actions on a session's KV between rounds (no-ops when the
  // session has none here, or its round is queued or running).
  void pin(SessionId session, Time until, Time now);
  void unpin(SessionId session, Time now);
  void drop(SessionId session, Time now);
  void offload(SessionId session, Time now);

  // Ends the session's running round at the tokens it has produced so far
  // (an engine that sampled an end-of-generation token), instead of at
  // RoundWork::output_tokens: the step in progress, when it finishes,
  // delivers the round's end. Call between start_step and finish_step. No-op
  // without a running round of the session.
  void stop_round(SessionId session);
  // Removes the session's queued or running round without finishing it (a
  // real engine whose forward pass failed): its held blocks are freed, no
  // token, first token or round end is delivered for it. Callable between
  // start_step and finish_step. False when the session has no round here.
  bool abort(SessionId session, Time now);
  // Starts a step if there is runnable work and none is in progress: plans,
  // allocates and returns when it will end.
  std::optional<Time> start_step(Time now);
  // Delivers the step's tokens (first tokens, round ends).
  void finish_step(Time now);
  bool busy() const { return in_step_; }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // Offload copies finished by `now` free their blocks; the next completion.
  std::optional<Time> complete_offloads(Time now);

  sched::KvPoolStats stats() const { return stats(Time{}); }
  // With the link's backlog of offload copies at `now`.
  sched::KvPoolStats stats(Time now) const;
  std::uint32_t queued() const { return static_cast<std::uint32_t>(running_.size() + waiting_.size()); }
  std::uint64_t steps() const { return steps_; }
  // The shape of the last step started (what the step-time model priced).
  const StepShape& last_shape() const { return last_shape_; }
  std::uint64_t violations() const { return violations_; }
  const std::string& first_violation() const { return first_violation_; }
  std::uint32_t pinned_blocks() const { return pinned_blocks_; }
  std::uint32_t cached_blocks() const { return cached_total_; }
  std::uint32_t offloading_blocks() const { return offloading_blocks_; }
  // Reports block moves to `observer` (nullptr: none) from now on.
  void set_kv_observer(KvObserver* observer) { observer_ = observer; }
  // Keeps host copies in `pool` (shared by the node's engines), which may
  // evict them; without one host memory is unlimited.
  void set_host_pool(HostPool* pool) { host_pool_ = pool; }
  // Records a violation if the pool does not add up.
  void check_conservation();
  // Brings the pinned block-seconds counter up to `now` (end of a run).
  void account(Time now) { account_pinned(now); }

 private:
  struct SessKv;
  struct Req {
    sched::StepRequest r;
    SessKv* kv = nullptr;  // its session's entry in kv_
    RoundWork work;
    std::uint32_t target = 0;  // prefill target: the prompt, plus earlier output after a preemption
    bool first_token_sent = false;
    bool counted_reuse = false;
    bool produced = false;   // produced a token in the current step
    bool preempted = false;  // preempted at least once this round
  };
  struct SessKv {
    std::uint32_t cached_blocks = 0;  // free-but-cached full blocks of its prefix
    std::uint64_t lru_key = 0;        // position in lru_ (0: not there)
    std::uint32_t pinned_blocks = 0;  // blocks of its pin (0: none), mirrors pins_
    bool active = false;              // a round of it is queued or running here
    SessionContent* content = nullptr;
  };
  struct Offloading {
    SessionId session;
    std::uint32_t blocks;
    std::uint32_t tokens;
    Time done;
  };

  std::uint32_t blocks_for(std::uint64_t tokens) const {
    return static_cast<std::uint32_t>((tokens + block_size_ - 1) / block_size_);
  }
  std::uint32_t free_blocks() const { return free_uncached_ + cached_total_; }
  // Prefix hit available to a queued request now (tokens), the part of it
  // from host memory, and the blocks of its pin (0: none).
  std::uint32_t hit_tokens(const Req& q, std::uint32_t* from_host, std::uint32_t* pinned = nullptr) const;
  // To the LRU tail, from `from` (reported to the observer).
  void cache_put(SessionId s, std::uint32_t full_blocks, Time now, KvPlace from);
  std::uint32_t cache_take(SessionId s, KvPlace to);           // off the LRU; returns its blocks
  void cache_cut(SessionId s, std::uint32_t keep_blocks);      // keep only a prefix
  bool allocate(SessionId s, std::uint32_t blocks, Time now);  // for `s`, from free, evicting LRU
  // Records a host copy of `tokens` full-block tokens of `s`'s content; false
  // if host memory cannot hold it.
  bool store_host(SessionId s, SessionContent& c, std::uint32_t tokens, Time now);
  // Frees a held allocation of `kv_tokens` tokens in `blocks` blocks: full
  // blocks to the cache, the partial one to the free pool.
  void release_to_cache(SessionId s, std::uint32_t kv_tokens, std::uint32_t blocks, Time now);
  std::vector<sched::PinnedKv>::iterator find_pin(SessionId s);
  void remove_pin(std::vector<sched::PinnedKv>::iterator it, Time now);                     // blocks to the cache
  std::uint32_t take_pin(std::vector<sched::PinnedKv>::iterator it, Time now, KvPlace to);  // returns its blocks
  void add_pin(SessionId s, std::uint32_t blocks, Time now, Time until);
  bool active(SessionId s) const;
  // Frees `blocks` of `s` that were pinned or cached: nothing kept.
  std::uint32_t take_idle_kv(SessionId s, Time now, KvPlace to);
  void moved(SessionId s, KvPlace from, KvPlace to, std::uint32_t blocks) {
    if (observer_ != nullptr && blocks != 0 && from != to) observer_->moved(s, from, to, blocks);
  }
  void violation(std::string what);
  void account_pinned(Time now);

  EngineId id_;
  const Preset& preset_;
  sched::EngineParams params_;
  std::uint32_t block_size_;
  sched::StepScheduler& scheduler_;
  EngineHost& host_;
  RunCounters& counters_;
  double link_time_scale_;
  KvObserver* observer_ = nullptr;
  HostPool* host_pool_ = nullptr;

  std::vector<Req> running_;  // running order
  std::deque<Req> waiting_;   // queue order; preempted requests at the front
  std::vector<sched::PinnedKv> pins_;
  std::unordered_map<SessionId, SessKv> kv_;
  std::map<std::uint64_t, SessionId> lru_;  // least recently freed first
  std::uint64_t lru_next_ = 1;
  std::vector<Offloading> offloading_;
  Time link_free_{};

  std::uint32_t free_uncached_ = 0;
  std::uint32_t saturating_tokens_ = 0;  // from the step model, handed to every plan
  std::uint32_t cached_total_ = 0;
  std::uint32_t pinned_blocks_ = 0;
  std::uint32_t offloading_blocks_ = 0;
  std::uint64_t next_request_ = 1;

  // The step in flight.
  bool in_step_ = false;
  Time step_start_{};
  std::vector<sched::StepRequest> step_requests_;
  std::vector<bool> preempted_, scheduled_, moved_;  // per-step scratch, kept to reuse their storage
  std::vector<std::uint32_t> started_;
  sched::StepPlan plan_;
  std::uint64_t steps_ = 0;
  std::uint32_t last_step_tokens_ = 0;
  StepShape last_shape_;
  Duration last_step_time_{};

  Time pinned_since_{};
  std::uint64_t violations_ = 0;
  std::string first_violation_;
};

}  // namespace tandem::sim
