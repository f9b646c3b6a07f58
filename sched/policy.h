// The two halves of a policy (docs/architecture.md "Policies").
//
// ControlPolicy — node level, in the daemon's control loop (and the
// simulator's): fed every event, asked to tick() every control_interval, and
// answers with Actions (admit, pause, restore, priorities, pins, CPU weights,
// SM partitions, kills).
//
// StepScheduler — engine level, called once per engine step with a snapshot
// of the engine's queue and KV pool (StepInput); answers with a StepPlan:
// which requests run with how many tokens (prefill chunks), which running
// requests are preempted by recompute, which pinned sessions are released.
// It also decides, at each round end, what happens to that round's KV while
// its tool runs (release to the prefix cache, pin, offload, drop).
//
// Both halves are pure: time is an argument, nothing reads a clock or makes a
// syscall, and the same inputs give the same outputs.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "sched/actions.h"
#include "sched/model.h"
#include "sched/types.h"

namespace tandem::sched {

// Thread-safety: one thread (the host's control loop).
class ControlPolicy {
 public:
  virtual ~ControlPolicy() = default;
  virtual std::string_view name() const = 0;
  // Every event, after the host applied it to `model`.
  virtual void on_event(const Event& /*event*/, const NodeModel& /*model*/, Time /*now*/) {}
  // Every control interval.
  virtual void tick(const NodeModel& model, Time now, Actions& out) = 0;
  // The admission window (sessions allowed to reason at once), for
  // policies that keep one (MARS's AIMD); none for those that admit all.
  virtual std::optional<std::uint32_t> admission_window() const { return std::nullopt; }
};

// ---- step scheduling --------------------------------------------------------

enum class RequestPhase : std::uint8_t {
  kWaiting,    // not yet scheduled (or restored after a pause)
  kRunning,    // in the running batch
  kPreempted,  // preempted by recompute, waiting again
};

// One request (one round of one session) in an engine's queue.
struct StepRequest {
  std::uint64_t id = 0;  // engine's request id
  SessionId session = 0;
  std::uint32_t round = 0;
  RequestPhase phase = RequestPhase::kWaiting;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_output_tokens = 0;  // 0 = unknown
  std::uint32_t computed_tokens = 0;    // tokens whose KV exists (prompt prefix, then generated)
  std::uint32_t output_tokens = 0;      // generated so far
  std::uint32_t cached_tokens = 0;      // waiting: prefix-cache hit available now
  // Blocks it has without drawing on the free pool: its allocation when
  // running; when waiting, the part of its prefix hit that other requests
  // still reference (a hit on free-but-cached blocks takes them off the free
  // list, so those count as needed, as in vLLM's allocate_slots()).
  std::uint32_t blocks_held = 0;
  Time arrival{};
  Time last_scheduled{};      // zero if never
  std::uint8_t priority = 0;  // control plane's hint (MLFQ level), 0 = highest
  bool last_round = false;    // no tool follows this round (when known)

