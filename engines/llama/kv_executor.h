// tandem-llama's KV executor: sim::Engine's block accounting (the ledger)
// carried out on llama.cpp's unified KV cache (docs/llama.md "KV cache").
//
// sim::Engine decides, llama.cpp holds. The engine reports every move of a
// session's blocks and every token a step computes (sim::KvObserver); this
// class keeps, per session, the llama.cpp sequence it lives in and how many
// of its tokens that sequence holds (positions [0, resident)), and acts:
//
//   computed   the step's tokens go into the batch at their positions (the
//              sequence first cut to where they start); the last one asks
//              for logits when the step samples from it;
//   → kFree    blocks leave from the tail: the sequence is cut to what its
//              remaining blocks hold (llama_memory_seq_rm); a session with
//              no block left gives its sequence id back;
//   → kOffloading   the sequence's state is copied to host memory
//              (llama_state_seq_get_data) unless a copy of it is there; the
//              blocks stay in the cache, reusable, until evicted (vLLM's
//              CPU offload);
//   reloaded   the host copy is restored into the sequence
//              (llama_state_seq_set_data) and cut to the tokens the step
//              reloads.
//
// Moves between held, pinned and cached only relabel blocks. Nothing here
// decides anything: the ledger is sim::Engine's, and check() compares it
// with llama.cpp's own positions after every step.
//
// Thread-safety: one thread (the engine's), like the Context it drives.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engines/llama/runtime.h"
#include "sim/engine.h"

namespace tandem::llama {

using sim::KvPlace;
using sim::SessionId;

// Where the executor finds a session's token ids (prompt, then generated).
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual std::span<const Token> tokens(SessionId session) const = 0;
};

struct KvExecutorStats {
  std::uint64_t offloads = 0, restores = 0;
  std::uint64_t offloaded_bytes = 0, restored_bytes = 0;
  std::uint64_t offload_ns = 0, restore_ns = 0;
  std::uint64_t host_bytes = 0;         // held in host copies now
  std::uint64_t host_evictions = 0;     // copies dropped for the host budget
  std::uint64_t restore_failures = 0;   // restores that did not fit; the tokens were recomputed
  std::uint64_t recomputed_tokens = 0;  // ... how many
  std::uint64_t cut_tokens = 0;         // removed from sequences (seq_rm), in all
  std::uint32_t seqs_in_use = 0;
};

class KvExecutor final : public sim::KvObserver {
 public:
  // `host_budget`: bytes of host copies kept at most (0: no bound); beyond
  // it the least recently used copies go first (take_evicted_hosts()).
  KvExecutor(Context& ctx, std::uint32_t block_size, const TokenSource& tokens, std::uint64_t host_budget = 0);

  // sim::KvObserver (inside sim::Engine's calls).
  void moved(SessionId session, KvPlace from, KvPlace to, std::uint32_t blocks) override;
  void computed(SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) override;
  void reloaded(SessionId session, std::uint32_t first_token, std::uint32_t tokens) override;
  void swapped(SessionId session, std::uint32_t tokens) override;

  // A step: begin() before sim::Engine::start_step, decode() after it.
  void begin();
  // Runs the batch the step built (empty: nothing runs, 0 is returned);
  // llama_decode's result otherwise.
  int decode();
  struct Sample {
    SessionId session;
    int index;  // batch index of its logits
  };
  const std::vector<Sample>& samples() const { return samples_; }
  // The sessions the step computes for, in batch order.
  const std::vector<SessionId>& step_sessions() const { return step_sessions_; }
  std::uint32_t batch_tokens() const { return batch_.size(); }

  // Keeps only the first `tokens` of the session's host copy's use (the
  // prompt diverged after them: its remaining tokens are stale).
  void trim_host(SessionId session, std::uint32_t tokens);
  // The session ended: its host copy goes (its sequence stays while the
  // cache holds its blocks).
  void forget_host(SessionId session);
  // Sessions whose host copy went for the host budget since the last call:
  // the engine must forget them too (sim::SessionContent::host_tokens = 0).
  std::vector<SessionId> take_evicted_hosts();

  std::uint32_t resident(SessionId session) const;
  std::uint64_t resident_total() const { return resident_total_; }
  std::uint32_t free_seqs() const { return static_cast<std::uint32_t>(free_seqs_.size()); }
  // Sessions that hold a sequence and no running or held block, least
  // recently touched first (candidates when sequence ids run short).
  std::vector<SessionId> idle_sessions() const;

  // The ledger against llama.cpp: every session's sequence holds exactly
  // positions [0, resident), every other sequence is empty, and the cells
  // llama.cpp counts equal the ledger's. Returns "" or what differs.
  std::string check() const;
  // check(), counted as a violation when they differ; true then.
  bool verify();
  // Ledger disagreements found by check() or while acting (a step that
  // computes from a position the sequence does not reach).
  std::uint64_t violations() const { return violations_; }
  const std::string& first_violation() const { return first_violation_; }
  KvExecutorStats stats() const;

 private:
  struct Seq {
    SeqId id = -1;
    std::uint32_t resident = 0;      // positions [0, resident) are in the sequence
    std::uint32_t blocks[5] = {};    // the ledger's blocks by KvPlace (kFree unused)
    std::vector<std::uint8_t> host;  // host copy (llama_state_seq_get_data)
    std::uint32_t host_tokens = 0;   // positions the host copy holds
    std::uint32_t host_valid = 0;    // ... of which still the session's content
    std::uint64_t touched = 0;       // last step that used it
    bool reload_failed = false;      // this step's restore did not fit
  };
  std::uint32_t total_blocks(const Seq& s) const;
  Seq& seq(SessionId session);
  SeqId ensure_id(Seq& s);
  void cut(Seq& s, std::uint32_t keep);  // positions >= keep removed
  void release_if_empty(SessionId session, Seq& s);
  void copy_to_host(SessionId session, Seq& s);  // its state to host memory, unless a copy holds it all
  void violation(std::string what);
  void enforce_host_budget(SessionId keep);

  Context& ctx_;
  std::uint32_t block_size_;
  const TokenSource& tokens_;
  std::uint64_t host_budget_;
  std::vector<SessionId> evicted_hosts_;
  Batch batch_;
  std::vector<Sample> samples_;
  std::vector<SessionId> step_sessions_;
  std::unordered_map<SessionId, Seq> seqs_;
  std::vector<SeqId> free_seqs_;
  std::uint64_t resident_total_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t violations_ = 0;
  std::string first_violation_;
  KvExecutorStats stats_;
};

}  // namespace tandem::llama
