// tandem-llama's engine thread: sim::Engine's schedule, llama.cpp's compute.
#include "engines/llama/engine.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"

namespace tandem::llama {
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
double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

// What /v1/models calls the model: its file's name without ".gguf".
std::string model_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name.empty() ? path : name;
}

// The filler token at `pos` of a session's synthesized context (a round that
// gives `prompt_tokens` instead of text): ordinary tokens of the vocabulary,
// a function of the session and the position only.
Token filler_token(std::uint64_t session, std::uint32_t pos, std::uint32_t n_vocab) {
  std::uint64_t x = session ^ (0x9E3779B97F4A7C15ULL * (static_cast<std::uint64_t>(pos) + 1));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  const std::uint32_t base = n_vocab > 4000 ? 1000 : 0;
  const std::uint32_t span = std::max<std::uint32_t>(1, std::min<std::uint32_t>(100000, n_vocab - 2 * base));
  return static_cast<Token>(base + x % span);
}

}  // namespace

std::shared_ptr<Job> synthetic_round(const std::string& session, std::uint32_t index, std::uint32_t prompt_tokens,
                                     std::uint32_t max_tokens, bool tool_follows) {
  CompletionRequest r;
  r.session_name = session;
  r.prompt = "task";
  for (std::uint32_t i = 0; i < index; ++i) r.prompt += " r";
  r.prompt_tokens = prompt_tokens;
  r.prompt_tokens_given = true;
  r.max_tokens = max_tokens;
  r.temperature = 0.0;
  r.ignore_eos = true;
  r.tool_follows = tool_follows;
  return std::make_shared<Job>(std::move(r), fmt::format("{}-{}", session, index), 0);
}

base::Result<std::unique_ptr<LlamaEngine>> LlamaEngine::create(EngineConfig config, std::shared_ptr<const Model> model,
                                                               std::unique_ptr<Context> ctx, tandem_client* client) {
  if (config.block_size == 0 || ctx->n_ctx() / config.block_size == 0) {
    return base::make_error(EINVAL, fmt::format("a KV block of {} tokens does not fit the context of {} cells",
                                                config.block_size, ctx->n_ctx()));
  }
  if (config.token_budget == 0) config.token_budget = ctx->n_batch();
  if (config.token_budget > ctx->n_batch()) {
    return base::make_error(EINVAL, fmt::format("the token budget {} is over the context's batch of {}",
                                                config.token_budget, ctx->n_batch()));
  }
  if (config.max_seqs == 0 || config.max_seqs >= ctx->n_seq_max()) {
    return base::make_error(EINVAL, fmt::format("{} sequences per step: the context holds {}; leave room for idle "
                                                "sessions' sequences",
                                                config.max_seqs, ctx->n_seq_max()));
  }
  std::FILE* log = nullptr;
  if (!config.step_log.empty()) {
    log = std::fopen(config.step_log.c_str(), "we");
    if (log == nullptr) return base::make_error(EIO, fmt::format("{}: {}", config.step_log, std::strerror(errno)));
  }
  auto e = std::unique_ptr<LlamaEngine>(new LlamaEngine(std::move(config), std::move(model), std::move(ctx), client));
  e->step_log_ = log;
  return e;
}

LlamaEngine::LlamaEngine(EngineConfig config, std::shared_ptr<const Model> model, std::unique_ptr<Context> ctx,
                         tandem_client* client)
    : config_(std::move(config)),
      model_(std::move(model)),
      ctx_(std::move(ctx)),
      client_(client),
      model_name_(model_name(model_->path())),
      preset_([&] {
        sim::Preset p;
        p.block_size = config_.block_size;
        p.gpu_blocks = ctx_->n_ctx() / config_.block_size;
        p.token_budget = config_.token_budget;
        p.max_seqs = config_.max_seqs;
        p.max_model_len = std::min(model_->n_ctx_train(), p.gpu_blocks * p.block_size);
        return p;
      }()),
      limits_{config_.token_budget, config_.max_seqs, /*link_time_scale=*/0.0},
      scheduler_(client),
      kv_(std::make_unique<KvExecutor>(*ctx_, config_.block_size, *this, config_.host_kv_bytes)),
      engine_(0, preset_, limits_, scheduler_, *this, counters_) {
  preset_.name = model_name_;
  if (config_.kv_events && client_ != nullptr) {
    kv_hashes_ = std::make_unique<testbed::KvHashReporter>(client_, config_.block_size, *kv_);
  }
  engine_.set_kv_observer(kv_hashes_ ? static_cast<sim::KvObserver*>(kv_hashes_.get()) : kv_.get());
  publish(clock_.now());
}

