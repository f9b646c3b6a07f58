// tandem-llama's KV mechanisms on a real model (the `tiny` shape from
// scripts/make-model, random weights), in process: the test thread drives
// LlamaEngine::tick() itself and applies directives as tandemd would send
// them. Greedy sampling throughout, so every comparison is exact:
//
//   - a session offloaded to host memory, its GPU copy dropped, and restored
//     into its sequence continues with bit-identical logits and tokens to
//     one never offloaded;
//   - a dropped session recomputes to the same tokens;
//   - N sessions batched together generate what each generates alone;
//   - after every step of a random sequence of directives, the ledger equals
//     llama.cpp's own positions and cell count;
//   - pinned sessions survive pressure; unpinned ones are evicted least
//     recently used first (vLLM's order, the fcfs policy's).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engines/llama/engine.h"
#include "engines/llama/runtime.h"

namespace tandem::llama {
namespace {

using testbed::Job;

constexpr std::uint32_t kBlock = 16;

// The tiny model (the build's, or $TANDEM_TINY_MODEL where the binary runs
// elsewhere), and the layers to put on a GPU ($TANDEM_LLAMA_GPU_LAYERS, -1
// all: scripts/gpu-suite runs these tests on the GPU).
std::string tiny_model() {
  const char* env = std::getenv("TANDEM_TINY_MODEL");
  return env != nullptr && *env != '\0' ? env : TANDEM_TINY_MODEL;
}
int gpu_layers() {
  const char* env = std::getenv("TANDEM_LLAMA_GPU_LAYERS");
  return env != nullptr && *env != '\0' ? std::atoi(env) : 0;
}

class LlamaEngineTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() { init("llama_engine_test", std::getenv("TANDEM_LLAMA_VERBOSE") != nullptr); }

  // A fresh engine (no daemon: every round runnable, the fcfs step half).
  std::unique_ptr<LlamaEngine> engine(std::uint32_t ctx_cells = 4096, std::uint32_t max_seqs = 8,
                                      std::uint32_t budget = 256, std::uint64_t host_kv_bytes = 0) {
    auto model = Model::load({tiny_model(), gpu_layers()});
    EXPECT_TRUE(model) << model.error().context();
    if (!model) return nullptr;
    ContextOptions co;
    co.n_ctx = ctx_cells;
    co.n_batch = budget;
    co.n_ubatch = budget;
    co.n_seq_max = 64;
    co.threads = 1;  // ctest runs suites side by side: two spinning threads on two cores stall
    auto ctx = Context::create(**model, co);
    EXPECT_TRUE(ctx) << ctx.error().context();
    if (!ctx) return nullptr;
    EngineConfig c;
    c.name = "test";
    c.block_size = kBlock;
    c.max_seqs = max_seqs;
    c.token_budget = budget;
    c.record_logits = true;
    c.host_kv_bytes = host_kv_bytes;
    auto e = LlamaEngine::create(c, std::move(*model), std::move(*ctx), nullptr);
    EXPECT_TRUE(e) << e.error().context();
    return e ? std::move(*e) : nullptr;
  }

  static std::shared_ptr<Job> round(const std::string& session, std::uint32_t round, std::uint32_t prompt,
                                    std::uint32_t out) {
    return synthetic_round(session, round, prompt, out);
  }

  // Ticks until every job is done; fails the test after `max_ticks`.
  static void run(LlamaEngine& e, const std::vector<std::shared_ptr<Job>>& jobs, int max_ticks = 100000) {
    for (const auto& j : jobs) ASSERT_EQ(e.submit(j), testbed::SubmitStatus::kQueued);
    for (int t = 0; t < max_ticks; ++t) {
      bool all = true;
      for (const auto& j : jobs) {
        const Job::Progress p = j->wait(0, base::MonotonicClock().now());
        ASSERT_EQ(p.status, 0) << p.error;
        all = all && p.done;
      }
      if (all) return;
      e.tick();
      ASSERT_EQ(e.kv().check(), "") << "after tick " << t;
    }
    FAIL() << "rounds did not finish in " << max_ticks << " ticks";
  }

