// tandem-engine-emu's command line (testbed/flags.h).
#include "testbed/flags.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem::testbed {
namespace {

std::expected<Flags, std::string> parse(std::vector<std::string_view> args) { return parse_flags(args); }

TEST(Flags, DefaultsAndBothSpellings) {
  auto f = parse({});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->preset, "h100-llama3-8b");
  EXPECT_EQ(f->speedup, 1.0);
  EXPECT_EQ(f->kv_block_bytes, 4096u);
  EXPECT_EQ(f->gpu, "sim");
  f = parse({"--port", "0", "--speedup=20", "--kv-blocks", "128", "--name=e1", "--runtime-dir", "/tmp/x", "--max-seqs",
             "8", "--token-budget=512", "--kv-block-bytes", "1024"});
  ASSERT_TRUE(f) << f.error();
  EXPECT_EQ(f->port, 0);
  EXPECT_EQ(f->speedup, 20.0);
  EXPECT_EQ(f->kv_blocks, 128u);
  EXPECT_EQ(f->name, "e1");
  EXPECT_EQ(f->runtime_dir, "/tmp/x");
  EXPECT_EQ(f->max_seqs, 8u);
  EXPECT_EQ(f->token_budget, 512u);
  EXPECT_EQ(f->kv_block_bytes, 1024u);
  EXPECT_TRUE(parse({"--help"})->help);
}

TEST(Flags, GpuBackend) {
  for (std::string_view backend : {"sim", "auto", "cuda", "off"}) {
    auto f = parse({"--gpu", backend});
    ASSERT_TRUE(f) << f.error();
    EXPECT_EQ(f->gpu, backend);
    const std::string joined = "--gpu=" + std::string(backend);
    f = parse({joined});
    ASSERT_TRUE(f) << f.error();
    EXPECT_EQ(f->gpu, backend);
  }
  // The last one wins, like every other flag.
  EXPECT_EQ(parse({"--gpu", "off", "--gpu=cuda"})->gpu, "cuda");
  for (std::vector<std::string_view> bad :
       {std::vector<std::string_view>{"--gpu", "CUDA"}, {"--gpu="}, {"--gpu", "none"}, {"--gpu"}}) {
    auto f = parse(bad);
    ASSERT_FALSE(f) << "accepted " << bad.back();
    EXPECT_NE(f.error().find("--gpu"), std::string::npos) << f.error();
  }
  EXPECT_NE(parse({"--gpu", "gpu0"}).error().find("sim, auto, cuda, off"), std::string::npos);
  EXPECT_NE(usage().find("--gpu BACKEND"), std::string::npos);
}

TEST(Flags, ErrorsNameTheFlag) {
  auto expect_names = [](std::vector<std::string_view> args, std::string_view flag) {
    auto f = parse_flags(args);
    ASSERT_FALSE(f) << "accepted";
    EXPECT_NE(f.error().find(flag), std::string::npos) << f.error();
  };
  expect_names({"--port", "70000"}, "--port");
  expect_names({"--port", "abc"}, "--port");
  expect_names({"--port"}, "--port");
  expect_names({"--speedup", "0"}, "--speedup");
  expect_names({"--speedup=-1"}, "--speedup");
  expect_names({"--kv-blocks", "0"}, "--kv-blocks");
  expect_names({"--bogus"}, "--bogus");
  expect_names({"stray"}, "stray");
}

TEST(Flags, EngineSetupAppliesOverrides) {
  auto f = parse({"--kv-blocks", "100", "--max-seqs", "4", "--token-budget", "256"});
  ASSERT_TRUE(f);
  auto s = engine_setup(*f);
  ASSERT_TRUE(s) << s.error();
  EXPECT_EQ(s->preset.gpu_blocks, 100u);
  EXPECT_EQ(s->preset.max_model_len, 100u * s->preset.block_size);  // capped to the pool
  EXPECT_EQ(s->limits.max_seqs, 4u);
  EXPECT_EQ(s->limits.token_budget, 256u);

  auto bad = engine_setup(*parse({"--preset", "nope"}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--preset"), std::string::npos);
  bad = engine_setup(*parse({"--token-budget", "4"}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--token-budget"), std::string::npos);
  bad = engine_setup(*parse({"--kv-block-bytes", "8"}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--kv-block-bytes"), std::string::npos);
}

}  // namespace
}  // namespace tandem::testbed
