// tandem-engine-emu's engine: sim::Engine driven in real time on one thread,
// backed by a real KV block pool, reporting to tandemd through libtandem
// (docs/testbed.md).
//
// HTTP worker threads hand rounds to the engine thread through a
// mutex-protected inbox and a condition variable, and wait on their Job for
// tokens. The engine thread alone owns the tandem handle, sim::Engine, the
// block pool and the session table. Its loop, every iteration:
//
//   take new rounds from the inbox → tandem_round_submit, hold them;
//   tandem_poll(0) → apply PIN/UNPIN/DROP/OFFLOAD to the engine;
//   held rounds whose session is runnable (tandem_session_runnable) go to
//   sim::Engine; a step that has ended is finished (tokens, first tokens,
//   round ends go to the waiting Jobs and to the daemon); a new step starts,
//   and its modelled duration ÷ speedup is when it ends (CLOCK_MONOTONIC);
//   with a GPU plane, each step is a forward pass: tandem_gpu_begin_pass
//   follows the partition tandemd chose (reported, not modelled: sim::Engine's
//   step times do not depend on SMs);
//   KV stats to the daemon at most every 10 ms;
//   sleep until the step ends, a new round arrives, or 2 ms pass (so
//   directives and admissions are seen within 2 ms while idle).
//
// Virtual time is real monotonic time: pins' deadlines and arrival times are
// CLOCK_MONOTONIC. Only step durations are scaled by --speedup; offload copy
// times (the PCIe link model) are not.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <tandem/tandem.h>
#include <tandem/tandem_gpu.h>

#include "base/clock.h"
#include "base/result.h"
#include "sim/engine.h"
#include "sim/metrics.h"
#include "sim/preset.h"
#include "testbed/front.h"
#include "testbed/job_inbox.h"
#include "testbed/kv_hashes.h"
#include "testbed/kv_pool.h"
#include "testbed/prompt.h"
#include "testbed/step_adapter.h"
#include "testbed/step_pacer.h"

namespace tandem::testbed {

using base::Duration;
using base::Time;

struct EmulatorConfig {
  sim::Preset preset;  // with the command line's overrides applied
  sim::EngineLimits limits;
  double speedup = 1.0;
  std::size_t kv_block_bytes = 4096;
  std::string name;        // this engine's name, for anonymous session names
  bool kv_events = false;  // report block hashes to the daemon (tandem_kv_blocks_report)
};

// The GPU plane's pool for `client` (an engine handle): libtandem's generated
// two-stage pool (decode 16..64 SMs in steps of 8, prefill the rest) plus the
// whole device as the last partition, on `backend` ("sim", "auto", "cuda").
// The error names the backend and why tandem_gpu_open failed.
base::Result<tandem_gpu*> open_gpu_plane(tandem_client* client, const std::string& backend);
// "backend sim (DEVICE, 132 SMs), 8 partitions, decode 16..132 SMs".
std::string describe_gpu_plane(const tandem_gpu* gpu);

// Thread-safety: submit(), stats_json(), connected(), drain() from any thread;
// everything else runs on the engine thread.
class Emulator final : public CompletionEngine, public sim::EngineHost, public sim::KvObserver {
 public:
  // Takes ownership of `client` and `gpu` (may be NULL: no GPU plane; opened
  // on `client`), both closed by the destructor once the engine thread has
  // ended, the pool before the client. On failure the caller keeps them.
  // EINVAL for a bad config (the preset is validated) or a pool without
  // "prefill" and "decode" stages, ENOMEM if the KV pool cannot be mapped.
  static base::Result<std::unique_ptr<Emulator>> create(EmulatorConfig config, tandem_client* client,
                                                        tandem_gpu* gpu = nullptr);
  ~Emulator() override;
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  void start();  // the engine thread
  SubmitStatus submit(std::shared_ptr<Job> job) override;
  // Stops taking rounds; lets rounds in flight finish for up to `grace`, then
  // fails the rest (503) and ends the engine thread. Idempotent.
  void drain(Duration grace);

  std::string stats_json() const override;  // the snapshot the engine thread last published
  bool connected() const override { return connected_.load(std::memory_order_relaxed); }
  const sim::Preset& preset() const { return config_.preset; }
  std::string_view model() const override { return config_.preset.name; }
  RequestLimits limits() const override;