  static tandem_directive directive(std::uint32_t type, const std::string& session, std::int64_t value = 0) {
    return tandem_directive{type, 0, tandem_session_id(session.c_str()), value};
  }
  static std::uint64_t id(const std::string& s) { return tandem_session_id(s.c_str()); }
  static std::vector<Token> context(const LlamaEngine& e, const std::string& s) {
    const auto t = e.tokens(id(s));
    return {t.begin(), t.end()};
  }
};

// Two rounds of one session: 200 prompt tokens and 12 generated, then 60
// more prompt tokens and 12 generated. `between` runs between the rounds.
template <class F>
void two_rounds(LlamaEngine& e, const std::string& s, F between) {
  LlamaEngineTest::run(e, {LlamaEngineTest::round(s, 0, 200, 12)});
  between();
  LlamaEngineTest::run(e, {LlamaEngineTest::round(s, 1, 272, 12)});
}

TEST_F(LlamaEngineTest, OffloadedAndRestoredContinuesBitIdentically) {
  auto ref = engine();
  ASSERT_TRUE(ref);
  two_rounds(*ref, "a", [] {});

  auto e = engine();
  ASSERT_TRUE(e);
  two_rounds(*e, "a", [&] {
    e->apply(directive(TANDEM_DIR_OFFLOAD, "a"));
    e->tick();  // the copy completes; its GPU blocks stay cached
    e->apply(directive(TANDEM_DIR_DROP, "a"));
    ASSERT_EQ(e->kv().resident(id("a")), 0u) << "the GPU copy is gone";
  });
  const KvExecutorStats x = e->kv().stats();
  EXPECT_EQ(x.offloads, 1u);
  EXPECT_EQ(x.restores, 1u);
  EXPECT_EQ(x.restore_failures, 0u);
  EXPECT_GT(x.offloaded_bytes, 0u);
  EXPECT_EQ(context(*e, "a"), context(*ref, "a"));
  ASSERT_EQ(e->logit_digests(id("a")).size(), 24u);
  EXPECT_EQ(e->logit_digests(id("a")), ref->logit_digests(id("a")));
  EXPECT_EQ(e->kv().violations(), 0u) << e->kv().first_violation();
}

TEST_F(LlamaEngineTest, DroppedSessionRecomputesTheSameTokens) {
  auto ref = engine();
  ASSERT_TRUE(ref);
  two_rounds(*ref, "b", [] {});
  auto e = engine();
  ASSERT_TRUE(e);
  two_rounds(*e, "b", [&] {
    e->apply(directive(TANDEM_DIR_DROP, "b"));
    ASSERT_EQ(e->kv().resident(id("b")), 0u);
  });
  EXPECT_EQ(context(*e, "b"), context(*ref, "b"));
  EXPECT_EQ(e->kv().stats().restores, 0u);
  EXPECT_EQ(e->kv().violations(), 0u) << e->kv().first_violation();
}

TEST_F(LlamaEngineTest, ConcurrentSessionsGenerateWhatEachGeneratesAlone) {
  const std::vector<std::string> names = {"c0", "c1", "c2", "c3"};
  auto together = engine();
  ASSERT_TRUE(together);
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.reserve(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    jobs.push_back(round(names[i], 0, 100 + 37 * static_cast<std::uint32_t>(i), 16));
  }
  run(*together, jobs);
  jobs.clear();
  for (std::size_t i = 0; i < names.size(); ++i) {
    jobs.push_back(round(names[i], 1, 180 + 37 * static_cast<std::uint32_t>(i), 16));
  }
  run(*together, jobs);
  for (const std::string& n : names) {
    auto alone = engine();
    ASSERT_TRUE(alone);
    const std::uint32_t i = static_cast<std::uint32_t>(&n - names.data());
    run(*alone, {round(n, 0, 100 + 37 * i, 16)});
    run(*alone, {round(n, 1, 180 + 37 * i, 16)});
    EXPECT_EQ(context(*together, n), context(*alone, n)) << n;
  }
}

TEST_F(LlamaEngineTest, LedgerEqualsLlamaAfterEveryStepOfRandomDirectives) {
  // A pool of 1,536 cells for 6 sessions of up to ~500 tokens: pressure,
  // eviction and preemption all happen.
  auto e = engine(1536, 4, 128);
  ASSERT_TRUE(e);
  std::mt19937 rng(20261126);
  const std::vector<std::string> names = {"r0", "r1", "r2", "r3", "r4", "r5"};
  std::vector<std::uint32_t> rounds(names.size(), 0), prompt(names.size(), 0);
  std::vector<std::shared_ptr<Job>> live(names.size());
  static constexpr std::uint32_t kTypes[] = {TANDEM_DIR_PIN, TANDEM_DIR_UNPIN, TANDEM_DIR_DROP, TANDEM_DIR_OFFLOAD};
  int steps = 0;
  for (int t = 0; t < 3000 && steps < 300; ++t) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (live[i]) {
        const Job::Progress p = live[i]->wait(0, base::MonotonicClock().now());
        ASSERT_EQ(p.status, 0) << p.error;
        if (!p.done) continue;
        live[i].reset();
      }
      if (rng() % 4 != 0) continue;  // a tool call in between
      prompt[i] += 40 + rng() % 80;
      if (prompt[i] > 420) prompt[i] = 60;  // a new task: the context starts over
      live[i] = round(names[i], rounds[i]++, prompt[i], 4 + rng() % 12);
      ASSERT_EQ(e->submit(live[i]), testbed::SubmitStatus::kQueued);
    }
    if (rng() % 3 == 0) {
      const std::string& who = names[rng() % names.size()];
      const std::uint32_t type = kTypes[rng() % 4];
      e->apply(directive(type, who, type == TANDEM_DIR_PIN ? INT64_MAX : 0));
      ASSERT_EQ(e->kv().check(), "") << "after directive " << type << " on " << who;
    }
    if (e->tick() == LlamaEngine::Tick::kStepped) ++steps;
    ASSERT_EQ(e->kv().check(), "") << "after step " << steps;
  }
  EXPECT_GE(steps, 150);
  EXPECT_EQ(e->kv().violations(), 0u) << e->kv().first_violation();
  const KvExecutorStats x = e->kv().stats();
  EXPECT_GT(x.cut_tokens, 0u) << "nothing was ever evicted or dropped: no pressure";
  EXPECT_GT(x.offloads, 0u);
}