  // Tokens whose KV this request starts the step with: its computed tokens
  // when running; when waiting, its prefix hit capped at prompt − 1 (vLLM
  // always recomputes the last prompt token to get logits).
  std::uint32_t start_tokens() const {
    if (phase == RequestPhase::kRunning) return computed_tokens;
    return prompt_tokens > 0 && cached_tokens >= prompt_tokens ? prompt_tokens - 1 : cached_tokens;
  }
  bool in_prefill() const { return start_tokens() < prompt_tokens; }
  // Tokens to compute next: the prefill remainder, or one decode token.
  std::uint32_t tokens_wanted() const {
    std::uint32_t base = start_tokens();
    return base < prompt_tokens ? prompt_tokens - base : 1;
  }
};

// KV held for a session between its rounds.
struct PinnedKv {
  SessionId session = 0;
  std::uint32_t blocks = 0;
  Time pinned_at{};
  Time until{};
};

struct StepInput {
  std::uint32_t token_budget = 8192;
  std::uint32_t max_seqs = 256;
  std::uint32_t block_size = 16;
  std::uint32_t free_blocks = 0;  // includes free-but-cached blocks; excludes pinned
  std::uint32_t max_model_len = 131072;
  // Tokens from which a step is compute-bound: below it, weight streaming
  // (and, for MoE, expert loading) dominates and a step costs about the same
  // whatever it computes. From the engine's profile; 0 = unknown.
  std::uint32_t saturating_tokens = 0;
  // Running requests in running order first, then waiting and preempted ones
  // in arrival order. Indices into this span identify requests in the plan.
  std::span<const StepRequest> requests;
  std::span<const PinnedKv> pinned;
};

struct ScheduledChunk {
  std::uint32_t request = 0;  // index into StepInput::requests
  std::uint32_t tokens = 0;
  friend bool operator==(const ScheduledChunk&, const ScheduledChunk&) = default;
};

struct StepPlan {
  std::vector<ScheduledChunk> run;
  std::vector<std::uint32_t> preempt;  // indices of running requests to preempt (recompute)
  // Indices of running requests to preempt by swapping: their KV is copied
  // to host memory before it is freed, and reloaded when they run again
  // (vLLM V0's swap). An engine without host memory treats them as `preempt`.
  // A request is in at most one of `preempt` and `swap`.
  std::vector<std::uint32_t> swap;
  std::vector<SessionId> unpin;  // pinned sessions whose KV is released
  void clear() {
    run.clear();
    preempt.clear();
    swap.clear();
    unpin.clear();
  }
};

// What to do with a finished round's KV while its tool runs.
enum class KeepDecision : std::uint8_t {
  kRelease,  // free it to the prefix cache (LRU decides its fate): vLLM's default
  kPin,      // hold it until `until` (or until unpinned)
  kOffload,  // copy it to host memory
  kDrop,     // free it and evict it now
};

struct RoundEndInfo {
  SessionId session = 0;
  bool tool_follows = false;
  ToolKind tool = 0;                       // 0 = unknown
  std::uint32_t context_tokens = 0;        // prompt + output of the round
  std::uint32_t blocks = 0;                // KV it holds
  std::uint32_t other_running_tokens = 0;  // context of the other running requests
};

struct KeepPlan {
  KeepDecision decision = KeepDecision::kRelease;
  Time until{};
};

// Thread-safety: one thread (the engine's scheduling loop).
class StepScheduler {
 public:
  virtual ~StepScheduler() = default;
  virtual std::string_view name() const = 0;
  // One engine step. `out` arrives cleared.
  virtual void plan(const StepInput& in, Time now, StepPlan& out) = 0;
  virtual KeepPlan on_round_end(const RoundEndInfo& /*info*/, Time /*now*/) { return {}; }
  virtual void on_tool_end(SessionId /*session*/, ToolKind /*kind*/, Duration /*wall*/, Time /*now*/) {}
  virtual void on_session_end(SessionId /*session*/, Time /*now*/) {}
};

// The pinned sessions that also have a queued (not running) request in a
// step's input, for "is this pin's session about to resume?". Built on the
// first question of a step, so a step that asks none pays nothing. Queued
// requests usually outnumber pins (about 120 to 12 in docs/results.md's
// 1,000-session speed run), so the build sorts the pins, not the queue, and
// a 256-bit filter of the pinned sessions turns most queued requests away
// before any search. Kept by a scheduler across steps so building it
// allocates nothing once warm. Thread-safety: a value type; `in` must
// outlive the step's questions.
class QueuedPins {
 public:
  // Starts a step: forgets the last step's answers.
  void start(const StepInput& in) {
    in_ = &in;
    built_ = false;
  }
  // True if `s` is pinned in the step's input and has a queued request there.
  bool contains(SessionId s) {
    if (!built_) build();
    return std::binary_search(ids_.begin(), ids_.end(), s);
  }

 private:
  // A session's bit in the filter: the top 8 bits of a multiplicative hash.
  static std::uint32_t bit(SessionId s) { return static_cast<std::uint32_t>((s * 0x9E3779B97F4A7C15ULL) >> 56); }
  bool maybe_pinned(SessionId s) const {
    const std::uint32_t b = bit(s);
    return (filter_[b / 64] >> (b % 64) & 1) != 0;
  }
  void build() {
    built_ = true;
    ids_.clear();
    if (in_ == nullptr || in_->pinned.empty()) return;
    pins_.clear();
    filter_ = {};
    for (const PinnedKv& p : in_->pinned) {
      pins_.push_back(p.session);
      const std::uint32_t b = bit(p.session);
      filter_[b / 64] |= std::uint64_t{1} << (b % 64);
    }
    std::sort(pins_.begin(), pins_.end());
    for (const StepRequest& r : in_->requests) {
      if (r.phase != RequestPhase::kRunning && maybe_pinned(r.session) &&
          std::binary_search(pins_.begin(), pins_.end(), r.session)) {
        ids_.push_back(r.session);
      }
    }
    std::sort(ids_.begin(), ids_.end());
  }

