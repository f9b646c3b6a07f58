// testbed::TandemStepScheduler, the adapter both live engines (the emulator
// and tandem-llama) plan their steps through: the daemon's policy, reached
// over libtandem's C ABI, must come back as the same sched::StepPlan it
// produced. A fake daemon configures the policy.
#include "testbed/step_adapter.h"

#include <vector>

#include <gtest/gtest.h>

#include "sched/policy.h"
#include "tandem/tandem.h"
#include "tests/libclient/fake_daemon.h"

namespace tandem::testbed {
namespace {

using libclient_testing::FakeDaemon;
using libclient_testing::TempDir;

sched::StepRequest running(std::uint64_t id, std::uint32_t tokens, std::uint32_t blocks) {
  sched::StepRequest r;
  r.id = id;
  r.session = 100 + id;
  r.phase = sched::RequestPhase::kRunning;
  r.prompt_tokens = tokens;
  r.computed_tokens = tokens;
  r.blocks_held = blocks;
  r.max_output_tokens = 64;
  r.arrival = base::from_ns(static_cast<std::int64_t>(id) * 1000);
  return r;
}

// The adapter's plan for `reqs` with no free block (the engine's limits
// as open() gives them).
sched::StepPlan plan_full_pool(TandemStepScheduler& adapter, const std::vector<sched::StepRequest>& reqs) {
  sched::StepInput in;
  in.token_budget = 256;
  in.max_seqs = 8;
  in.block_size = 16;
  in.free_blocks = 0;
  in.max_model_len = 4096;
  in.requests = reqs;
  sched::StepPlan out;
  adapter.plan(in, base::from_ns(1'000'000), out);
  return out;
}

class StepAdapterTest : public ::testing::Test {
 protected:
  void open(const char* policy) {
    tandem_options o{};
    o.sz = sizeof o;
    o.runtime_dir = dir_.path().c_str();
    o.name = "step-adapter-test";
    tandem_engine_params p{};
    p.sz = sizeof p;
    p.block_size = 16;
    p.total_blocks = 64;
    p.max_seqs = 8;
    p.token_budget = 256;
    p.saturating_tokens = 128;
    p.max_model_len = 4096;
    ASSERT_EQ(tandem_engine_open(&o, &p, &client_), 0);
    ASSERT_NO_FATAL_FAILURE(libclient_testing::connect(client_, daemon_, 3, policy));
    ASSERT_TRUE(
        libclient_testing::pump_until(client_, [&] { return tandem_engine_policy(client_) == std::string(policy); }));
  }
  void TearDown() override { tandem_close(client_); }

  TempDir dir_;
  FakeDaemon daemon_{dir_.path()};
  tandem_client* client_ = nullptr;
};

// The stall this guards against: a policy that preempts by swapping
// (autellix's and tandem's default) had its swaps dropped at the ABI, so a
// full pool stayed full and no step could run.
TEST_F(StepAdapterTest, SwapPreemptionsComeBackAsSwaps) {
  ASSERT_NO_FATAL_FAILURE(open("autellix"));
  TandemStepScheduler adapter(client_);
  EXPECT_EQ(adapter.name(), "autellix");
  // The first request needs a third block for its next token; none is free.
  const std::vector<sched::StepRequest> reqs = {running(0, 32, 2), running(1, 48, 3)};
  const sched::StepPlan out = plan_full_pool(adapter, reqs);
  EXPECT_TRUE(out.preempt.empty());
  ASSERT_EQ(out.swap.size(), 1u);
  ASSERT_EQ(out.run.size(), 1u);
  EXPECT_NE(out.run[0].request, out.swap[0]) << "the survivor runs on the victim's blocks";
  EXPECT_EQ(adapter.failures(), 0u);
}

TEST_F(StepAdapterTest, RecomputePreemptionsStayRecomputes) {
  ASSERT_NO_FATAL_FAILURE(open("fcfs"));
  TandemStepScheduler adapter(client_);
  const std::vector<sched::StepRequest> reqs = {running(0, 32, 2), running(1, 32, 2)};
  const sched::StepPlan out = plan_full_pool(adapter, reqs);
  EXPECT_EQ(out.preempt, (std::vector<std::uint32_t>{1})) << "vLLM: the newest running request";
  EXPECT_TRUE(out.swap.empty());
  EXPECT_EQ(adapter.failures(), 0u);
}

}  // namespace
}  // namespace tandem::testbed