TEST_F(LlamaEngineTest, PinnedSessionsSurvivePressureAndIdleOnesGoLeastRecentlyUsedFirst) {
  // 1,024 cells = 64 blocks of 16 (llama.cpp sizes caches in multiples of
  // 256 cells). Four sessions of 200 + 4 tokens leave 12 full blocks each
  // (192 tokens) in the cache: 48 blocks, 16 free.
  auto e = engine(1024, 4, 128);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->preset().gpu_blocks, 64u);
  for (const char* s : {"p0", "p1", "u0", "u1"}) run(*e, {round(s, 0, 200, 4)});  // u0 is idle longest of the unpinned
  e->apply(directive(TANDEM_DIR_PIN, "p0", INT64_MAX));
  e->apply(directive(TANDEM_DIR_PIN, "p1", INT64_MAX));
  for (const char* s : {"p0", "p1", "u0", "u1"}) ASSERT_EQ(e->kv().resident(id(s)), 192u) << s;
  // A newcomer of 300 + 4 tokens computes 303 of them (the last one is only
  // sampled): 19 blocks, so 3 must be evicted.
  run(*e, {round("n", 0, 300, 4)});
  EXPECT_EQ(e->kv().resident(id("p0")), 192u);
  EXPECT_EQ(e->kv().resident(id("p1")), 192u);
  EXPECT_EQ(e->kv().resident(id("u0")), 192u - 3 * kBlock) << "the least recently used idle session loses its tail";
  EXPECT_EQ(e->kv().resident(id("u1")), 192u);
  EXPECT_EQ(e->kv().violations(), 0u) << e->kv().first_violation();
}

