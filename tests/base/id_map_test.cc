// IdMap against std::unordered_map: the same answers after any sequence of
// inserts, lookups and erases, key 0 and clustered keys included.
#include "base/id_map.h"

#include <cstdint>
#include <random>
#include <unordered_map>

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

TEST(IdMap, EmptyMapFindsNothing) {
  IdMap<int> m;
  EXPECT_EQ(m.find(0), nullptr);
  EXPECT_EQ(m.find(42), nullptr);
  EXPECT_FALSE(m.erase(42));
  EXPECT_TRUE(m.empty());
}

TEST(IdMap, InsertsFindsAndErases) {
  IdMap<int> m;
  m[0] = 10;  // 0 is a key like any other
  m[7] = 70;
  m[7] += 1;
  EXPECT_EQ(m.size(), 2u);
  ASSERT_NE(m.find(0), nullptr);
  EXPECT_EQ(*m.find(0), 10);
  EXPECT_EQ(*m.find(7), 71);
  EXPECT_TRUE(m.erase(0));
  EXPECT_FALSE(m.contains(0));
  EXPECT_TRUE(m.contains(7));
  EXPECT_EQ(m.size(), 1u);
  m.clear();
  EXPECT_FALSE(m.contains(7));
  m[9] = 1;  // usable after clear
  EXPECT_EQ(*m.find(9), 1);
}

// Random operations over a small key space (so keys recur, runs form and
// erases shift entries back) and over sequential keys, checked against the
// standard map after every step.
TEST(IdMap, AgreesWithUnorderedMapUnderChurn) {
  for (const std::uint64_t space : {64ULL, 5000ULL}) {
    std::mt19937_64 rng(space);
    IdMap<std::uint64_t> m;
    std::unordered_map<std::uint64_t, std::uint64_t> ref;
    for (int step = 0; step < 200000; ++step) {
      const std::uint64_t key = rng() % space;
      switch (rng() % 3) {
        case 0:
          m[key] = step;
          ref[key] = step;
          break;
        case 1:
          EXPECT_EQ(m.erase(key), ref.erase(key) == 1);
          break;
        default: {
          const std::uint64_t* v = m.find(key);
          auto it = ref.find(key);
          ASSERT_EQ(v != nullptr, it != ref.end()) << "key " << key << " step " << step;
          if (v != nullptr) {
            EXPECT_EQ(*v, it->second);
          }
        }
      }
      ASSERT_EQ(m.size(), ref.size());
    }
    for (std::uint64_t k = 0; k < space; ++k) {
      ASSERT_EQ(m.contains(k), ref.contains(k)) << k;
    }
  }
}

}  // namespace
}  // namespace tandem::base
