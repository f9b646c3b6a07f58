// Session and tool-kind ids: xxh64, stable across releases, never 0.
#include "base/ids.h"

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

TEST(Ids, Xxh64ReferenceVectors) {
  // From the xxHash specification's test vectors (seed 0). If these change,
  // every session id on the wire changes: never "fix" them.
  EXPECT_EQ(hash64(""), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(hash64("abc"), 0x44BC2CF5AD770999ull);
}

TEST(Ids, SessionIdsAreStableAndDistinct) {
  EXPECT_EQ(session_id("sympy__sympy-18835"), session_id("sympy__sympy-18835"));
  EXPECT_NE(session_id("a"), session_id("b"));
  EXPECT_NE(session_id(""), kNoSession);
  EXPECT_EQ(tool_kind_id("pytest"), session_id("pytest"));
}

}  // namespace
}  // namespace tandem::base
