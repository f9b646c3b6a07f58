// IdMap against std::unordered_map: the same answers after any sequence of
// inserts, lookups and erases, key 0 and clustered keys included.
#include "base/id_map.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

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
    // for_each visits every entry once, with its value.
    std::unordered_map<std::uint64_t, std::uint64_t> seen;
    m.for_each([&](std::uint64_t k, const std::uint64_t& v) { EXPECT_TRUE(seen.emplace(k, v).second) << k; });
    EXPECT_EQ(seen, ref);
  }
}

TEST(IdMap, ForEachCanChangeValues) {
  IdMap<int> m;
  for (int k = 1; k <= 100; ++k) m[k] = k;
  m.for_each([](std::uint64_t, int& v) { v *= 2; });
  for (int k = 1; k <= 100; ++k) {
    ASSERT_NE(m.find(k), nullptr);
    EXPECT_EQ(*m.find(k), 2 * k);
  }
}

// A reserved map takes its bound without moving an entry: a pointer taken
// after reserve() stays valid through inserts up to the bound.
TEST(IdMap, ReserveHoldsTheBoundWithoutGrowing) {
  IdMap<int> m;
  m.reserve(1000);
  m[7] = 7;
  const int* first = m.find(7);
  for (int k = 100; k < 1099; ++k) m[k] = k;
  EXPECT_EQ(m.size(), 1000U);
  EXPECT_EQ(m.find(7), first);
  EXPECT_EQ(*first, 7);
}

// Reserving a power of two takes the smallest table that holds it at half
// full, and that table takes the whole bound.
TEST(IdMap, ReserveTakesTheSmallestTableForTheBound) {
  IdMap<int> m;
  m.reserve(512);
  EXPECT_EQ(m.capacity(), 1024U);
  for (int k = 0; k < 512; ++k) m[k] = k;
  EXPECT_EQ(m.capacity(), 1024U) << "the bound fits the reserved table";
  m[512] = 512;
  EXPECT_EQ(m.capacity(), 2048U) << "one past the bound grows";
  for (int k = 0; k <= 512; ++k) ASSERT_EQ(*m.find(k), k);
}

TEST(IdSet, InsertsOnceErasesAndListsInOrder) {
  IdSet set;
  EXPECT_TRUE(set.empty());
  EXPECT_TRUE(set.insert(30));
  EXPECT_TRUE(set.insert(10));
  EXPECT_FALSE(set.insert(30));
  EXPECT_TRUE(set.insert(20));
  EXPECT_EQ(set.size(), 3U);
  EXPECT_TRUE(set.contains(10));
  EXPECT_FALSE(set.contains(40));
  EXPECT_EQ(set.ids(), (std::vector<std::uint64_t>{10, 20, 30}));
  EXPECT_TRUE(set.erase(20));
  EXPECT_FALSE(set.erase(20));
  std::vector<std::uint64_t> seen;
  set.for_each([&](std::uint64_t id) { seen.push_back(id); });
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{10, 30}));
}

}  // namespace
}  // namespace tandem::base