TEST_F(LlamaEngineTest, HostCopiesBeyondTheBudgetGoLeastRecentlyUsedFirst) {
  // Room for one copy of ~200 tokens (2 KiB of KV a token on tiny).
  auto e = engine(4096, 8, 256, 600'000);
  ASSERT_TRUE(e);
  run(*e, {round("h0", 0, 200, 4)});
  run(*e, {round("h1", 0, 200, 4)});
  for (const char* s : {"h0", "h1"}) {
    e->apply(directive(TANDEM_DIR_OFFLOAD, s));
    e->tick();
    e->apply(directive(TANDEM_DIR_DROP, s));  // only the host copies are left
  }
  const KvExecutorStats x = e->kv().stats();
  EXPECT_EQ(x.offloads, 2u);
  EXPECT_EQ(x.host_evictions, 1u);
  EXPECT_LE(x.host_bytes, 600'000u);
  // h0's copy went: its next round recomputes; h1's is restored.
  run(*e, {round("h0", 1, 240, 4)});
  EXPECT_EQ(e->kv().stats().restores, 0u);
  run(*e, {round("h1", 1, 240, 4)});
  EXPECT_EQ(e->kv().stats().restores, 1u);
  EXPECT_EQ(e->kv().violations(), 0u) << e->kv().first_violation();
}

TEST_F(LlamaEngineTest, ClosedSessionsFreeTheirCellsAndHostCopies) {
  auto e = engine();
  ASSERT_TRUE(e);
  // Idle when closed: its cells and its host copy go at once.
  run(*e, {round("c0", 0, 200, 4)});
  e->apply(directive(TANDEM_DIR_OFFLOAD, "c0"));
  e->tick();
  ASSERT_GT(e->kv().stats().host_bytes, 0u);
  run(*e, {round("c1", 0, 200, 4)});
  const std::uint32_t c1 = e->kv().resident(id("c1"));
  ASSERT_GT(c1, 0u);
  e->apply(directive(TANDEM_DIR_CLOSE, "c0"));
  EXPECT_EQ(e->kv().resident(id("c0")), 0u);
  EXPECT_EQ(e->kv().stats().host_bytes, 0u) << "the closed session's host copy is deleted";
  EXPECT_EQ(e->kv().resident_total(), c1) << "only c1's cells are left";
  EXPECT_TRUE(e->tokens(id("c0")).empty()) << "the engine forgot c0";
  // Running when closed: the round finishes, then the session is forgotten.
  auto job = round("c1", 1, 240, 8);
  ASSERT_EQ(e->submit(job), testbed::SubmitStatus::kQueued);
  e->tick();
  e->apply(directive(TANDEM_DIR_CLOSE, "c1"));
  for (int t = 0; t < 1000 && !job->wait(0, base::MonotonicClock().now()).done; ++t) e->tick();
  const Job::Progress p = job->wait(0, base::MonotonicClock().now());
  ASSERT_TRUE(p.done);
  EXPECT_EQ(p.status, 0) << p.error;
  e->tick();
  EXPECT_EQ(e->kv().resident_total(), 0u);
  EXPECT_TRUE(e->tokens(id("c1")).empty());
  EXPECT_EQ(e->kv().check(), "");
  EXPECT_EQ(e->kv().violations(), 0u) << e->kv().first_violation();
}

TEST_F(LlamaEngineTest, AContextTooSmallForARequestIsRefusedWithTheReason) {
  auto e = engine(256, 4, 128);
  ASSERT_TRUE(e);
  testbed::CompletionRequest r;
  r.prompt = std::string(4000, 'x');
  r.max_tokens = 16;
  auto ok = e->prepare(r);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().field, "prompt");
  EXPECT_NE(ok.error().message.find("context"), std::string::npos) << ok.error().message;
}

TEST(LlamaModel, MissingAndInvalidFilesAreNamed) {
  init("llama_engine_test", false);
  auto m = Model::load({"/nonexistent/model.gguf", 0});
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().context().find("/nonexistent/model.gguf"), std::string::npos);
  const std::string bad = ::testing::TempDir() + "/not-a-model.gguf";
  FILE* f = std::fopen(bad.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("this is not a model", f);
  std::fclose(f);
  m = Model::load({bad, 0});
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().context().find("not a GGUF"), std::string::npos) << m.error().context();
}

TEST(LlamaModel, LayersOnAGpuWithoutOneAreRefusedNotRunOnTheCpu) {
  init("llama_engine_test", false);
  bool gpu = false;
  for (const std::string& d : devices()) gpu = gpu || d.rfind("CUDA", 0) == 0;
  auto m = Model::load({tiny_model(), -1});
  if (gpu) {
    EXPECT_TRUE(m) << m.error().context();
  } else {
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().code(), ENODEV);
    EXPECT_NE(m.error().context().find("no GPU backend"), std::string::npos) << m.error().context();
  }
}

}  // namespace
}  // namespace tandem::llama
