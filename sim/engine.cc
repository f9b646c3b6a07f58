// The simulated engine: block pool, prefix cache, pins, offload, and steps
// planned by a sched::StepScheduler.
#include "sim/engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace tandem::sim {
namespace {

Duration from_us(double us) { return Duration(static_cast<std::int64_t>(std::llround(us * 1e3))); }

}  // namespace

Engine::Engine(EngineId id, const Preset& preset, EngineLimits limits, sched::StepScheduler& scheduler,
               EngineHost& host, RunCounters& counters)
    : id_(id),
      preset_(preset),
      block_size_(preset.block_size),
      scheduler_(scheduler),
      host_(host),
      counters_(counters),
      link_time_scale_(limits.link_time_scale),
      free_uncached_(preset.gpu_blocks),
      saturating_tokens_(preset.step.saturating_tokens()) {
  params_.block_size = preset.block_size;
  params_.total_blocks = preset.gpu_blocks;
  params_.max_seqs = limits.max_seqs;
  params_.token_budget = limits.token_budget;
  params_.max_model_len = preset.max_model_len;
}

// ---- host memory ------------------------------------------------------------

bool HostPool::store(SessionId session, SessionContent& c, std::uint32_t tokens, std::uint32_t block_size, Time now) {
  const std::uint64_t blocks = tokens / block_size;
  if (capacity_ != 0 && blocks > capacity_) return false;
  auto [it, fresh] = copies_.try_emplace(session);
  Copy& copy = it->second;
  if (!fresh) {
    lru_.erase(copy.lru_key);
    used_ -= copy.blocks;
  }
  copy.content = &c;
  copy.blocks = std::max<std::uint64_t>(blocks, c.host_tokens / block_size);
  c.host_tokens = static_cast<std::uint32_t>(copy.blocks * block_size);
  copy.lru_key = next_key_++;
  copy.used = now;
  lru_.emplace(copy.lru_key, session);
  used_ += copy.blocks;
  while (capacity_ != 0 && used_ > capacity_) {
    auto oldest = lru_.begin();
    if (oldest->second == session) break;  // cannot happen: it is the newest and fits alone
    Copy& victim = copies_.at(oldest->second);
    used_ -= victim.blocks;
    evicted_ += victim.blocks;
    victim.content->host_tokens = 0;
    copies_.erase(oldest->second);
    lru_.erase(oldest);
  }
  peak_ = std::max(peak_, used_);
  return true;
}

void HostPool::touch(SessionId session, Time now) {
  auto it = copies_.find(session);
  if (it == copies_.end()) return;
  it->second.used = now;
  lru_.erase(it->second.lru_key);
  it->second.lru_key = next_key_++;
  lru_.emplace(it->second.lru_key, session);
}

Duration HostPool::oldest_idle(Time now) const {
  if (lru_.empty()) return Duration{};
  const Time used = copies_.at(lru_.begin()->second).used;
  return now > used ? now - used : Duration{};
}

void HostPool::cut(SessionId session, SessionContent& c, std::uint32_t tokens, std::uint32_t block_size) {
  c.host_tokens = std::min(c.host_tokens, tokens / block_size * block_size);
  auto it = copies_.find(session);
  if (it == copies_.end()) return;
  const std::uint64_t blocks = c.host_tokens / block_size;
  used_ -= it->second.blocks - std::min(it->second.blocks, blocks);
  it->second.blocks = std::min(it->second.blocks, blocks);
  if (it->second.blocks == 0) {
    lru_.erase(it->second.lru_key);
    copies_.erase(it);
  }
}

bool Engine::store_host(SessionId s, SessionContent& c, std::uint32_t tokens, Time now) {
  if (host_pool_ == nullptr) {
    c.host_tokens = std::max(c.host_tokens, tokens / block_size_ * block_size_);
    return true;
  }
  return host_pool_->store(s, c, tokens, block_size_, now);
}

// ---- the block pool -----------------------------------------------------------

void Engine::cache_put(SessionId s, std::uint32_t full_blocks, Time /*now*/, KvPlace from) {
  if (full_blocks == 0) return;
  moved(s, from, KvPlace::kCached, full_blocks);
  SessKv& e = kv_[s];
  if (e.lru_key != 0) lru_.erase(e.lru_key);
  e.cached_blocks += full_blocks;
  e.lru_key = lru_next_++;
  lru_.emplace(e.lru_key, s);
  cached_total_ += full_blocks;
}

