// The emulator's engine thread: sim::Engine in real time, libtandem, the KV pool.
#include "testbed/emulator.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <deque>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace tandem::testbed {
namespace {

constexpr Duration kIdleWait = std::chrono::milliseconds(2);
constexpr Duration kReportPeriod = std::chrono::milliseconds(10);
constexpr int kMaxDirectives = 64;

int kv_kind(sched::KvChange c) {
  switch (c) {
    case sched::KvChange::kEvicted:
      return TANDEM_KV_EVICTED;
    case sched::KvChange::kRestored:
      return TANDEM_KV_RESTORED;
    case sched::KvChange::kOffloaded:
      return TANDEM_KV_OFFLOADED;
    case sched::KvChange::kDropped:
      return TANDEM_KV_DROPPED;
  }
  return TANDEM_KV_EVICTED;
}

std::uint64_t ns_since(Time from, Time to) { return to > from ? static_cast<std::uint64_t>((to - from).count()) : 0; }

// /stats "gpu": the pool, the partition the last pass ran on, switches.
nlohmann::json gpu_json(const tandem_gpu* gpu, std::uint32_t prefill_stage, std::uint32_t decode_stage,
                        std::uint64_t passes) {
  if (gpu == nullptr) return nullptr;
  tandem_gpu_info info{};
  info.sz = sizeof info;
  std::uint32_t decode = 0;
  std::uint32_t prefill = 0;
  if (tandem_gpu_info_get(gpu, &info) != 0 ||
      tandem_gpu_partition_sms(gpu, info.active_partition, decode_stage, &decode) != 0 ||
      tandem_gpu_partition_sms(gpu, info.active_partition, prefill_stage, &prefill) != 0) {
    return {{"backend", tandem_gpu_backend(gpu)}, {"error", tandem_gpu_last_error(gpu)}};
  }
  const std::uint32_t n = std::min<std::uint32_t>(info.n_partitions, TANDEM_GPU_MAX_PARTITIONS);
  return {
      {"backend", tandem_gpu_backend(gpu)},
      {"device", std::string(info.device_name)},
      {"device_sms", info.device_sms},
      {"partitions", n},
      {"decode_sms", std::vector<std::uint32_t>(info.decode_sms, info.decode_sms + n)},
      {"active_partition", info.active_partition},
      {"active_decode_sms", decode},
      {"active_prefill_sms", prefill},
      {"switches", info.switches},
      {"bad_indices", info.bad_indices},
      {"passes", passes},
  };
}

}  // namespace

// ---- the GPU plane ----------------------------------------------------------------

base::Result<tandem_gpu*> open_gpu_plane(tandem_client* client, const std::string& backend) {
  tandem_gpu_options o{};
  o.sz = sizeof o;
  o.backend = backend.c_str();
  o.full_device = 1;  // the last partition is the whole device: how the engine runs until tandemd chooses
  tandem_gpu* gpu = nullptr;
  if (const int rc = tandem_gpu_open(client, &o, &gpu); rc != 0) {
    return base::make_error(-rc, fmt::format("--gpu {}: {}", backend, tandem_gpu_last_error(nullptr)));
  }
  return gpu;
}

std::string describe_gpu_plane(const tandem_gpu* gpu) {
  tandem_gpu_info info{};
  info.sz = sizeof info;
  if (tandem_gpu_info_get(gpu, &info) != 0 || info.n_partitions == 0) {
    return fmt::format("backend {}", tandem_gpu_backend(gpu));
  }
  return fmt::format("backend {} ({}, {} SMs), {} partitions, decode {}..{} SMs", tandem_gpu_backend(gpu),
                     info.device_name, info.device_sms, info.n_partitions, info.decode_sms[0],
                     info.decode_sms[info.n_partitions - 1]);
}

// ---- Emulator -------------------------------------------------------------------

base::Result<std::unique_ptr<Emulator>> Emulator::create(EmulatorConfig config, tandem_client* client,
                                                         tandem_gpu* gpu) {
  if (auto v = sim::validate(config.preset); !v) return std::unexpected(v.error());
  if (!(config.speedup > 0) || !std::isfinite(config.speedup)) {
    return base::make_error(EINVAL, "the speedup must be a positive number");
  }
  // Steps are divided by the speedup; offloads run on the real clock, so
  // their link time is divided here to keep the two in proportion.
  config.limits.link_time_scale = 1.0 / config.speedup;
  std::uint32_t prefill = 0;
  std::uint32_t decode = 0;
  if (gpu != nullptr &&
      (tandem_gpu_stage(gpu, "prefill", &prefill) != 0 || tandem_gpu_stage(gpu, "decode", &decode) != 0)) {
    return base::make_error(EINVAL, "the GPU plane's pool has no \"prefill\" and \"decode\" stages");
  }
  auto pool = BlockPool::create(config.preset.gpu_blocks, config.preset.block_size, config.kv_block_bytes);
  if (!pool) return std::unexpected(std::move(pool.error()));
  return std::unique_ptr<Emulator>(new Emulator(std::move(config), client, gpu, prefill, decode, std::move(*pool)));
}

