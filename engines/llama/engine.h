// tandem-llama's engine thread (docs/llama.md): llama.cpp scheduled by
// sim::Engine with the policy's step half, reporting to tandemd through
// libtandem, behind the OpenAI-style HTTP front shared with the emulator.
//
// Every session is one llama.cpp sequence in one unified KV cache. The loop,
// every iteration:
//
//   take new rounds from the inbox: their prompt tokens (a text prompt is
//   tokenized by the HTTP worker; a `prompt_tokens` round extends the
//   session's previous context with filler tokens) → tandem_round_submit,
//   held until the daemon admits them;
//   tandem_poll(0) → PIN/UNPIN/DROP/OFFLOAD on sim::Engine's ledger, which
//   the KvExecutor carries out on llama.cpp;
//   runnable held rounds go to sim::Engine, which plans the step through
//   tandem_engine_plan_step (the daemon's policy; fcfs fail-open);
//   the step's batch runs: one llama_decode over every scheduled sequence
//   (prefill chunks and decodes together), then one token is sampled per
//   sequence that completes a prefill or decodes; an end-of-generation
//   token ends its round early unless the request set ignore_eos;
//   the step finishes (tokens to the waiting Jobs, first tokens and round
//   ends to the daemon with the real counts and the measured prefill time);
//   the ledger is checked against llama.cpp's positions;
//   KV stats to the daemon at most every 10 ms.
//
// Times are real: a step lasts as long as llama_decode takes.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <tandem/tandem.h>

#include "base/clock.h"
#include "base/result.h"
#include "engines/llama/kv_executor.h"
#include "engines/llama/runtime.h"
#include "sim/engine.h"
#include "sim/metrics.h"
#include "sim/preset.h"
#include "testbed/front.h"
#include "testbed/job_inbox.h"
#include "testbed/kv_hashes.h"
#include "testbed/step_adapter.h"

namespace tandem::llama {

using base::Duration;
using base::Time;
using testbed::CompletionEngine;
using testbed::CompletionRequest;
using testbed::Job;
using testbed::RequestError;
using testbed::RequestLimits;
using testbed::SubmitStatus;

struct EngineConfig {
  std::string name;                // this engine's name, for anonymous session names
  std::uint32_t block_size = 16;   // tokens per KV block of the ledger
  std::uint32_t max_seqs = 64;     // sequences per step
  std::uint32_t token_budget = 0;  // tokens per step; 0: the context's batch size
  // Bytes of KV copies in host memory (OFFLOAD) at most; beyond, the least
  // recently used copies are forgotten. 0: no bound.
  std::uint64_t host_kv_bytes = 0;
  std::string step_log;    // JSONL of every step's shape and time ("": none)
  bool kv_events = false;  // report block hashes to the daemon (tandem_kv_blocks_report)
  // Keep a digest (xxh64) of every logits row a token is sampled from, per
  // session: what tests compare to prove two runs bit-identical.
  bool record_logits = false;
};

// Round `index` of `session` as tandem-agents sends it: greedy, the
// `prompt_tokens` extension (the context grows to that many tokens, the
// session's previous context first), exactly `max_tokens` generated. For
// hosts that drive the engine themselves (tests, engine_bench).
std::shared_ptr<Job> synthetic_round(const std::string& session, std::uint32_t index, std::uint32_t prompt_tokens,
                                     std::uint32_t max_tokens, bool tool_follows = true);

// Thread-safety: CompletionEngine's calls from any thread; the rest runs on
// the engine thread.
class LlamaEngine final : public CompletionEngine, public sim::EngineHost, public TokenSource {
 public:
  // Takes ownership of `client` (may be NULL: no daemon at all, as the
  // tests' reference runs), closed by the destructor once the engine thread
  // has ended. EINVAL for a config the context cannot honour, EIO if the
  // step log cannot be opened.
  static base::Result<std::unique_ptr<LlamaEngine>> create(EngineConfig config, std::shared_ptr<const Model> model,
                                                           std::unique_ptr<Context> ctx, tandem_client* client);
  ~LlamaEngine() override;
  LlamaEngine(const LlamaEngine&) = delete;
  LlamaEngine& operator=(const LlamaEngine&) = delete;

  void start();  // the engine thread, which runs tick() until drained

  // One iteration of the engine thread's loop, for a host that drives the
  // engine itself instead of start() (tests, engine_bench): intake, the
  // daemon's directives, at most one step, reports. kIdle: nothing ran (the
  // thread sleeps then); kDrained: drain() finished.
  enum class Tick { kIdle, kStepped, kDrained };
  Tick tick();
  // Applies a directive as if tandem_poll had returned it (tick()'s thread).
  void apply(const tandem_directive& d);
  // Stops taking rounds; lets rounds in flight finish for up to `grace`, then
  // fails the rest (503) and ends the engine thread. Idempotent.
  void drain(Duration grace);

  // CompletionEngine.
  RequestLimits limits() const override;
  std::expected<void, RequestError> prepare(CompletionRequest& r) const override;
  SubmitStatus submit(std::shared_ptr<Job> job) override;
  std::string stats_json() const override;
  bool connected() const override { return connected_.load(std::memory_order_relaxed); }
  std::string_view model() const override { return model_name_; }