std::uint32_t Engine::cache_take(SessionId s, KvPlace to) {
  auto it = kv_.find(s);
  if (it == kv_.end() || it->second.cached_blocks == 0) return 0;
  SessKv& e = it->second;
  const std::uint32_t b = e.cached_blocks;
  moved(s, KvPlace::kCached, to, b);
  lru_.erase(e.lru_key);
  e.lru_key = 0;
  e.cached_blocks = 0;
  cached_total_ -= b;
  return b;
}

void Engine::cache_cut(SessionId s, std::uint32_t keep_blocks) {
  auto it = kv_.find(s);
  if (it == kv_.end() || it->second.cached_blocks <= keep_blocks) return;
  SessKv& e = it->second;
  const std::uint32_t gone = e.cached_blocks - keep_blocks;
  moved(s, KvPlace::kCached, KvPlace::kFree, gone);
  e.cached_blocks = keep_blocks;
  cached_total_ -= gone;
  free_uncached_ += gone;
  if (keep_blocks == 0) {
    lru_.erase(e.lru_key);
    e.lru_key = 0;
  }
}

bool Engine::allocate(SessionId s, std::uint32_t blocks, Time now) {
  if (blocks > free_blocks()) return false;
  const std::uint32_t wanted = blocks;
  const std::uint32_t plain = std::min(blocks, free_uncached_);
  free_uncached_ -= plain;
  blocks -= plain;
  while (blocks > 0) {
    // Evict the least recently freed session's cached prefix, from its tail.
    auto it = lru_.begin();
    const SessionId victim = it->second;
    SessKv& e = kv_[victim];
    const std::uint32_t take = std::min(blocks, e.cached_blocks);
    moved(victim, KvPlace::kCached, KvPlace::kFree, take);
    e.cached_blocks -= take;
    cached_total_ -= take;
    blocks -= take;
    if (e.cached_blocks == 0) {
      lru_.erase(it);
      e.lru_key = 0;
      if (!e.active) host_.kv_changed(id_, victim, sched::KvChange::kEvicted, 0, now);
    }
  }
  moved(s, KvPlace::kFree, KvPlace::kHeld, wanted);
  return true;
}

void Engine::release_to_cache(SessionId s, std::uint32_t kv_tokens, std::uint32_t blocks, Time now) {
  const std::uint32_t full = std::min(blocks, kv_tokens / block_size_);
  cache_put(s, full, now, KvPlace::kHeld);
  moved(s, KvPlace::kHeld, KvPlace::kFree, blocks - full);
  free_uncached_ += blocks - full;
}

std::vector<sched::PinnedKv>::iterator Engine::find_pin(SessionId s) {
  return std::find_if(pins_.begin(), pins_.end(), [&](const sched::PinnedKv& p) { return p.session == s; });
}

void Engine::remove_pin(std::vector<sched::PinnedKv>::iterator it, Time now) {
  const SessionId s = it->session;
  const std::uint32_t blocks = take_pin(it, now, KvPlace::kCached);
  cache_put(s, blocks, now, KvPlace::kCached);
}

std::uint32_t Engine::take_pin(std::vector<sched::PinnedKv>::iterator it, Time now, KvPlace to) {
  account_pinned(now);
  const std::uint32_t blocks = it->blocks;
  moved(it->session, KvPlace::kPinned, to, blocks);
  pinned_blocks_ -= blocks;
  kv_[it->session].pinned_blocks = 0;
  pins_.erase(it);
  return blocks;
}

void Engine::add_pin(SessionId s, std::uint32_t blocks, Time now, Time until) {
  if (blocks == 0) return;
  account_pinned(now);
  pins_.push_back({s, blocks, now, until});
  pinned_blocks_ += blocks;
  kv_[s].pinned_blocks = blocks;
}

bool Engine::active(SessionId s) const {
  auto it = kv_.find(s);
  return it != kv_.end() && it->second.active;
}

void Engine::account_pinned(Time now) {
  if (now > pinned_since_) {
    counters_.pinned_block_seconds +=
        static_cast<double>(pinned_blocks_) * std::chrono::duration<double>(now - pinned_since_).count();
    pinned_since_ = now;
  }
}