Emulator::Emulator(EmulatorConfig config, tandem_client* client, tandem_gpu* gpu, std::uint32_t prefill_stage,
                   std::uint32_t decode_stage, std::unique_ptr<BlockPool> pool)
    : config_(std::move(config)),
      client_(client),
      gpu_(gpu),
      prefill_stage_(prefill_stage),
      decode_stage_(decode_stage),
      pool_(std::move(pool)),
      scheduler_(client),
      engine_(0, config_.preset, config_.limits, scheduler_, *this, counters_) {
  if (config_.kv_events) kv_hashes_ = std::make_unique<KvHashReporter>(client_, config_.preset.block_size, *pool_);
  engine_.set_kv_observer(this);
  publish(clock_.now());
}

Emulator::~Emulator() {
  drain(Duration::zero());
  if (thread_.joinable()) thread_.join();
  tandem_gpu_close(gpu_);  // the pool must not outlive the handle it was opened on
  tandem_close(client_);
}

RequestLimits Emulator::limits() const {
  return {config_.preset.max_model_len, config_.preset.block_size, config_.preset.gpu_blocks};
}

void Emulator::start() {
  thread_ = std::thread([this] { run(); });
}

SubmitStatus Emulator::submit(std::shared_ptr<Job> job) { return inbox_.submit(std::move(job)); }

