// The ledger carried out on llama.cpp's KV cache.
#include "engines/llama/kv_executor.h"

#include <algorithm>
#include <chrono>

#include <fmt/core.h>

namespace tandem::llama {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t ns_since(Clock::time_point t0) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

constexpr std::size_t idx(KvPlace p) { return static_cast<std::size_t>(p); }

}  // namespace

KvExecutor::KvExecutor(Context& ctx, std::uint32_t block_size, const TokenSource& tokens, std::uint64_t host_budget)
    : ctx_(ctx), block_size_(block_size), tokens_(tokens), host_budget_(host_budget), batch_(ctx.n_batch()) {
  const auto n = static_cast<SeqId>(ctx.n_seq_max());
  free_seqs_.reserve(static_cast<std::size_t>(n));
  for (SeqId s = n - 1; s >= 0; --s) free_seqs_.push_back(s);  // id 0 first
}

std::uint32_t KvExecutor::total_blocks(const Seq& s) const {
  return s.blocks[idx(KvPlace::kHeld)] + s.blocks[idx(KvPlace::kPinned)] + s.blocks[idx(KvPlace::kCached)] +
         s.blocks[idx(KvPlace::kOffloading)];
}

KvExecutor::Seq& KvExecutor::seq(SessionId session) { return seqs_[session]; }

SeqId KvExecutor::ensure_id(Seq& s) {
  if (s.id >= 0) return s.id;
  if (free_seqs_.empty()) return -1;
  s.id = free_seqs_.back();
  free_seqs_.pop_back();
  return s.id;
}

void KvExecutor::cut(Seq& s, std::uint32_t keep) {
  if (s.resident <= keep) return;
  if (s.id >= 0) ctx_.seq_rm(s.id, static_cast<std::int32_t>(keep), -1);
  stats_.cut_tokens += s.resident - keep;
  resident_total_ -= s.resident - keep;
  s.resident = keep;
}

void KvExecutor::release_if_empty(SessionId session, Seq& s) {
  if (total_blocks(s) != 0) return;
  cut(s, 0);
  if (s.id >= 0) {
    free_seqs_.push_back(s.id);
    s.id = -1;
  }
  if (s.host.empty()) seqs_.erase(session);
}

void KvExecutor::violation(std::string what) {
  if (violations_++ == 0) first_violation_ = std::move(what);
}

// ---- sim::KvObserver ------------------------------------------------------------

void KvExecutor::moved(SessionId session, KvPlace from, KvPlace to, std::uint32_t blocks) {
  Seq& s = seq(session);
  s.touched = step_;
  if (from != KvPlace::kFree) {
    if (s.blocks[idx(from)] < blocks) {
      violation(fmt::format("session {:016x}: {} blocks leave place {} holding {}", session, blocks,
                            static_cast<int>(from), s.blocks[idx(from)]));
      s.blocks[idx(from)] = 0;
    } else {
      s.blocks[idx(from)] -= blocks;
    }
  }
  if (to != KvPlace::kFree) s.blocks[idx(to)] += blocks;

  if (to == KvPlace::kFree) {
    // From the tail: the sequence keeps what its remaining blocks hold.
    cut(s, total_blocks(s) * block_size_);
    release_if_empty(session, s);
    return;
  }
  if (to == KvPlace::kOffloading) copy_to_host(session, s);
}

void KvExecutor::swapped(SessionId session, std::uint32_t /*tokens*/) {
  // The sequence holds at least the swapped tokens (the whole blocks of what
  // it computed); the copy takes all it holds, as an offload's does.
  auto it = seqs_.find(session);
  if (it != seqs_.end()) copy_to_host(session, it->second);
}

void KvExecutor::copy_to_host(SessionId session, Seq& s) {
  if (s.id >= 0 && s.resident > 0 && !(s.host_valid >= s.resident && s.host_tokens >= s.resident)) {
    const auto t0 = Clock::now();
    stats_.host_bytes -= s.host.size();
    if (ctx_.state_get(s.id, s.host)) {
      s.host_tokens = s.resident;
      s.host_valid = s.resident;
      ++stats_.offloads;
      stats_.offloaded_bytes += s.host.size();
      stats_.offload_ns += ns_since(t0);
      stats_.host_bytes += s.host.size();
      enforce_host_budget(session);
    } else {
      violation(fmt::format("session {:016x}: llama_state_seq_get_data failed on sequence {}", session, s.id));
      s.host.clear();
      s.host_tokens = s.host_valid = 0;
    }
  }
}