  const StepInput* in_ = nullptr;
  bool built_ = false;
  std::array<std::uint64_t, 4> filter_{};
  std::vector<SessionId> pins_;  // the step's pinned sessions, sorted
  std::vector<SessionId> ids_;   // those with a queued request, sorted
};

// KV bookkeeping while a step is planned: what each decision allocates or
// frees, so a scheduler can ask "does this chunk fit?" the way vLLM's
// allocate_slots() answers it. Thread-safety: a value type.
class KvLedger {
 public:
  explicit KvLedger(const StepInput& in) : block_size_(in.block_size), free_(in.free_blocks) {}

  // Free blocks `r` needs to hold `tokens` more tokens.
  std::uint32_t blocks_needed(const StepRequest& r, std::uint32_t tokens) const {
    std::uint32_t need = blocks_for(r.start_tokens() + tokens);
    return need > r.blocks_held ? need - r.blocks_held : 0;
  }
  // Allocates for `tokens` more tokens of `r` if they fit.
  bool try_allocate(const StepRequest& r, std::uint32_t tokens) {
    std::uint32_t need = blocks_needed(r, tokens);
    if (need > free_) return false;
    free_ -= need;
    return true;
  }
  // Frees what a preempted or released request or pin held.
  void release(std::uint32_t blocks) { free_ += blocks; }
  // Takes `blocks` (≤ free_blocks()) from the free pool.
  void take(std::uint32_t blocks) { free_ -= blocks; }
  std::uint32_t free_blocks() const { return free_; }
  std::uint32_t blocks_for(std::uint32_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

 private:
  std::uint32_t block_size_;
  std::uint32_t free_;
};

// A step's chunks while it is planned: each request's chunk and the blocks
// it took, so that a victim already scheduled this step gives both back
// (policies whose victim is not always the last one admitted: autellix,
// continuum, mars). Chunks are emitted in the order they were scheduled,
// without the ones given back. Thread-safety: a value type.
class ChunkLedger {
 public:
  explicit ChunkLedger(const StepInput& in)
      : kv_(in), budget_(in.token_budget), tokens_(in.requests.size(), 0), blocks_(in.requests.size(), 0) {}

  KvLedger& kv() { return kv_; }
  std::uint32_t budget() const { return budget_; }

  // Allocates `tokens` (≥ 1) for request `index` and spends them from the
  // budget; false, changing nothing, if its blocks do not fit.
  // REQUIRES: each request is scheduled at most once a step.
  bool try_schedule(const StepRequest& r, std::uint32_t index, std::uint32_t tokens) {
    const std::uint32_t need = kv_.blocks_needed(r, tokens);
    if (!kv_.try_allocate(r, tokens)) return false;
    tokens_[index] = tokens;
    blocks_[index] = need;
    budget_ -= tokens;
    order_.push_back(index);
    return true;
  }
  // Adds `extra` tokens to the chunk already scheduled for `index` if their
  // blocks fit; false, changing nothing, if not.
  bool try_extend(const StepRequest& r, std::uint32_t index, std::uint32_t extra) {
    const std::uint32_t total = kv_.blocks_needed(r, tokens_[index] + extra);
    const std::uint32_t more = total > blocks_[index] ? total - blocks_[index] : 0;
    if (more > kv_.free_blocks() || extra > budget_) return false;
    kv_.take(more);
    blocks_[index] += more;
    tokens_[index] += extra;
    budget_ -= extra;
    return true;
  }
  // Preempts request `index`: its chunk of this step, if any, comes back to
  // the budget and its blocks — those taken this step and those it held — to
  // the ledger.
  void preempt(const StepRequest& r, std::uint32_t index) {
    budget_ += tokens_[index];
    kv_.release(blocks_[index] + r.blocks_held);
    tokens_[index] = 0;
    blocks_[index] = 0;
  }
  // Tokens scheduled for `index` this step (0: none).
  std::uint32_t tokens(std::uint32_t index) const { return tokens_[index]; }
  // Appends the chunks still scheduled, in scheduling order.
  void emit(std::vector<ScheduledChunk>& run) const {
    for (std::uint32_t i : order_) {
      if (tokens_[i] != 0) run.push_back({i, tokens_[i]});
    }
  }

 private:
  KvLedger kv_;
  std::uint32_t budget_;
  std::vector<std::uint32_t> tokens_;
  std::vector<std::uint32_t> blocks_;
  std::vector<std::uint32_t> order_;
};

}  // namespace tandem::sched
