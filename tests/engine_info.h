// The engine the raw-protocol tests and bench/attack register with tandemd:
// GPU 0, 1,000 blocks of 16 tokens, 64 sequences, 2,048 tokens a step.
#pragma once

#include "ipc/messages.h"

namespace tandem::test_support {

inline ipc::EngineInfo test_engine_info() {
  ipc::EngineInfo e;
  e.gpu_index = 0;
  e.block_size = 16;
  e.total_blocks = 1000;
  e.max_seqs = 64;
  e.token_budget = 2048;
  return e;
}

}  // namespace tandem::test_support