void KvExecutor::reloaded(SessionId session, std::uint32_t first_token, std::uint32_t tokens) {
  Seq& s = seq(session);
  s.touched = step_;
  const std::uint32_t upto = first_token + tokens;
  if (ensure_id(s) < 0) {
    violation(fmt::format("session {:016x}: no free sequence for a reload", session));
    return;
  }
  if (s.host.empty() || s.host_valid < upto || s.host_tokens < upto) {
    violation(fmt::format("session {:016x}: reload of tokens [{}, {}) without a host copy of them (copy holds {})",
                          session, first_token, upto, s.host_valid));
    return;
  }
  const auto t0 = Clock::now();
  resident_total_ -= s.resident;
  if (ctx_.state_set(s.id, s.host)) {
    s.resident = s.host_tokens;
    resident_total_ += s.resident;
    cut(s, upto);
    ++stats_.restores;
    stats_.restored_bytes += s.host.size();
    stats_.restore_ns += ns_since(t0);
  } else {
    // The copy holds more tokens than the free cells take: computed()
    // recomputes what the step needs instead (counted, not a violation).
    ctx_.seq_rm(s.id, -1, -1);
    s.resident = 0;
    s.reload_failed = true;
    ++stats_.restore_failures;
  }
}

void KvExecutor::computed(SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) {
  Seq& s = seq(session);
  s.touched = step_;
  const SeqId id = ensure_id(s);
  if (id < 0) {
    violation(fmt::format("session {:016x}: no free sequence id", session));
    return;
  }
  const std::span<const Token> ids = tokens_.tokens(session);
  if (ids.size() < static_cast<std::size_t>(first_token) + tokens) {
    violation(fmt::format("session {:016x}: the step computes tokens [{}, {}) of a context of {}", session, first_token,
                          first_token + tokens, ids.size()));
    return;
  }
  cut(s, first_token);
  if (s.resident < first_token) {
    // The sequence does not reach where the step starts: compute the gap
    // now, on its own, so the step's batch stays within its size.
    if (!s.reload_failed) {
      violation(fmt::format("session {:016x}: the step starts at token {} but its sequence holds {}", session,
                            first_token, s.resident));
    }
    Batch gap(ctx_.n_batch());
    for (std::uint32_t p = s.resident; p < first_token;) {
      gap.clear();
      const std::uint32_t end = std::min(first_token, p + gap.capacity());
      for (; p < end; ++p) gap.add(ids[p], static_cast<std::int32_t>(p), id, false);
      if (ctx_.decode(gap) != 0) {
        violation(fmt::format("session {:016x}: recomputing its tokens up to {} failed", session, first_token));
        return;
      }
    }
    stats_.recomputed_tokens += first_token - s.resident;
    resident_total_ += first_token - s.resident;
    s.resident = first_token;
  }
  s.reload_failed = false;
  step_sessions_.push_back(session);
  for (std::uint32_t p = first_token; p < first_token + tokens; ++p) {
    const bool last = p + 1 == first_token + tokens;
    const int i = batch_.add(ids[p], static_cast<std::int32_t>(p), id, samples && last);
    if (i < 0) {
      violation(fmt::format("session {:016x}: the step's batch is over its {} tokens", session, batch_.capacity()));
      return;
    }
    if (samples && last) samples_.push_back({session, i});
  }
  s.resident += tokens;
  resident_total_ += tokens;
}

// ---- steps ----------------------------------------------------------------------

void KvExecutor::begin() {
  ++step_;
  batch_.clear();
  samples_.clear();
  step_sessions_.clear();
}

int KvExecutor::decode() {
  if (batch_.size() == 0) return 0;
  return ctx_.decode(batch_);
}

