// The policy registry: lookup, both halves, and parameter validation that
// names the problem.
#include "sched/registry.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>

namespace tandem::sched {
namespace {

TEST(Registry, EveryEntryBuildsBothHalvesWithDefaults) {
  ASSERT_FALSE(policy_registry().empty());
  for (const PolicyEntry& e : policy_registry()) {
    auto p = make_policy(e.name);
    ASSERT_TRUE(p) << e.name << ": " << p.error().message();
    ASSERT_NE(p->control, nullptr) << e.name;
    ASSERT_NE(p->step, nullptr) << e.name;
    EXPECT_EQ(p->control->name(), e.name);
    EXPECT_FALSE(e.summary.empty()) << e.name;
    for (const ParamSpec& spec : e.params) {
      EXPECT_GE(spec.default_value, spec.min) << e.name << "." << spec.name;
      EXPECT_LE(spec.default_value, spec.max) << e.name << "." << spec.name;
      EXPECT_FALSE(spec.doc.empty()) << e.name << "." << spec.name;
      EXPECT_EQ(p->params.get(spec.name), spec.default_value);
    }
  }
}

TEST(Registry, NoPolicyDeclaresAParameterTwice) {
  for (const PolicyEntry& e : policy_registry()) {
    std::set<std::string_view> names;
    for (const ParamSpec& spec : e.params) EXPECT_TRUE(names.insert(spec.name).second) << e.name << "." << spec.name;
  }
}

TEST(Registry, MarsTakesBothHalvesParameters) {
  auto p = make_policy("mars", {{"window_max", 16}, {"quantum_3", 128}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->params.get("window_max"), 16);
  EXPECT_EQ(p->params.get("quantum_3"), 128);
  EXPECT_EQ(p->step->name(), "mars-mlfq");
}

TEST(Registry, UnknownPolicyListsTheKnownOnes) {
  auto p = make_policy("lottery");
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code(), ENOENT);
  EXPECT_NE(p.error().context().find("unknown policy 'lottery'"), std::string::npos);
  EXPECT_NE(p.error().context().find("fcfs"), std::string::npos);
}

TEST(Registry, ParametersAreValidated) {
  const ParamSpec specs[] = {{"window_max", 30, 1, 1000, "admission window"}};
  auto ok = PolicyParams::create("x", specs, {{"window_max", 12}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->get("window_max"), 12);
  auto defaults = PolicyParams::create("x", specs, {});
  EXPECT_EQ(defaults->get("window_max"), 30);

  auto unknown = PolicyParams::create("x", specs, {{"window_min", 2}});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().context(), "policy x: unknown parameter 'window_min' (it takes: window_max)");
  auto range = PolicyParams::create("x", specs, {{"window_max", 0}});
  ASSERT_FALSE(range);
  EXPECT_EQ(range.error().context(), "policy x: window_max = 0 is outside [1, 1000]");
  auto nan = PolicyParams::create("x", specs, {{"window_max", std::nan("")}});
  EXPECT_FALSE(nan) << "NaN is never in range";
  auto none = make_policy("fcfs", {{"anything", 1}});
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().context().find("it takes: none"), std::string::npos);
}

}  // namespace
}  // namespace tandem::sched
