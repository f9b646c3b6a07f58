// The prefix cache's block hashes for routers, reported to tandemd with
// tandem_kv_blocks_report (docs/daemon.md "KV events for routers"), from
// sim::Engine's KV callbacks: shared by tandem-engine-emu and tandem-llama.
//
// It sits between sim::Engine and the engine's own KV observer (the
// emulator's block pool, tandem-llama's KvExecutor), forwarding every call,
// and keeps per session the chain of its round's prompt blocks
// (testbed::block_hashes) and the hashes reported stored on the device
// ("GPU", a prefix of some prompt's chain) and in host memory ("CPU"):
//   computed   blocks of the prompt that became full: STORED on GPU (a prompt
//              that diverged first REMOVES the old tail);
//   moved      blocks freed from the device leave from the session's tail:
//              what stays bounds the GPU chain, the rest is REMOVED;
//   kv_changed OFFLOADED: the GPU chain is REMOVED from GPU and STORED on
//              CPU; DROPPED: both are REMOVED;
//   reloaded   the host copy comes back: REMOVED from CPU, STORED on GPU.
// One medium per block: it is where the session's KV lives (an engine that
// keeps a host copy after a reload reports it gone from CPU).
//
// Memory: the chains are bounded by the pool's blocks, the host copies and
// the prompts of live sessions; a session's entry goes once it is forgotten
// and holds nothing.
//
// Thread-safety: one thread (the engine's).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include <tandem/tandem.h>

#include "sim/engine.h"

namespace tandem::testbed {

class KvHashReporter final : public sim::KvObserver {
 public:
  // `client` may be NULL (nothing is reported); `inner` gets every call.
  KvHashReporter(tandem_client* client, std::uint32_t block_size, sim::KvObserver& inner)
      : client_(client), block_size_(block_size), inner_(inner) {}

  // The chain of the prompt of the session's round, before sim::Engine
  // schedules it.
  void set_prompt(sim::SessionId session, std::vector<std::uint64_t> chain);
  // From sim::EngineHost::kv_changed.
  void kv_changed(sim::SessionId session, sched::KvChange change);
  // The engine forgot the session: its entry goes once it holds nothing.
  void forget(sim::SessionId session);

  void moved(sim::SessionId session, sim::KvPlace from, sim::KvPlace to, std::uint32_t blocks) override;
  void computed(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) override;
  void reloaded(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens) override;

  std::uint64_t report_errors() const { return report_errors_; }
  std::size_t sessions() const { return hashes_.size(); }

 private:
  struct Hashes {
    std::vector<std::uint64_t> prompt;
    std::vector<std::uint64_t> gpu;
    std::vector<std::uint64_t> cpu;
    std::uint32_t device_blocks = 0;  // held + pinned + cached, from moved()
    bool forgotten = false;
  };
  void report(sim::SessionId session, int op, int medium, std::span<const std::uint64_t> hashes,
              std::optional<std::uint64_t> parent);
  // REMOVED from GPU past `keep`.
  void trim_gpu(sim::SessionId session, Hashes& h, std::size_t keep);
  void maybe_erase(sim::SessionId session);

  tandem_client* client_;
  std::uint32_t block_size_;
  sim::KvObserver& inner_;
  std::unordered_map<sim::SessionId, Hashes> hashes_;
  std::uint64_t report_errors_ = 0;
};

}  // namespace tandem::testbed