void KvExecutor::enforce_host_budget(SessionId keep) {
  if (host_budget_ == 0) return;
  while (stats_.host_bytes > host_budget_) {
    // The least recently used copy, the one just made last of all.
    SessionId victim = 0;
    const Seq* oldest = nullptr;
    for (const auto& [session, s] : seqs_) {
      if (s.host.empty() || session == keep) continue;
      if (oldest == nullptr || s.touched < oldest->touched) {
        oldest = &s;
        victim = session;
      }
    }
    if (oldest == nullptr) victim = keep;  // the new copy alone is over the budget
    Seq& v = seqs_.at(victim);
    if (v.host.empty()) return;
    stats_.host_bytes -= v.host.size();
    std::vector<std::uint8_t>().swap(v.host);
    v.host_tokens = v.host_valid = 0;
    ++stats_.host_evictions;
    evicted_hosts_.push_back(victim);
    if (v.id < 0 && total_blocks(v) == 0) seqs_.erase(victim);
  }
}

std::vector<SessionId> KvExecutor::take_evicted_hosts() {
  std::vector<SessionId> out;
  out.swap(evicted_hosts_);
  return out;
}

void KvExecutor::trim_host(SessionId session, std::uint32_t tokens) {
  auto it = seqs_.find(session);
  if (it != seqs_.end()) it->second.host_valid = std::min(it->second.host_valid, tokens);
}

void KvExecutor::forget_host(SessionId session) {
  auto it = seqs_.find(session);
  if (it == seqs_.end()) return;
  stats_.host_bytes -= it->second.host.size();
  std::vector<std::uint8_t>().swap(it->second.host);
  it->second.host_tokens = it->second.host_valid = 0;
  if (it->second.id < 0 && total_blocks(it->second) == 0) seqs_.erase(it);
}

std::uint32_t KvExecutor::resident(SessionId session) const {
  auto it = seqs_.find(session);
  return it == seqs_.end() ? 0 : it->second.resident;
}

std::vector<SessionId> KvExecutor::idle_sessions() const {
  std::vector<std::pair<std::uint64_t, SessionId>> idle;
  for (const auto& [session, s] : seqs_) {
    if (s.id >= 0 && s.blocks[idx(KvPlace::kHeld)] == 0) idle.emplace_back(s.touched, session);
  }
  std::sort(idle.begin(), idle.end());
  std::vector<SessionId> out;
  out.reserve(idle.size());
  for (const auto& [touched, session] : idle) out.push_back(session);
  return out;
}

std::string KvExecutor::check() const {
  std::vector<bool> owned(ctx_.n_seq_max(), false);
  for (const auto& [session, s] : seqs_) {
    if (s.id < 0) {
      if (s.resident != 0) return fmt::format("session {:016x}: {} tokens and no sequence", session, s.resident);
      continue;
    }
    owned[static_cast<std::size_t>(s.id)] = true;
    const std::int32_t lo = ctx_.seq_pos_min(s.id);
    const std::int32_t hi = ctx_.seq_pos_max(s.id);
    const std::uint32_t held = lo < 0 ? 0 : static_cast<std::uint32_t>(hi - lo + 1);
    if (s.resident == 0 ? lo >= 0 : (lo != 0 || held != s.resident)) {
      return fmt::format("session {:016x}: the ledger has positions [0, {}) in sequence {}, llama.cpp [{}, {}]",
                         session, s.resident, s.id, lo, hi);
    }
    if (static_cast<std::uint64_t>(total_blocks(s)) * block_size_ < s.resident) {
      return fmt::format("session {:016x}: {} tokens in {} blocks of {}", session, s.resident, total_blocks(s),
                         block_size_);
    }
  }
  for (std::size_t i = 0; i < owned.size(); ++i) {
    if (!owned[i] && ctx_.seq_pos_max(static_cast<SeqId>(i)) >= 0) {
      return fmt::format("sequence {} holds positions up to {} and belongs to no session", i,
                         ctx_.seq_pos_max(static_cast<SeqId>(i)));
    }
  }
  const std::uint64_t used = ctx_.cells_used(static_cast<SeqId>(ctx_.n_seq_max()));
  if (used != resident_total_) return fmt::format("llama.cpp uses {} cells, the ledger {}", used, resident_total_);
  return {};
}

bool KvExecutor::verify() {
  std::string e = check();
  if (e.empty()) return false;
  violation(std::move(e));
  return true;
}

KvExecutorStats KvExecutor::stats() const {
  KvExecutorStats s = stats_;
  s.seqs_in_use = ctx_.n_seq_max() - static_cast<std::uint32_t>(free_seqs_.size());
  return s;
}

}  // namespace tandem::llama