LlamaEngine::~LlamaEngine() {
  drain(Duration::zero());
  if (thread_.joinable()) thread_.join();
  if (step_log_ != nullptr) std::fclose(step_log_);
  tandem_close(client_);
}

tandem_engine_params LlamaEngine::engine_params() const {
  tandem_engine_params p{};
  p.sz = sizeof p;
  p.gpu_index = -1;
  p.block_size = preset_.block_size;
  p.total_blocks = preset_.gpu_blocks;
  p.max_seqs = config_.max_seqs;
  p.token_budget = config_.token_budget;
  p.max_model_len = preset_.max_model_len;
  return p;
}

RequestLimits LlamaEngine::limits() const { return {preset_.max_model_len, preset_.block_size, preset_.gpu_blocks}; }

std::expected<void, RequestError> LlamaEngine::prepare(CompletionRequest& r) const {
  if (r.prompt_tokens_given) return {};  // synthesized on the engine thread from the session's context
  auto t = model_->tokenize(r.prompt);
  if (!t) return std::unexpected(RequestError{r.chat ? "messages" : "prompt", t.error().context()});
  if (t->empty()) return std::unexpected(RequestError{r.chat ? "messages" : "prompt", "the prompt has no tokens"});
  r.tokens = std::move(*t);
  r.prompt_tokens = static_cast<std::uint32_t>(r.tokens.size());
  return testbed::check_context(r, limits());
}

void LlamaEngine::start() {
  thread_ = std::thread([this] { run(); });
}

SubmitStatus LlamaEngine::submit(std::shared_ptr<Job> job) { return inbox_.submit(std::move(job)); }

