// Small hand-made workloads for the node and cluster tests: a session of
// growing prompts with tool calls between rounds, and a node's config.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "sim/node.h"

namespace tandem::sim::fixtures {

// `rounds` rounds from a first prompt of `first_prompt` tokens; each next
// prompt holds the previous context and a tool result; tools alternate
// Read and pytest, `tool_s` × 1..3 seconds. Deterministic in `seed`.
inline SessionSpec session(std::string name, double arrival, std::uint32_t first_prompt, int rounds, double tool_s,
                           std::uint32_t seed) {
  std::mt19937 rng(seed);
  SessionSpec s;
  s.name = std::move(name);
  s.arrival_s = arrival;
  std::uint32_t input = first_prompt;
  for (int i = 0; i < rounds; ++i) {
    RoundSpec r;
    r.input_tokens = input;
    r.output_tokens = 20 + rng() % 200;
    r.tool = i + 1 < rounds ? (i % 2 ? "pytest" : "Read") : "";
    r.tool_seconds = i + 1 < rounds ? tool_s * (1 + rng() % 3) : 0.0;
    s.rounds.push_back(r);
    input += r.output_tokens + 200 + rng() % 2000;
  }
  return s;
}

// h100-llama3-8b, 2 engines, 4 tool cores, under `policy`.
inline SimConfig config(std::string policy) {
  SimConfig c;
  c.preset = *find_preset("h100-llama3-8b");
  c.limits = {c.preset.token_budget, c.preset.max_seqs};
  c.engines = 2;
  c.tool_cores = 4;
  c.policy = std::move(policy);
  return c;
}

}  // namespace tandem::sim::fixtures