void Engine::violation(std::string what) {
  if (violations_++ == 0) first_violation_ = "engine " + std::to_string(id_) + ": " + std::move(what);
}

void Engine::check_conservation() {
  std::uint64_t held = 0;
  for (const Req& q : running_) held += q.r.blocks_held;
  for (const Req& q : waiting_) held += q.r.blocks_held;
  const std::uint64_t total =
      held + pinned_blocks_ + offloading_blocks_ + static_cast<std::uint64_t>(cached_total_) + free_uncached_;
  if (total != preset_.gpu_blocks) {
    violation("blocks do not add up: " + std::to_string(held) + " held + " + std::to_string(pinned_blocks_) +
              " pinned + " + std::to_string(offloading_blocks_) + " offloading + " + std::to_string(cached_total_) +
              " cached + " + std::to_string(free_uncached_) + " free != " + std::to_string(preset_.gpu_blocks));
  }
}

// ---- sessions and control actions ---------------------------------------------

void Engine::submit(const RoundWork& work, Time now) {
  SessKv& e = kv_[work.session];
  e.active = true;
  e.content = work.content;
  const std::uint32_t keep = work.shared_prefix / block_size_;
  SessionContent& c = *work.content;
  c.computed_high = std::min(c.computed_high, work.shared_prefix);
  if (host_pool_ != nullptr) {
    host_pool_->cut(work.session, c, keep * block_size_, block_size_);
  } else {
    c.host_tokens = std::min(c.host_tokens, keep * block_size_);
  }
  cache_cut(work.session, keep);

  Req q;
  q.kv = &e;
  q.work = work;
  q.target = work.prompt_tokens;
  q.r.id = next_request_++;
  q.r.session = work.session;
  q.r.round = work.round;
  q.r.phase = sched::RequestPhase::kWaiting;
  q.r.prompt_tokens = work.prompt_tokens;
  q.r.max_output_tokens = work.output_tokens;
  q.r.arrival = work.submitted;
  q.r.priority = work.priority;
  q.r.last_round = work.last_round;
  // An offload copy still in flight reads blocks that are intact: the round
  // can use them (the copy is abandoned; the link time is spent).
  for (std::size_t i = 0; i < offloading_.size(); ++i) {
    if (offloading_[i].session != work.session) continue;
    offloading_blocks_ -= offloading_[i].blocks;
    cache_put(work.session, offloading_[i].blocks, now, KvPlace::kOffloading);
    offloading_[i] = offloading_.back();
    offloading_.pop_back();
    cache_cut(work.session, keep);
    break;
  }
  // A pin beyond the shared prefix holds stale KV: that part is freed.
  if (auto pin = find_pin(work.session); pin != pins_.end() && pin->blocks > keep) {
    account_pinned(now);
    moved(work.session, KvPlace::kPinned, KvPlace::kFree, pin->blocks - keep);
    free_uncached_ += pin->blocks - keep;
    pinned_blocks_ -= pin->blocks - keep;
    pin->blocks = keep;
    e.pinned_blocks = keep;
    if (keep == 0) take_pin(pin, now, KvPlace::kFree);
  }
  waiting_.push_back(q);
}

std::uint32_t Engine::prefix_hit(SessionId session, std::uint32_t shared_prefix, const SessionContent& content) const {
  const std::uint32_t keep = shared_prefix / block_size_;
  std::uint32_t blocks = 0;
  if (auto it = kv_.find(session); it != kv_.end()) {
    blocks = it->second.pinned_blocks != 0 ? it->second.pinned_blocks : it->second.cached_blocks;
  }
  return std::max(std::min(blocks, keep) * block_size_, std::min(content.host_tokens, keep * block_size_));
}

void Engine::end_session(SessionId session, Time now) {
  if (auto pin = find_pin(session); pin != pins_.end()) remove_pin(pin, now);
  auto it = kv_.find(session);
  if (it != kv_.end() && it->second.content != nullptr && host_pool_ != nullptr) {
    host_pool_->cut(session, *it->second.content, 0, block_size_);  // its copy is freed
  }
  if (it != kv_.end()) {
    it->second.active = false;
    it->second.content = nullptr;
  }
}

void Engine::pin(SessionId session, Time until, Time now) {
  if (auto p = find_pin(session); p != pins_.end()) {
    p->until = until;
    return;
  }
  if (active(session)) return;
  add_pin(session, cache_take(session, KvPlace::kPinned), now, until);
}