void LlamaEngine::drain(Duration grace) {
  inbox_.drain(clock_.now() + grace);
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

std::string LlamaEngine::stats_json() const { return inbox_.stats(); }

LlamaEngine::Session* LlamaEngine::find(sim::SessionId id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const LlamaEngine::Session* LlamaEngine::find(sim::SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

std::vector<std::uint64_t> LlamaEngine::logit_digests(SessionId session) const {
  const Session* s = find(session);
  return s == nullptr ? std::vector<std::uint64_t>() : s->digests;
}

std::span<const Token> LlamaEngine::tokens(SessionId session) const {
  const Session* s = find(session);
  return s == nullptr ? std::span<const Token>() : std::span<const Token>(s->context);
}

// ---- the loop -------------------------------------------------------------------

void LlamaEngine::run() {
  for (;;) {
    const Tick t = tick();
    if (t == Tick::kDrained) return;
    if (t == Tick::kStepped) continue;
    // Idle: sleep until a round arrives or kIdleWait passes (directives and
    // admissions are seen within that).
    inbox_.wait(clock_.now() + kIdleWait, seen_deadline_);
  }
}

LlamaEngine::Tick LlamaEngine::tick() {
  const std::optional<Time> deadline = inbox_.take(arrived_);
  seen_deadline_ = deadline;
  Time now = clock_.now();
  for (auto& job : arrived_) accept(std::move(job), now);
  arrived_.clear();

  if (client_ != nullptr) {
    tandem_directive dirs[kMaxDirectives];
    const int n = tandem_poll(client_, 0, kMaxDirectives, dirs);
    for (int i = 0; i < n; ++i) apply(dirs[i], now);
    connected_.store(tandem_connected(client_) == 1, std::memory_order_relaxed);
  }
  if (deadline) {
    for (sim::SessionId id : held_) {
      Session& s = sessions_.at(id);
      s.job->fail(503, "the engine is shutting down");
      ++rounds_failed_;
      end_round(s);
    }
    held_.clear();
  }
  release_runnable(now);
  engine_.complete_offloads(now);
  forget_evicted_hosts();
  spare_sequences(now);
  const bool ran = step(now);
  forget_evicted_hosts();

  now = clock_.now();
  if (now - last_report_ >= kReportPeriod) report_stats(now);
  if (now - last_publish_ >= kReportPeriod) publish(now);

  const bool in_flight = engine_.has_work() || !held_.empty();
  if (deadline && (!in_flight || now >= *deadline)) {
    fail_all(503, "the engine is shutting down");
    publish(now);
    return Tick::kDrained;
  }
  return ran ? Tick::kStepped : Tick::kIdle;
}

void LlamaEngine::apply(const tandem_directive& d) { apply(d, clock_.now()); }

void LlamaEngine::accept(std::shared_ptr<Job> job, Time now) {
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
    if (client_ != nullptr) tandem_session_name(client_, id, name.c_str());
  } else if (s.job || s.name != name) {
    job->fail(409, "session '" + name + "' has a round in flight");
    return;
  }
  job->set_session(name);

  // The round's context: its prompt's tokens, and how many of them equal the
  // session's previous context (prompt + generated).
  std::vector<Token> prompt;
  std::uint32_t shared = 0;
  if (r.prompt_tokens_given) {
    // The replay's rule (as the emulator's): a prompt whose text extends the
    // previous one's continues the previous context; the rest is filler.
    if (s.next_round > 0 && r.prompt.starts_with(s.prev_prompt) && r.prompt_tokens >= s.prompt_tokens) {
      shared = std::min<std::uint32_t>(r.prompt_tokens, static_cast<std::uint32_t>(s.context.size()));
    }
    prompt.assign(s.context.begin(), s.context.begin() + shared);
    prompt.reserve(r.prompt_tokens);
    for (std::uint32_t p = shared; p < r.prompt_tokens; ++p) prompt.push_back(filler_token(id, p, model_->n_vocab()));
  } else {
    prompt = r.tokens;
    const auto m = std::mismatch(prompt.begin(), prompt.end(), s.context.begin(), s.context.end());
    shared = static_cast<std::uint32_t>(m.first - prompt.begin());
  }
  s.context = std::move(prompt);
  s.prompt_tokens = static_cast<std::uint32_t>(s.context.size());
  s.prev_prompt = r.prompt;
  s.job = std::move(job);
  s.round = s.next_round;
  s.shared = shared;
  s.stopped = false;
  const std::uint64_t seed = r.seed != 0 ? r.seed : seeds_();
  s.sampler = std::make_unique<Sampler>(r.temperature, seed);
  s.submitted = now;
  s.first_scheduled = Time{};
  const std::uint32_t bs = preset_.block_size;
  const std::uint32_t hit = std::min(engine_.prefix_hit(id, s.shared, s.content), s.prompt_tokens);
  if (client_ != nullptr) {
    tandem_round round{};
    round.sz = sizeof round;
    round.round = s.round;
    round.prompt_tokens = s.prompt_tokens;
    round.cached_tokens = hit;
    round.projected_blocks =
        static_cast<std::uint32_t>((static_cast<std::uint64_t>(s.prompt_tokens) + r.max_tokens + bs - 1) / bs);
    round.max_output_tokens = r.max_tokens;
    if (tandem_round_submit(client_, id, &round) != 0) ++report_errors_;
  }
  ++rounds_submitted_;
  s.held = true;
  held_.push_back(id);
}

void LlamaEngine::release_runnable(Time now) {
  std::erase_if(held_, [&](sim::SessionId id) {
    Session& s = sessions_.at(id);
    if (client_ != nullptr && tandem_session_runnable(client_, id) != 1) return false;
    const CompletionRequest& r = s.job->request();
    sim::RoundWork w;
    w.session = id;
    w.round = s.round;
    w.prompt_tokens = s.prompt_tokens;
    w.output_tokens = r.max_tokens;
    w.shared_prefix = s.shared;
    w.last_round = !r.tool_follows;
    w.tool = testbed::tool_kind_of(r);
    w.priority =
        client_ != nullptr ? static_cast<std::uint8_t>(std::clamp(tandem_session_priority(client_, id), 0, 255)) : 0;
    w.submitted = s.submitted;
    w.content = &s.content;
    if (kv_hashes_) kv_hashes_->set_prompt(id, testbed::block_hashes(s.context, preset_.block_size));
    s.job->set_cached(std::min(engine_.prefix_hit(id, s.shared, s.content), s.prompt_tokens - 1));
    engine_.submit(w, now);
    kv_->trim_host(id, s.content.host_tokens);
    s.held = false;
    return true;
  });
}

// Host copies the executor forgot for its budget: the ledger forgets them
// too, so no step plans a reload from them.
void LlamaEngine::forget_evicted_hosts() {
  for (SessionId id : kv_->take_evicted_hosts()) {
    if (Session* s = find(id); s != nullptr) s->content.host_tokens = 0;
  }
}

// Sequence ids are llama.cpp's scarcest resource after cells (256 at most):
// idle sessions beyond the limit give theirs back, least recently used first,
// their KV dropped (reported to the daemon as such).
void LlamaEngine::spare_sequences(Time now) {
  const std::uint32_t in_use = ctx_->n_seq_max() - kv_->free_seqs();
  if (in_use + config_.max_seqs <= ctx_->n_seq_max()) return;
  std::uint32_t excess = in_use + config_.max_seqs - ctx_->n_seq_max();
  for (SessionId victim : kv_->idle_sessions()) {
    if (excess == 0) break;
    const Session* s = find(victim);
    if (s != nullptr && (s->job && !s->held)) continue;  // its round is queued or running
    engine_.drop(victim, now);
    if (kv_->resident(victim) == 0) {
      ++seq_evictions_;
      --excess;
    }
  }
}

bool LlamaEngine::step(Time now) {
  kv_->begin();
  if (!engine_.start_step(now)) return false;
  for (SessionId id : kv_->step_sessions()) {
    Session* s = find(id);
    if (s != nullptr && s->job && s->first_scheduled == Time{}) s->first_scheduled = now;
  }
  const Time t0 = clock_.now();
  const int rc = kv_->decode();
  ctx_->synchronize();
  const Time t1 = clock_.now();
  if (rc != 0) {
    // The pass failed: its rounds fail (500) and their blocks are freed, so
    // the ledger and llama.cpp stay one.
    if (decode_failures_++ == 0) {
      first_decode_failure_ = fmt::format("llama_decode returned {} on a batch of {} tokens", rc, kv_->batch_tokens());
      fmt::print(stderr, "tandem-llama: {}\n", first_decode_failure_);
    }
    for (SessionId id : kv_->step_sessions()) {
      engine_.abort(id, t1);
      if (Session* s = find(id); s != nullptr && s->job) {
        s->job->fail(500, first_decode_failure_);
        ++rounds_failed_;
        end_round(*s);
      }
    }
    engine_.finish_step(t1);
    return true;
  }
  for (const KvExecutor::Sample& x : kv_->samples()) {
    Session* s = find(x.session);
    if (s == nullptr || !s->sampler) continue;
    if (config_.record_logits) {
      const float* row = ctx_->logits(x.index);
      s->digests.push_back(row == nullptr ? 0
                                          : base::hash64(std::string_view(reinterpret_cast<const char*>(row),
                                                                          sizeof(float) * model_->n_vocab())));
    }
    const Token t = s->sampler->sample(*ctx_, x.index);
    s->context.push_back(t);
    s->pending_piece = model_->piece(t);
    ++generated_;
    if (!s->job->request().ignore_eos && model_->is_eog(t)) {
      s->stopped = true;
      engine_.stop_round(x.session);
    }
  }
  const Time t2 = clock_.now();
  engine_.finish_step(t2);
  // A round without a session id, or of a session closed while it ran, has
  // no next round: its KV goes now rather than when the cache needs the room.
  for (SessionId id : finished_) {
    engine_.drop(id, t2);
    if (kv_hashes_) kv_hashes_->forget(id);
    sessions_.erase(id);
  }
  finished_.clear();
  const sim::StepShape& shape = engine_.last_shape();
  prefilled_ += shape.tokens - std::min<std::uint64_t>(shape.tokens, kv_->samples().size());
  ++steps_;
  last_step_ = t2 - t0;
  busy_s_ += seconds(last_step_);
  if (kv_->verify() && kv_->violations() == 1) {
    fmt::print(stderr, "tandem-llama: the KV ledger and llama.cpp disagree: {}\n", kv_->first_violation());
  }
  if (step_log_ != nullptr) {
    std::uint32_t decode_seqs = 0;
    for (const KvExecutor::Sample& x : kv_->samples()) {
      const Session* s = find(x.session);
      if (s != nullptr && s->context.size() > s->prompt_tokens + 1) ++decode_seqs;
    }
    fmt::print(step_log_,
               "{{\"step\":{},\"t\":{:.6f},\"seqs\":{},\"tokens\":{},\"prefill_pairs\":{:.1f},"
               "\"decode_context\":{},\"decode_seqs\":{},\"samples\":{},\"kv_cells\":{},\"decode_us\":{:.1f},"
               "\"step_us\":{:.1f}}}\n",
               steps_, seconds(t0.time_since_epoch()), shape.seqs, shape.tokens, shape.prefill_pairs,
               shape.decode_context, decode_seqs, kv_->samples().size(), kv_->resident_total(),
               std::chrono::duration<double, std::micro>(t1 - t0).count(),
               std::chrono::duration<double, std::micro>(t2 - t0).count());
  }
  return true;
}

void LlamaEngine::apply(const tandem_directive& d, Time now) {
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
      // ADMIT, PAUSE, RESTORE and PRIORITY act through
      // tandem_session_runnable() and tandem_session_priority(). PREFETCH:
      // the restore happens in the step that schedules the round.
      break;
  }
}

void LlamaEngine::close(SessionId id, Time now) {
  Session* s = find(id);
  if (s == nullptr) return;
  if (s->job || s->held) {
    s->closed = true;  // its round ends first (it was accepted; the runner waits for it)
    return;
  }
  engine_.end_session(id, now);
  kv_->forget_host(id);
  engine_.drop(id, now);
  if (kv_hashes_) kv_hashes_->forget(id);
  sessions_.erase(id);
}

void LlamaEngine::end_round(Session& s) {
  if (!s.anonymous) inbox_.round_over(s.name);
  s.job.reset();
  s.sampler.reset();
  s.held = false;
}

void LlamaEngine::fail_all(int status, const std::string& message) {
  for (auto& [id, s] : sessions_) {
    if (!s.job) continue;
    s.job->fail(status, message);
    ++rounds_failed_;
    end_round(s);
  }
  held_.clear();
  inbox_.fail_queued(status, message);
}

// ---- engine callbacks -------------------------------------------------------------

void LlamaEngine::first_token(sim::EngineId /*engine*/, const sim::RoundWork& work, Time now) {
  Session* s = find(work.session);
  if (s == nullptr || client_ == nullptr) return;
  const Time first = s->first_scheduled == Time{} ? s->submitted : s->first_scheduled;
  if (tandem_round_first_token(client_, work.session, work.round, ns_since(s->submitted, first),
                               ns_since(first, now)) != 0) {
    ++report_errors_;
  }
}

void LlamaEngine::token(sim::EngineId /*engine*/, const sim::RoundWork& work, std::uint32_t /*output_tokens*/,
                        Time /*now*/) {
  Session* s = find(work.session);
  if (s == nullptr || !s->job) return;
  s->job->add_piece(std::move(s->pending_piece));
  s->pending_piece.clear();
}

void LlamaEngine::round_done(sim::EngineId /*engine*/, const sim::RoundWork& work, std::uint32_t blocks,
                             std::uint32_t /*context_tokens*/, Time now) {
  Session* s = find(work.session);
  if (s == nullptr || !s->job) return;
  if (client_ != nullptr &&
      tandem_round_end(client_, work.session, work.round, work.output_tokens, blocks, work.last_round ? 0 : 1) != 0) {
    ++report_errors_;
  }
  ++s->next_round;
  ++rounds_done_;
  if (s->stopped) ++rounds_stopped_;
  const std::shared_ptr<Job> job = s->job;
  const bool stopped = s->stopped;
  end_round(*s);
  if (s->anonymous || s->closed) {
    // No next round: forgotten once the step has finished.
    engine_.end_session(work.session, now);
    kv_->forget_host(work.session);
    finished_.push_back(work.session);
  }
  publish(now);
  job->finish(stopped ? "stop" : "length");
}

void LlamaEngine::kv_changed(sim::EngineId /*engine*/, sim::SessionId session, sched::KvChange change,
                             std::uint32_t blocks, Time /*now*/) {
  if (client_ == nullptr) return;
  const Session* s = find(session);
  const std::uint32_t round = s == nullptr || s->next_round == 0 ? 0 : s->next_round - 1;
  if (tandem_kv_event(client_, session, kv_kind(change), blocks, round) != 0) ++report_errors_;
  if (kv_hashes_) kv_hashes_->kv_changed(session, change);
}

// ---- reports ------------------------------------------------------------------------

void LlamaEngine::report_stats(Time now) {
  last_report_ = now;
  if (client_ == nullptr) return;
  const sched::KvPoolStats k = engine_.stats();
  tandem_kv_stats st{};
  st.sz = sizeof st;
  st.blocks_total = k.blocks_total;
  st.blocks_free = k.blocks_free;
  st.blocks_pinned = k.blocks_pinned;
  st.blocks_offloaded = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(UINT32_MAX, kv_->stats().host_bytes / std::max<std::size_t>(1, block_bytes())));
  st.running_seqs = k.running_seqs;
  st.waiting_seqs = k.waiting_seqs;
  st.step_tokens = k.step_tokens;
  st.step_time_us = static_cast<std::uint32_t>(
      std::min<std::int64_t>(std::chrono::duration_cast<std::chrono::microseconds>(last_step_).count(), UINT32_MAX));
  st.block_bytes = block_bytes();
  if (tandem_kv_stats_report(client_, &st) != 0) ++report_errors_;
}