  // sim::EngineHost (engine thread).
  void first_token(sim::EngineId engine, const sim::RoundWork& work, Time now) override;
  void token(sim::EngineId engine, const sim::RoundWork& work, std::uint32_t output_tokens, Time now) override;
  void round_done(sim::EngineId engine, const sim::RoundWork& work, std::uint32_t blocks, std::uint32_t context_tokens,
                  Time now) override;
  void kv_changed(sim::EngineId engine, sim::SessionId session, sched::KvChange change, std::uint32_t blocks,
                  Time now) override;
  // sim::KvObserver (engine thread): forwards to the pool, notes when a round is first scheduled.
  void moved(sim::SessionId session, sim::KvPlace from, sim::KvPlace to, std::uint32_t blocks) override;
  void computed(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) override;
  void reloaded(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens) override;

 private:
  struct Session {
    std::string name;
    sim::SessionId id = 0;
    bool anonymous = false;
    bool closed = false;           // CLOSE came while a round was in flight: forgotten when it ends
    std::uint32_t next_round = 0;  // index of the next round (0-based, as submitted)
    SessionHistory history;
    sim::SessionContent content;  // at a stable address: the engine points at it
    // The round in flight.
    std::shared_ptr<Job> job;
    bool held = false;  // submitted to the daemon, not yet to the engine
    std::uint32_t round = 0;
    std::uint32_t shared = 0;
    Time submitted{};
    Time first_scheduled{};
  };

  Emulator(EmulatorConfig config, tandem_client* client, tandem_gpu* gpu, std::uint32_t prefill_stage,
           std::uint32_t decode_stage, std::unique_ptr<BlockPool> pool);
  void run();
  void begin_pass();
  void accept(std::shared_ptr<Job> job, Time now);
  void apply(const tandem_directive& d, Time now);
  void release_runnable(Time now);
  void end_round(Session& s);               // the Job is answered: free the session for its next round
  void close(sim::SessionId id, Time now);  // CLOSE: forget the session and free its KV
  // The pool, behind the block-hash reporter with --kv-events.
  sim::KvObserver& kv_observer() { return kv_hashes_ ? static_cast<sim::KvObserver&>(*kv_hashes_) : *pool_; }
  void report_stats(Time now);
  void publish(Time now);
  void fail_all(int status, const std::string& message);
  Session* find(sim::SessionId id);

  EmulatorConfig config_;
  tandem_client* client_;
  tandem_gpu* gpu_;  // NULL: --gpu off; the engine thread's once it runs
  std::uint32_t prefill_stage_ = 0, decode_stage_ = 0;
  std::unique_ptr<BlockPool> pool_;
  base::MonotonicClock clock_;
  TandemStepScheduler scheduler_;
  sim::RunCounters counters_;
  sim::Engine engine_;

  // Shared with HTTP threads.
  JobInbox inbox_;
  std::atomic<bool> connected_{false};
  std::thread thread_;

  // Engine thread only.
  std::unordered_map<sim::SessionId, Session> sessions_;
  // --kv-events: the prefix cache's block hashes to the daemon (null: off).
  std::unique_ptr<KvHashReporter> kv_hashes_;
  std::vector<sim::SessionId> held_;  // sessions with a held round, in arrival order
  std::optional<Time> step_end_;      // real time the step in progress ends
  Duration step_real_{};
  StepPacer pacer_;  // the steps' sleeps, late wake-ups made up (testbed/step_pacer.h)
  Time last_report_{};
  Time last_publish_{};
  std::uint64_t anon_next_ = 1;
  std::uint64_t rounds_submitted_ = 0, rounds_done_ = 0, rounds_failed_ = 0;
  std::uint64_t directives_[10] = {};  // by type − TANDEM_DIR_ADMIT
  std::uint64_t report_errors_ = 0;
  std::uint64_t passes_ = 0;        // tandem_gpu_begin_pass calls (one per step)
  std::uint64_t out_of_range_ = 0;  // of which the daemon's index was out of range (-ERANGE)
};

}  // namespace tandem::testbed