void Engine::unpin(SessionId session, Time now) {
  if (auto p = find_pin(session); p != pins_.end()) remove_pin(p, now);
}

std::uint32_t Engine::take_idle_kv(SessionId s, Time now, KvPlace to) {
  if (active(s)) return 0;
  std::uint32_t blocks = 0;
  if (auto p = find_pin(s); p != pins_.end()) blocks = take_pin(p, now, to);
  return blocks + cache_take(s, to);
}

void Engine::drop(SessionId session, Time now) {
  const std::uint32_t blocks = take_idle_kv(session, now, KvPlace::kFree);
  if (blocks == 0) return;
  free_uncached_ += blocks;
  host_.kv_changed(id_, session, sched::KvChange::kDropped, blocks, now);
}

void Engine::offload(SessionId session, Time now) {
  auto it = kv_.find(session);
  if (it == kv_.end() || it->second.content == nullptr) return;
  // The observer sees the blocks go to the copy; with a copy already in host
  // memory they come straight back to the cache.
  const std::uint32_t blocks = take_idle_kv(session, now, KvPlace::kOffloading);
  if (blocks == 0) return;
  const std::uint32_t tokens = blocks * block_size_;
  if (it->second.content->host_tokens >= tokens) {
    // A copy is already in host memory: freeing the GPU blocks is enough.
    cache_put(session, blocks, now, KvPlace::kOffloading);
  } else {
    const Time start = std::max(now, link_free_);
    const Time done = start + from_us(link_time_scale_ * (preset_.swap_fixed_us + preset_.swap_us_per_token * tokens));
    link_free_ = done;
    offloading_.push_back({session, blocks, tokens, done});
    offloading_blocks_ += blocks;
  }
  host_.kv_changed(id_, session, sched::KvChange::kOffloaded, blocks, now);
}

std::optional<Time> Engine::complete_offloads(Time now) {
  std::optional<Time> next;
  for (std::size_t i = 0; i < offloading_.size();) {
    Offloading& o = offloading_[i];
    if (o.done > now) {
      next = next ? std::min(*next, o.done) : o.done;
      ++i;
      continue;
    }
    offloading_blocks_ -= o.blocks;
    auto it = kv_.find(o.session);
    if (it != kv_.end() && it->second.content != nullptr) store_host(o.session, *it->second.content, o.tokens, o.done);
    // The GPU copy stays reusable until the cache evicts it.
    cache_put(o.session, o.blocks, now, KvPlace::kOffloading);
    offloading_[i] = offloading_.back();
    offloading_.pop_back();
  }
  return next;
}

// ---- steps ----------------------------------------------------------------------

std::uint32_t Engine::hit_tokens(const Req& q, std::uint32_t* from_host, std::uint32_t* pinned) const {
  // q.kv is its session's entry, made at submit (entries are never erased,
  // and an unordered_map's elements stay where they are).
  const SessKv& e = *q.kv;
  const std::uint32_t gpu = (e.pinned_blocks != 0 ? e.pinned_blocks : e.cached_blocks) * block_size_;
  // A pinned prefix is referenced: hitting it takes nothing from the free pool.
  if (pinned != nullptr) *pinned = e.pinned_blocks;
  const std::uint32_t host = q.work.content != nullptr ? q.work.content->host_tokens : 0;
  const std::uint32_t hit = std::min(std::max(gpu, host), q.target);
  if (from_host != nullptr) *from_host = hit > gpu ? hit - gpu : 0;
  return hit;
}