  const sim::Preset& preset() const { return preset_; }
  tandem_engine_params engine_params() const;
  // The shape of the step the last tick() ran (tick()'s thread).
  const sim::StepShape& last_shape() const { return engine_.last_shape(); }

  // sim::EngineHost (engine thread).
  void first_token(sim::EngineId engine, const sim::RoundWork& work, Time now) override;
  void token(sim::EngineId engine, const sim::RoundWork& work, std::uint32_t output_tokens, Time now) override;
  void round_done(sim::EngineId engine, const sim::RoundWork& work, std::uint32_t blocks, std::uint32_t context_tokens,
                  Time now) override;
  void kv_changed(sim::EngineId engine, sim::SessionId session, sched::KvChange change, std::uint32_t blocks,
                  Time now) override;
  // TokenSource (engine thread).
  std::span<const Token> tokens(SessionId session) const override;

  // Engine thread, or any thread once the engine thread has ended (tests).
  const KvExecutor& kv() const { return *kv_; }
  // The logits digests of the session's sampled tokens, every round's in
  // order (EngineConfig::record_logits).
  std::vector<std::uint64_t> logit_digests(SessionId session) const;

 private:
  struct Session {
    std::string name;
    sim::SessionId id = 0;
    bool anonymous = false;
    bool closed = false;  // CLOSE came while its round ran: forgotten when the round ends
    std::uint32_t next_round = 0;
    std::vector<Token> context;  // the round's prompt then what it generated (the previous round's, between rounds)
    std::uint32_t prompt_tokens = 0;  // of the round in flight
    std::string prev_prompt;          // the previous round's prompt text (the `prompt_tokens` extension's rule)
    sim::SessionContent content;      // at a stable address: the engine points at it
    std::shared_ptr<Job> job;
    bool held = false;
    std::uint32_t round = 0;
    std::uint32_t shared = 0;
    std::unique_ptr<Sampler> sampler;
    std::string pending_piece;           // the token sampled this step, delivered by token()
    bool stopped = false;                // sampled an end-of-generation token
    std::vector<std::uint64_t> digests;  // EngineConfig::record_logits
    Time submitted{};
    Time first_scheduled{};
  };

  LlamaEngine(EngineConfig config, std::shared_ptr<const Model> model, std::unique_ptr<Context> ctx,
              tandem_client* client);
  void run();
  void accept(std::shared_ptr<Job> job, Time now);
  void apply(const tandem_directive& d, Time now);
  std::deque<std::shared_ptr<Job>> arrived_;  // tick()'s scratch
  std::optional<Time> seen_deadline_;         // the drain deadline as tick() last took the inbox
  void release_runnable(Time now);
  void spare_sequences(Time now);
  void forget_evicted_hosts();
  bool step(Time now);  // false: nothing to run
  void end_round(Session& s);
  void close(SessionId id, Time now);  // CLOSE: forget the session and free its KV
  void report_stats(Time now);
  void publish(Time now);
  void fail_all(int status, const std::string& message);
  Session* find(sim::SessionId id);
  const Session* find(sim::SessionId id) const;
  std::size_t block_bytes() const { return model_->kv_bytes_per_token() * preset_.block_size; }

  EngineConfig config_;
  std::shared_ptr<const Model> model_;  // shared: a host may run several contexts on one model
  std::unique_ptr<Context> ctx_;
  tandem_client* client_;
  std::string model_name_;
  sim::Preset preset_;  // the ledger's pool; its step model is unused (steps take real time)
  sim::EngineLimits limits_;
  base::MonotonicClock clock_;
  testbed::TandemStepScheduler scheduler_;
  sim::RunCounters counters_;
  std::unique_ptr<KvExecutor> kv_;
  // --kv-events: the prefix cache's block hashes to the daemon, between
  // sim::Engine and kv_ (null: off, or no daemon handle).
  std::unique_ptr<testbed::KvHashReporter> kv_hashes_;
  sim::Engine engine_;
  std::FILE* step_log_ = nullptr;
  std::mt19937_64 seeds_{std::random_device{}()};

  // Shared with HTTP threads.
  testbed::JobInbox inbox_;
  std::atomic<bool> connected_{false};
  std::thread thread_;

  // Engine thread only.
  std::unordered_map<sim::SessionId, Session> sessions_;
  std::vector<sim::SessionId> held_;
  std::vector<sim::SessionId> finished_;  // sessions over (no id, or closed) whose round ended this step
  Time last_report_{};
  Time last_publish_{};
  std::uint64_t anon_next_ = 1;
  std::uint64_t rounds_submitted_ = 0, rounds_done_ = 0, rounds_failed_ = 0, rounds_stopped_ = 0;
  std::uint64_t directives_[10] = {};  // by type − TANDEM_DIR_ADMIT
  std::uint64_t report_errors_ = 0;
  std::uint64_t decode_failures_ = 0;
  std::uint64_t seq_evictions_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t generated_ = 0, prefilled_ = 0;
  Duration last_step_{};
  double busy_s_ = 0;
  std::string first_decode_failure_;
};

}  // namespace tandem::llama