void Emulator::drain(Duration grace) {
  inbox_.drain(clock_.now() + grace);
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

std::string Emulator::stats_json() const { return inbox_.stats(); }

Emulator::Session* Emulator::find(sim::SessionId id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

void Emulator::run() {
  std::deque<std::shared_ptr<Job>> arrived;
  tandem_directive dirs[kMaxDirectives];
  for (;;) {
    const std::optional<Time> deadline = inbox_.take(arrived);
    Time now = clock_.now();
    for (auto& job : arrived) accept(std::move(job), now);
    arrived.clear();

    // Directives (the library has applied admission and priority already).
    const int n = tandem_poll(client_, 0, kMaxDirectives, dirs);
    for (int i = 0; i < n; ++i) apply(dirs[i], now);
    connected_.store(tandem_connected(client_) == 1, std::memory_order_relaxed);

    if (deadline) {
      // Draining: rounds the daemon still holds never start.
      for (sim::SessionId id : held_) {
        Session& s = sessions_.at(id);
        s.job->fail(503, "the engine is shutting down");
        ++rounds_failed_;
        end_round(s);
      }
      held_.clear();
    }
    release_runnable(now);

    now = clock_.now();
    if (step_end_ && now >= *step_end_) {
      pacer_.woke(now - *step_end_);
      step_end_.reset();
      engine_.finish_step(now);
      // Anonymous sessions end with their round, closed ones with the round
      // they had in flight (and their KV with them).
      for (auto it = sessions_.begin(); it != sessions_.end();) {
        if ((it->second.anonymous || it->second.closed) && !it->second.job && !it->second.held) {
          engine_.end_session(it->first, now);
          if (it->second.closed) engine_.drop(it->first, now);
          if (kv_hashes_) kv_hashes_->forget(it->first);
          it = sessions_.erase(it);
        } else {
          ++it;
        }
      }
    }
    const std::optional<Time> offload_done = engine_.complete_offloads(now);
    if (!step_end_) {
      if (auto end = engine_.start_step(now)) {
        begin_pass();
        const double real = static_cast<double>((*end - now).count()) / config_.speedup;
        step_real_ = Duration(static_cast<std::int64_t>(std::llround(real)));
        step_end_ = now + pacer_.start(step_real_);
      } else {
        pacer_.idle();
      }
    }
    if (now - last_report_ >= kReportPeriod) report_stats(now);
    if (now - last_publish_ >= kReportPeriod) publish(now);

    bool in_flight = step_end_.has_value() || engine_.has_work() || !held_.empty();
    if (deadline && (!in_flight || now >= *deadline)) {
      fail_all(503, "the engine is shutting down");
      publish(now);
      return;
    }
    // Sleep until the step ends, a round arrives, or kIdleWait passes.
    Time wake = step_end_ ? *step_end_ : now + kIdleWait;
    if (!step_end_ && offload_done) wake = std::min(wake, *offload_done);
    if (deadline) wake = std::min(wake, *deadline);
    if (!step_end_ && engine_.has_work()) wake = std::min(wake, now + kIdleWait);
    inbox_.wait(wake, deadline);
  }
}

void Emulator::begin_pass() {
  if (gpu_ == nullptr) return;
  ++passes_;
  std::uint32_t partition = 0;
  const int rc = tandem_gpu_begin_pass(gpu_, &partition);
  if (rc == -ERANGE) {
    // The pass stays on the current partition; the daemon's next choice may be valid.
    if (out_of_range_++ == 0) {
      fmt::print(stderr, "tandem-engine-emu: {}; staying on partition {}\n", tandem_gpu_last_error(gpu_), partition);
    }
  } else if (rc != 0) {
    ++report_errors_;
  }
}

void Emulator::accept(std::shared_ptr<Job> job, Time now) {
  const CompletionRequest& r = job->request();
  std::string name = r.session_name;
  const bool anonymous = name.empty();
  if (anonymous) name = fmt::format("{}-anon-{}", config_.name, anon_next_++);
  const sim::SessionId id = tandem_session_id(name.c_str());
  auto [it, fresh] = sessions_.try_emplace(id);
  Session& s = it->second;
  if (fresh) {
    s.name = name;
    s.id = id;
    s.anonymous = anonymous;
    tandem_session_name(client_, id, name.c_str());
  } else if (s.job || s.name != name) {
    // Two names with one xxh64, or a round in flight the HTTP side did not see.
    job->fail(409, "session '" + name + "' has a round in flight");
    return;
  }
  job->set_session(name);
  s.job = std::move(job);
  s.round = s.next_round;
  s.shared = shared_prefix(s.history, r);
  s.submitted = now;
  s.first_scheduled = Time{};
  const std::uint32_t bs = config_.preset.block_size;
  const std::uint32_t hit = std::min(engine_.prefix_hit(id, s.shared, s.content), r.prompt_tokens);
  tandem_round round{};
  round.sz = sizeof round;
  round.round = s.round;
  round.prompt_tokens = r.prompt_tokens;
  round.cached_tokens = hit;
  round.projected_blocks =
      static_cast<std::uint32_t>((static_cast<std::uint64_t>(r.prompt_tokens) + r.max_tokens + bs - 1) / bs);
  round.max_output_tokens = r.max_tokens;
  if (tandem_round_submit(client_, id, &round) != 0) ++report_errors_;
  ++rounds_submitted_;
  s.held = true;
  held_.push_back(id);
}

void Emulator::release_runnable(Time now) {
  std::erase_if(held_, [&](sim::SessionId id) {
    Session& s = sessions_.at(id);
    if (tandem_session_runnable(client_, id) != 1) return false;
    const CompletionRequest& r = s.job->request();
    sim::RoundWork w;
    w.session = id;
    w.round = s.round;
    w.prompt_tokens = r.prompt_tokens;
    w.output_tokens = r.max_tokens;
    w.shared_prefix = s.shared;
    w.last_round = !r.tool_follows;
    w.tool = tool_kind_of(r);
    w.priority = static_cast<std::uint8_t>(std::clamp(tandem_session_priority(client_, id), 0, 255));
    w.submitted = s.submitted;
    w.content = &s.content;
    if (kv_hashes_) {
      kv_hashes_->set_prompt(id, block_hashes(emulated_tokens(r.prompt, r.prompt_tokens), config_.preset.block_size));
    }
    s.job->set_cached(std::min(engine_.prefix_hit(id, s.shared, s.content), r.prompt_tokens - 1));
    engine_.submit(w, now);
    pool_->trim_host(id, s.content.host_tokens / config_.preset.block_size);
    s.held = false;
    return true;
  });
}

void Emulator::apply(const tandem_directive& d, Time now) {
  if (d.type >= TANDEM_DIR_ADMIT && d.type <= TANDEM_DIR_CLOSE) ++directives_[d.type - TANDEM_DIR_ADMIT];
  switch (d.type) {
    case TANDEM_DIR_CLOSE:
      close(d.session, now);
      break;
    case TANDEM_DIR_PIN:
      engine_.pin(d.session, base::from_ns(d.value), now);
      break;
    case TANDEM_DIR_UNPIN:
      engine_.unpin(d.session, now);
      break;
    case TANDEM_DIR_DROP:
      engine_.drop(d.session, now);
      break;
    case TANDEM_DIR_OFFLOAD:
      engine_.offload(d.session, now);
      break;
    default:
      // ADMIT, PAUSE, RESTORE and PRIORITY act through tandem_session_runnable()
      // and tandem_session_priority(). PREFETCH: sim::Engine reloads a host
      // copy as part of the step that schedules the round (its time is added
      // to that step), so an early prefetch has nothing to start; it is counted.
      break;
  }
}

void Emulator::close(sim::SessionId id, Time now) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (it->second.job || it->second.held) {
    it->second.closed = true;  // its round ends first; the next step's end forgets it
    return;
  }
  engine_.end_session(id, now);
  engine_.drop(id, now);
  if (kv_hashes_) kv_hashes_->forget(id);
  sessions_.erase(it);
}

void Emulator::end_round(Session& s) {
  if (!s.anonymous) inbox_.round_over(s.name);
  s.job.reset();
  s.held = false;
}

void Emulator::fail_all(int status, const std::string& message) {
  for (auto& [id, s] : sessions_) {
    if (!s.job) continue;
    s.job->fail(status, message);
    ++rounds_failed_;
    end_round(s);
  }
  held_.clear();
  inbox_.fail_queued(status, message);
}

// ---- engine callbacks ---------------------------------------------------------------

void Emulator::first_token(sim::EngineId /*engine*/, const sim::RoundWork& work, Time now) {
  Session* s = find(work.session);
  if (s == nullptr) return;
  const Time first = s->first_scheduled == Time{} ? s->submitted : s->first_scheduled;
  if (tandem_round_first_token(client_, work.session, work.round, ns_since(s->submitted, first),
                               ns_since(first, now)) != 0) {
    ++report_errors_;
  }
}

void Emulator::token(sim::EngineId /*engine*/, const sim::RoundWork& work, std::uint32_t output_tokens, Time /*now*/) {
  if (Session* s = find(work.session); s != nullptr && s->job) s->job->add_tokens(output_tokens);
}

void Emulator::round_done(sim::EngineId /*engine*/, const sim::RoundWork& work, std::uint32_t blocks,
                          std::uint32_t /*context_tokens*/, Time now) {
  Session* s = find(work.session);
  if (s == nullptr || !s->job) return;
  if (tandem_round_end(client_, work.session, work.round, work.output_tokens, blocks, work.last_round ? 0 : 1) != 0) {
    ++report_errors_;
  }
  advance_history(s->history, s->job->request(), work.output_tokens);
  ++s->next_round;
  ++rounds_done_;
  const std::shared_ptr<Job> job = s->job;
  end_round(*s);
  // /stats reflects the round before its reply goes out.
  publish(now);
  job->finish();
}

void Emulator::kv_changed(sim::EngineId /*engine*/, sim::SessionId session, sched::KvChange change,
                          std::uint32_t blocks, Time /*now*/) {
  const Session* s = find(session);
  const std::uint32_t round = s == nullptr || s->next_round == 0 ? 0 : s->next_round - 1;
  if (tandem_kv_event(client_, session, kv_kind(change), blocks, round) != 0) ++report_errors_;
  if (kv_hashes_) kv_hashes_->kv_changed(session, change);
}

void Emulator::moved(sim::SessionId session, sim::KvPlace from, sim::KvPlace to, std::uint32_t blocks) {
  kv_observer().moved(session, from, to, blocks);
}

void Emulator::computed(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) {
  if (Session* s = find(session); s != nullptr && s->job && s->first_scheduled == Time{}) {
    s->first_scheduled = clock_.now();
  }
  kv_observer().computed(session, first_token, tokens, samples);
}

void Emulator::reloaded(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens) {
  kv_observer().reloaded(session, first_token, tokens);
}

// ---- reports ------------------------------------------------------------------------

void Emulator::report_stats(Time now) {
  last_report_ = now;
  const sched::KvPoolStats k = engine_.stats();
  tandem_kv_stats st{};
  st.sz = sizeof st;
  st.blocks_total = k.blocks_total;
  st.blocks_free = k.blocks_free;
  st.blocks_pinned = k.blocks_pinned;
  st.blocks_offloaded = pool_->occupancy().host_blocks;
  st.running_seqs = k.running_seqs;
  st.waiting_seqs = k.waiting_seqs;
  st.step_tokens = k.step_tokens;
  st.step_time_us = static_cast<std::uint32_t>(std::min<std::int64_t>(step_real_.count() / 1000, UINT32_MAX));
  st.block_bytes = config_.kv_block_bytes;
  if (tandem_kv_stats_report(client_, &st) != 0) ++report_errors_;
}

void Emulator::publish(Time now) {
  using nlohmann::json;
  last_publish_ = now;
  const sched::KvPoolStats k = engine_.stats();
  const PoolOccupancy o = pool_->occupancy();
  tandem_client_stats cs{};
  cs.sz = sizeof cs;
  const bool have_cs = client_ != nullptr && tandem_get_stats(client_, &cs) == 0;
  std::uint32_t held_blocks = o.held;
  json out = {
      {"model", config_.preset.name},
      {"engine_name", config_.name},
      {"policy", std::string(scheduler_.name())},
      {"connected", client_ != nullptr && tandem_connected(client_) == 1},
      {"client_id", client_ != nullptr ? tandem_client_id(client_) : 0},
      {"speedup", config_.speedup},
      {"engine",
       {{"blocks_total", k.blocks_total},
        {"blocks_free", k.blocks_free},
        {"blocks_pinned", k.blocks_pinned},
        {"blocks_cached", engine_.cached_blocks()},
        {"blocks_offloading", engine_.offloading_blocks()},
        {"block_size", config_.preset.block_size},
        {"running_seqs", k.running_seqs},
        {"waiting_seqs", k.waiting_seqs},
        {"held_rounds", held_.size()},
        {"steps", engine_.steps()},
        {"step_tokens", k.step_tokens},
        {"step_time_us", std::chrono::duration_cast<std::chrono::microseconds>(step_real_).count()},
        {"violations", engine_.violations()},
        {"first_violation", engine_.first_violation()},
        {"max_seqs", config_.limits.max_seqs},
        {"token_budget", config_.limits.token_budget},
        {"max_model_len", config_.preset.max_model_len}}},
      {"pool",
       {{"blocks_total", o.total},
        {"blocks_free", o.free + o.cached},
        {"blocks_free_uncached", o.free},
        {"blocks_held", held_blocks},
        {"blocks_pinned", o.pinned},
        {"blocks_cached", o.cached},
        {"blocks_offloading", o.offloading},
        {"host_blocks", o.host_blocks},
        {"block_bytes", pool_->block_bytes()},
        {"touched_bytes", o.touched_bytes},
        {"offloaded_bytes", o.offloaded_bytes},
        {"reloaded_bytes", o.reloaded_bytes},
        {"errors", pool_->errors()}}},
      {"tokens",
       {{"prompt", counters_.prompt_tokens},
        {"reused", counters_.reused_tokens},
        {"computed", counters_.computed_tokens},
        {"new", counters_.new_tokens},
        {"recomputed", counters_.recomputed_tokens},
        {"preemptions", counters_.preemptions}}},
      // Σ modelled step time (not divided by the speedup), block-seconds of
      // pins on the real clock, how late the engine thread woke for step
      // ends in all (real seconds), and how much of that the following
      // steps could not make up (the engine went idle first, or the run
      // ended): a run whose unrecovered lateness is a large share of
      // busy_s / speedup did not keep up with the model.
      {"time",
       {{"busy_s", counters_.gpu_busy_s},
        {"pinned_block_seconds", counters_.pinned_block_seconds},
        {"late_s", base::to_seconds(pacer_.late())},
        {"late_unrecovered_s", base::to_seconds(pacer_.unrecovered())}}},
      {"rounds",
       {{"submitted", rounds_submitted_},
        {"completed", rounds_done_},
        {"failed", rounds_failed_},
        {"sessions", sessions_.size()}}},
      {"directives",
       {{"admit", directives_[0]},
        {"pause", directives_[1]},
        {"restore", directives_[2]},
        {"priority", directives_[3]},
        {"pin", directives_[4]},
        {"unpin", directives_[5]},
        {"drop", directives_[6]},
        {"offload", directives_[7]},
        {"prefetch", directives_[8]},
        {"close", directives_[9]}}},
      {"report_errors", report_errors_ + (kv_hashes_ ? kv_hashes_->report_errors() : 0)},
      {"scheduler_failures", scheduler_.failures()},
  };
  out["gpu"] = gpu_json(gpu_, prefill_stage_, decode_stage_, passes_);
  if (have_cs) {
    out["client"] = {{"connects", cs.connects},         {"disconnects", cs.disconnects},
                     {"records_sent", cs.records_sent}, {"records_dropped", cs.records_dropped},
                     {"directives", cs.directives},     {"resyncs", cs.resyncs}};
  }
  inbox_.publish(out.dump());
}

}  // namespace tandem::testbed