std::optional<Time> Engine::start_step(Time now) {
  if (in_step_ || !has_work()) return std::nullopt;
  complete_offloads(now);
  for (int attempt = 0; attempt < 4; ++attempt) {
    step_requests_.clear();
    step_requests_.reserve(running_.size() + waiting_.size());
    for (const Req& q : running_) step_requests_.push_back(q.r);
    for (const Req& q : waiting_) {
      sched::StepRequest& r = step_requests_.emplace_back(q.r);
      r.cached_tokens = hit_tokens(q, nullptr, &r.blocks_held);
    }
    sched::StepInput in;
    in.token_budget = params_.token_budget;
    in.max_seqs = params_.max_seqs;
    in.block_size = block_size_;
    in.free_blocks = free_blocks();
    in.max_model_len = params_.max_model_len;
    in.saturating_tokens = saturating_tokens_;
    in.requests = step_requests_;
    in.pinned = pins_;
    plan_.clear();
    scheduler_.plan(in, now, plan_);

    for (SessionId s : plan_.unpin) {
      if (auto p = find_pin(s); p != pins_.end()) remove_pin(p, now);
    }
    const std::size_t n_run = running_.size();
    std::vector<bool>& preempted = preempted_;
    preempted.assign(n_run, false);
    double swap_us = 0.0;  // swapping out runs before the step computes
    auto preempt = [&](std::uint32_t i, bool swap) {
      if (i >= n_run || preempted[i]) {
        violation("plan preempts request " + std::to_string(i) + ", which is not running");
        return;
      }
      preempted[i] = true;
      Req& q = running_[i];
      // A swap copies the full blocks of what it computed to host memory;
      // without room there it is a preemption by recompute.
      const std::uint32_t full = std::min(q.r.blocks_held, q.r.computed_tokens / block_size_) * block_size_;
      if (swap && full > 0 && q.work.content != nullptr && store_host(q.r.session, *q.work.content, full, now)) {
        if (observer_ != nullptr) observer_->swapped(q.r.session, full);
        swap_us += preset_.swap_fixed_us + preset_.swap_us_per_token * full;
        ++counters_.swaps;
      }
      release_to_cache(q.r.session, q.r.computed_tokens, q.r.blocks_held, now);
      q.target = q.work.prompt_tokens + q.r.output_tokens;
      q.r.phase = sched::RequestPhase::kPreempted;
      q.r.prompt_tokens = q.target;
      q.r.computed_tokens = 0;
      q.r.blocks_held = 0;
      q.r.cached_tokens = 0;
      q.preempted = true;
      ++counters_.preemptions;
    };
    for (std::uint32_t i : plan_.preempt) preempt(i, false);
    for (std::uint32_t i : plan_.swap) preempt(i, true);

    StepShape shape;
    double reload_us = 0.0;
    std::uint64_t recomputed_in_step = 0;
    std::vector<bool>& scheduled = scheduled_;
    scheduled.assign(step_requests_.size(), false);
    std::vector<std::uint32_t>& started = started_;  // waiting indices in scheduling order
    started.clear();
    for (const sched::ScheduledChunk& chunk : plan_.run) {
      const std::uint32_t idx = chunk.request;
      if (idx >= step_requests_.size() || scheduled[idx] || (idx < n_run && preempted[idx]) || chunk.tokens == 0) {
        violation("plan schedules request " + std::to_string(idx) + " that cannot run");
        continue;
      }
      Req& q = idx < n_run ? running_[idx] : waiting_[idx - n_run];
      std::uint32_t start = q.r.computed_tokens;
      std::uint32_t from_host = 0;
      if (q.r.phase != sched::RequestPhase::kRunning) {
        // The hit as it is now: a chunk earlier in this step may have evicted part of it.
        start = hit_tokens(q, &from_host);
        if (start >= q.target) start = q.target - 1;
        // Its own prefix comes off the pin or out of the cache.
        std::uint32_t own = 0;
        if (auto pin = find_pin(q.r.session); pin != pins_.end()) {
          own = take_pin(pin, now, KvPlace::kHeld);
        } else {
          own = cache_take(q.r.session, KvPlace::kHeld);
        }
        q.r.blocks_held = own;
        from_host = start > own * block_size_ ? start - own * block_size_ : 0;
      }
      std::uint32_t tokens = chunk.tokens;
      const bool prefill = start < q.target;
      if (prefill) {
        tokens = std::min(tokens, q.target - start);
      } else {
        tokens = 1;
      }
      const std::uint32_t need_total = blocks_for(static_cast<std::uint64_t>(start) + tokens);
      const std::uint32_t need = need_total > q.r.blocks_held ? need_total - q.r.blocks_held : 0;
      if (!allocate(q.r.session, need, now)) {
        violation("plan needs " + std::to_string(need) + " blocks with " + std::to_string(free_blocks()) + " free");
        if (q.r.phase != sched::RequestPhase::kRunning) {
          release_to_cache(q.r.session, q.r.blocks_held * block_size_, q.r.blocks_held, now);
          q.r.blocks_held = 0;
        }
        continue;
      }
      q.r.blocks_held += need;
      scheduled[idx] = true;
      const bool produces = !prefill || start + tokens == q.target;
      if (observer_ != nullptr) {
        if (from_host > 0) observer_->reloaded(q.r.session, start - from_host, from_host);
        observer_->computed(q.r.session, start, tokens, produces);
      }
      if (!q.counted_reuse) {
        q.counted_reuse = true;
        counters_.prompt_tokens += q.work.prompt_tokens;
        counters_.reused_tokens += std::min(start, q.work.prompt_tokens);
      }
      if (from_host > 0) {
        reload_us += preset_.swap_fixed_us + preset_.swap_us_per_token * from_host;
        if (host_pool_ != nullptr) host_pool_->touch(q.r.session, now);
      }
      SessionContent& c = *q.work.content;
      const std::uint32_t recomputed = start < c.computed_high ? std::min(tokens, c.computed_high - start) : 0;
      counters_.recomputed_tokens += recomputed;
      // Recomputing its own evicted KV when a session comes back from its
      // tool, as opposed to after a preemption of this round.
      if (!q.preempted) counters_.resume_recomputed_tokens += recomputed;
      recomputed_in_step += recomputed;
      counters_.new_tokens += tokens - recomputed;
      c.computed_high = std::max(c.computed_high, start + tokens);
      counters_.computed_tokens += tokens;
      ++shape.seqs;
      shape.tokens += tokens;
      if (prefill) {
        shape.prefill_pairs += tokens * (start + tokens / 2.0);
      } else {
        shape.decode_context += start + 1;
      }
      q.produced = produces;
      if (q.produced) ++q.r.output_tokens;
      q.r.computed_tokens = start + tokens;
      q.r.cached_tokens = 0;
      q.r.last_scheduled = now;
      if (q.r.phase != sched::RequestPhase::kRunning) {
        q.r.phase = sched::RequestPhase::kRunning;
        started.push_back(idx - static_cast<std::uint32_t>(n_run));
      }
    }

    // New queues: running (in order) + newly started; preempted go to the
    // front of the waiting queue, the most recently preempted first (vLLM).
    // Most steps (decode) start and preempt nothing: the queues stay.
    if (!started.empty() || !plan_.preempt.empty() || !plan_.swap.empty()) {
      std::vector<Req> next_running;
      next_running.reserve(running_.size() + started.size());
      std::deque<Req> next_waiting;
      for (std::size_t i = 0; i < n_run; ++i) {
        if (preempted[i]) {
          next_waiting.push_front(running_[i]);
        } else {
          next_running.push_back(running_[i]);
        }
      }
      moved_.assign(waiting_.size(), false);
      for (std::uint32_t w : started) {
        next_running.push_back(waiting_[w]);
        moved_[w] = true;
      }
      for (std::size_t w = 0; w < waiting_.size(); ++w) {
        if (!moved_[w]) next_waiting.push_back(waiting_[w]);
      }
      running_ = std::move(next_running);
      waiting_ = std::move(next_waiting);
    }

    if (shape.seqs > 0) {
      const double compute_us = preset_.step.step_us(shape);
      const double us = compute_us + reload_us + swap_us;
      // Memory waste (InferCept's measure, in block-seconds): while a step
      // recomputes lost KV or copies KV over the link, every block the batch
      // holds waits; the recompute's share of the step is its share of the
      // tokens.
      double held = 0;
      for (const Req& q : running_) held += q.r.blocks_held;
      const double wasted_us =
          (shape.tokens > 0 ? compute_us * static_cast<double>(recomputed_in_step) / shape.tokens : 0.0) + reload_us +
          swap_us;
      counters_.kv_waste_block_seconds += held * wasted_us * 1e-6;
      in_step_ = true;
      step_start_ = now;
      ++steps_;
      last_step_tokens_ = static_cast<std::uint32_t>(shape.tokens);
      last_shape_ = shape;
      last_step_time_ = from_us(us);
      counters_.gpu_busy_s += us * 1e-6;
      return now + last_step_time_;
    }
    // Nothing ran. Plan again only if the plan freed something.
    if (plan_.unpin.empty() && plan_.preempt.empty() && plan_.swap.empty()) break;
  }
  return std::nullopt;
}