void LlamaEngine::publish(Time now) {
  using nlohmann::json;
  last_publish_ = now;
  const sched::KvPoolStats k = engine_.stats();
  const KvExecutorStats x = kv_->stats();
  json out = {
      {"model", model_name_},
      {"engine_name", config_.name},
      {"llama",
       {{"build", std::string(build_info())},
        {"model_file", model_->path()},
        {"model_desc", model_->description()},
        {"n_ctx", ctx_->n_ctx()},
        {"n_seq_max", ctx_->n_seq_max()},
        {"n_batch", ctx_->n_batch()},
        {"threads", ctx_->threads()},
        {"kv_bytes_per_token", model_->kv_bytes_per_token()}}},
      {"policy", std::string(scheduler_.name())},
      // Steps take real time (tandem-agents: a real-time engine).
      {"realtime", true},
      {"speedup", 1.0},
      {"connected", client_ != nullptr && tandem_connected(client_) == 1},
      {"client_id", client_ != nullptr ? tandem_client_id(client_) : 0},
      {"engine",
       {{"blocks_total", k.blocks_total},
        {"blocks_free", k.blocks_free},
        {"blocks_pinned", k.blocks_pinned},
        {"blocks_cached", engine_.cached_blocks()},
        {"block_size", preset_.block_size},
        {"running_seqs", k.running_seqs},
        {"waiting_seqs", k.waiting_seqs},
        {"held_rounds", held_.size()},
        {"steps", steps_},
        {"step_tokens", k.step_tokens},
        {"step_time_us", std::chrono::duration_cast<std::chrono::microseconds>(last_step_).count()},
        {"busy_s", busy_s_},
        {"violations", engine_.violations()},
        {"first_violation", engine_.first_violation()},
        {"max_seqs", config_.max_seqs},
        {"token_budget", config_.token_budget},
        {"max_model_len", preset_.max_model_len}}},
      {"kv",
       {{"cells_ledger", kv_->resident_total()},
        {"seqs_in_use", x.seqs_in_use},
        {"ledger_violations", kv_->violations()},
        {"first_ledger_violation", kv_->first_violation()},
        {"offloads", x.offloads},
        {"restores", x.restores},
        {"offloaded_bytes", x.offloaded_bytes},
        {"restored_bytes", x.restored_bytes},
        {"offload_s", static_cast<double>(x.offload_ns) * 1e-9},
        {"restore_s", static_cast<double>(x.restore_ns) * 1e-9},
        {"host_bytes", x.host_bytes},
        {"host_evictions", x.host_evictions},
        {"restore_failures", x.restore_failures},
        {"recomputed_tokens", x.recomputed_tokens},
        {"cut_tokens", x.cut_tokens},
        {"seq_evictions", seq_evictions_}}},
      // Real seconds: llama_decode busy, and block-seconds of pins.
      {"time", {{"busy_s", busy_s_}, {"pinned_block_seconds", counters_.pinned_block_seconds}}},
      {"tokens",
       {{"prompt", counters_.prompt_tokens},
        {"reused", counters_.reused_tokens},
        {"computed", counters_.computed_tokens},
        {"new", counters_.new_tokens},
        {"recomputed", counters_.recomputed_tokens},
        {"generated", generated_},
        {"preemptions", counters_.preemptions}}},
      {"rounds",
       {{"submitted", rounds_submitted_},
        {"completed", rounds_done_},
        {"stopped_early", rounds_stopped_},
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
      {"decode_failures", decode_failures_},
      {"first_decode_failure", first_decode_failure_},
      {"report_errors", report_errors_ + (kv_hashes_ ? kv_hashes_->report_errors() : 0)},
      {"scheduler_failures", scheduler_.failures()},
  };
  inbox_.publish(out.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace tandem::llama
