// Pure parsers: valid input, every kind of bad input, and overflow.
#include "base/parse.h"

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

using namespace std::chrono_literals;

TEST(Parse, TrimAndSplit) {
  EXPECT_EQ(trim("  a b \n"), "a b");
  EXPECT_EQ(trim(" \t"), "");
  auto f = split("a,,b", ',');
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[1], "");
  EXPECT_EQ(split("a,,b", ',', true).size(), 2u);
  EXPECT_EQ(split("", ',').size(), 1u);
}

TEST(Parse, Integers) {
  EXPECT_EQ(*parse_int<int>("-42"), -42);
  EXPECT_EQ(*parse_int<std::uint64_t>("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_int<std::uint64_t>("18446744073709551616").error().code(), ERANGE);
  EXPECT_EQ(parse_int<std::uint32_t>("-1").error().code(), EINVAL);
  EXPECT_EQ(parse_int<int>("12x").error().code(), EINVAL);
  EXPECT_EQ(parse_int<int>(" 12").error().code(), EINVAL);
  EXPECT_EQ(parse_int<int>("").error().code(), EINVAL);
  EXPECT_EQ(parse_int<int>("12x").error().context(), "not an integer: '12x'");
}

TEST(Parse, Doubles) {
  EXPECT_DOUBLE_EQ(*parse_double("0.9"), 0.9);
  EXPECT_DOUBLE_EQ(*parse_double("1e-3"), 1e-3);
  EXPECT_FALSE(parse_double("nan"));
  EXPECT_FALSE(parse_double("inf"));
  EXPECT_FALSE(parse_double("0.9x"));
  EXPECT_FALSE(parse_double(""));
}

TEST(Parse, Sizes) {
  EXPECT_EQ(*parse_size("4096"), 4096u);
  EXPECT_EQ(*parse_size("64K"), 64u << 10);
  EXPECT_EQ(*parse_size("64KiB"), 64u << 10);
  EXPECT_EQ(*parse_size("2m"), 2u << 20);
  EXPECT_EQ(*parse_size("1G"), 1ull << 30);
  EXPECT_EQ(*parse_size("3TiB"), 3ull << 40);
  EXPECT_EQ(parse_size("17179869184T").error().code(), ERANGE);
  EXPECT_EQ(parse_size("5Q").error().code(), EINVAL);
  EXPECT_EQ(parse_size("1.5G").error().code(), EINVAL);
  EXPECT_EQ(parse_size("K").error().code(), EINVAL);
}

TEST(Parse, Durations) {
  EXPECT_EQ(*parse_duration("200ms"), 200ms);
  EXPECT_EQ(*parse_duration("1.5s"), 1500ms);
  EXPECT_EQ(*parse_duration("10us"), 10us);
  EXPECT_EQ(*parse_duration("7ns"), 7ns);
  EXPECT_EQ(*parse_duration("2m"), 120s);
  EXPECT_EQ(*parse_duration("1h"), 3600s);
  EXPECT_EQ(*parse_duration("1e3ms"), 1s);
  EXPECT_EQ(parse_duration("200").error().code(), EINVAL);  // no unit
  EXPECT_EQ(parse_duration("-1s").error().code(), EINVAL);
  EXPECT_EQ(parse_duration("1x").error().code(), EINVAL);
  EXPECT_EQ(parse_duration("1e300h").error().code(), ERANGE);
}

TEST(Parse, KeyValues) {
  auto kv = parse_key_values("usage_usec 1234\nuser_usec  1000\n\nsystem_usec\t234\n");
  ASSERT_TRUE(kv);
  ASSERT_EQ(kv->size(), 3u);
  EXPECT_EQ((*kv)[0].first, "usage_usec");
  EXPECT_EQ((*kv)[1].second, "1000");
  EXPECT_EQ((*kv)[2].second, "234");
  auto bad = parse_key_values("a 1\nlonely\n");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().context(), "line 2: key 'lonely' has no value");
}

}  // namespace
}  // namespace tandem::base