bool Engine::abort(SessionId session, Time now) {
  auto release = [&](const Req& q) {
    moved(session, KvPlace::kHeld, KvPlace::kFree, q.r.blocks_held);
    free_uncached_ += q.r.blocks_held;
    kv_[session].active = false;
    host_.kv_changed(id_, session, sched::KvChange::kDropped, q.r.blocks_held, now);
  };
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->r.session != session) continue;
    release(*it);
    running_.erase(it);
    return true;
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->r.session != session) continue;
    release(*it);
    waiting_.erase(it);
    return true;
  }
  return false;
}

void Engine::stop_round(SessionId session) {
  for (Req& q : running_) {
    if (q.r.session != session || q.r.output_tokens == 0) continue;
    q.work.output_tokens = q.r.output_tokens;
    q.r.max_output_tokens = q.r.output_tokens;
    return;
  }
}

void Engine::finish_step(Time now) {
  if (!in_step_) return;
  in_step_ = false;
  check_conservation();
  std::uint64_t running_tokens = 0;
  for (const Req& q : running_) running_tokens += q.r.computed_tokens;
  for (std::size_t i = 0; i < running_.size();) {
    Req& q = running_[i];
    if (!q.produced) {
      ++i;
      continue;
    }
    q.produced = false;
    if (!q.first_token_sent) {
      q.first_token_sent = true;
      host_.first_token(id_, q.work, now);
    }
    host_.token(id_, q.work, q.r.output_tokens, now);
    if (q.r.output_tokens < q.work.output_tokens) {
      ++i;
      continue;
    }
    // The round is done: what happens to its KV while the tool runs.
    const Req done = q;
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    running_tokens -= done.r.computed_tokens;
    const SessionId s = done.r.session;
    const std::uint32_t kv_tokens = done.r.computed_tokens;
    const std::uint32_t blocks = done.r.blocks_held;
    const std::uint32_t context = done.work.prompt_tokens + done.r.output_tokens;
    kv_[s].active = false;
    sched::RoundEndInfo info;
    info.session = s;
    info.tool_follows = !done.work.last_round;
    info.tool = done.work.tool;
    info.context_tokens = context;
    info.blocks = blocks;
    info.other_running_tokens = static_cast<std::uint32_t>(std::min<std::uint64_t>(running_tokens, UINT32_MAX));
    const sched::KeepPlan keep = scheduler_.on_round_end(info, now);
    const std::uint32_t full = std::min(blocks, kv_tokens / block_size_);
    switch (done.work.last_round ? sched::KeepDecision::kRelease : keep.decision) {
      case sched::KeepDecision::kRelease:
        release_to_cache(s, kv_tokens, blocks, now);
        break;
      case sched::KeepDecision::kPin:
        moved(s, KvPlace::kHeld, KvPlace::kPinned, full);
        moved(s, KvPlace::kHeld, KvPlace::kFree, blocks - full);
        free_uncached_ += blocks - full;
        add_pin(s, full, now, keep.until);
        break;
      case sched::KeepDecision::kOffload:
        release_to_cache(s, kv_tokens, blocks, now);
        offload(s, now);
        break;
      case sched::KeepDecision::kDrop:
        moved(s, KvPlace::kHeld, KvPlace::kFree, blocks);
        free_uncached_ += blocks;
        break;
    }
    host_.round_done(id_, done.work, blocks, context, now);
  }
}

sched::KvPoolStats Engine::stats(Time now) const {
  sched::KvPoolStats k;
  k.blocks_total = preset_.gpu_blocks;
  k.blocks_free = free_blocks();
  k.blocks_pinned = pinned_blocks_;
  if (host_pool_ != nullptr) {
    k.blocks_offloaded = static_cast<std::uint32_t>(std::min<std::uint64_t>(host_pool_->used_blocks(), UINT32_MAX));
    k.host_blocks_total =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(host_pool_->capacity_blocks(), UINT32_MAX));
  }
  if (now != Time{} && link_free_ > now) k.offload_backlog = link_free_ - now;
  if (now != Time{} && host_pool_ != nullptr) k.host_oldest_idle = host_pool_->oldest_idle(now);
  k.running_seqs = static_cast<std::uint32_t>(running_.size());
  k.waiting_seqs = static_cast<std::uint32_t>(waiting_.size());
  k.step_tokens = last_step_tokens_;
  k.step_time = last_step_time_;
  return k;
}

}  // namespace tandem::sim
