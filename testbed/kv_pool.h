// The emulator's KV block pool: real host memory behind sim::Engine's block
// accounting (docs/testbed.md "KV pool").
//
// sim::Engine counts blocks; it does not name them. The pool observes every
// move the engine reports (sim::KvObserver) and keeps, per session and place
// (held, pinned, cached, offloading), the ordered list of block ids of that
// session's KV, plus a global free list. Memory is one anonymous mapping of
// total_blocks × block_bytes; pages are touched only when a step writes a
// token's KV (a filler pattern derived from the session and the token index),
// so the resident size follows what the engine has computed. An offload
// memcpy's the session's blocks into its host copy (a separate heap buffer);
// a reload memcpy's them back into the blocks the request was given.
//
// The pool is checked against the engine: occupancy() per place must equal
// the engine's counters (tests do so after every action), and errors() counts
// moves the pool could not carry out (more blocks than a place holds), which
// would mean the two disagree.
//
// Thread-safety: one thread (the engine's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/mapping.h"
#include "base/result.h"
#include "sim/engine.h"

namespace tandem::testbed {

using sim::KvPlace;
using sim::SessionId;

struct PoolOccupancy {
  std::uint32_t total = 0;
  std::uint32_t free = 0;  // not reusable (the engine's free-uncached)
  std::uint32_t held = 0;
  std::uint32_t pinned = 0;
  std::uint32_t cached = 0;
  std::uint32_t offloading = 0;
  std::uint32_t host_blocks = 0;      // blocks with a copy in host memory
  std::uint64_t touched_bytes = 0;    // pool bytes written at least once
  std::uint64_t offloaded_bytes = 0;  // memcpy'd to host copies, in all
  std::uint64_t reloaded_bytes = 0;   // memcpy'd back, in all
};

class BlockPool final : public sim::KvObserver {
 public:
  // EINVAL for zero sizes or a pool over 1 TiB; ENOMEM if it cannot be mapped.
  static base::Result<std::unique_ptr<BlockPool>> create(std::uint32_t total_blocks, std::uint32_t block_size,
                                                         std::size_t block_bytes);

  void moved(SessionId session, KvPlace from, KvPlace to, std::uint32_t blocks) override;
  void computed(SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) override;
  void reloaded(SessionId session, std::uint32_t first_token, std::uint32_t tokens) override;

  PoolOccupancy occupancy() const;
  std::uint32_t blocks(SessionId session, KvPlace place) const;
  std::uint32_t host_blocks(SessionId session) const;
  // Keeps only the first `blocks` blocks of the session's host copy (the
  // engine cut its host tokens: the prompt diverged).
  void trim_host(SessionId session, std::uint32_t blocks);
  // Forgets a session that holds nothing (frees its host copy).
  void forget(SessionId session);
  // Moves the pool could not carry out; 0 while it agrees with the engine.
  std::uint64_t errors() const { return errors_; }

  // Whether the session's KV in `place` holds, for every token in
  // [0, tokens), the pattern a step wrote for it (tests: data survives
  // offload and reload). False if the place holds fewer blocks.
  bool holds_tokens(SessionId session, KvPlace place, std::uint32_t tokens) const;
  std::size_t block_bytes() const { return block_bytes_; }

 private:
  struct SessionBlocks {
    std::vector<std::uint32_t> place[5];  // by KvPlace; kFree unused
    std::vector<std::byte> host;          // host copy, block i at i × block_bytes
  };

  BlockPool(base::Mapping memory, std::uint32_t total_blocks, std::uint32_t block_size, std::size_t block_bytes);
  std::byte* block(std::uint32_t id) const { return static_cast<std::byte*>(memory_.data()) + id * block_bytes_; }
  // The bytes of token `t` within its block.
  std::size_t slot_offset(std::uint32_t t) const { return (t % block_size_) * slot_bytes_; }
  std::uint64_t pattern(SessionId s, std::uint32_t token) const;
  void touch(std::uint32_t id);

  base::Mapping memory_;
  std::uint32_t total_;
  std::uint32_t block_size_;
  std::size_t block_bytes_;
  std::size_t slot_bytes_;  // bytes per token within a block (at least 1)
  std::vector<std::uint32_t> free_;
  std::vector<bool> touched_;
  std::unordered_map<SessionId, SessionBlocks> sessions_;
  std::uint32_t count_[5] = {};
  std::uint32_t host_total_ = 0;
  std::uint64_t touched_blocks_ = 0;
  std::uint64_t offloaded_bytes_ = 0;
  std::uint64_t reloaded_bytes_ = 0;
  std::uint64_t errors_ = 0;
};

}  // namespace tandem::testbed
