// Result/Error: context chaining, messages, propagation.
#include "base/result.h"

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return make_error(EINVAL, "value " + std::to_string(v) + " is not positive");
  return v;
}

Result<int> doubled(int v) {
  auto r = parse_positive(v);
  if (!r) return propagate(std::move(r.error()), "doubling");
  return *r * 2;
}

TEST(Result, CarriesValueOrError) {
  auto ok = doubled(21);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, 42);

  auto bad = doubled(-1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), EINVAL);
  EXPECT_EQ(bad.error().context(), "doubling: value -1 is not positive");
  EXPECT_EQ(bad.error().message(), "doubling: value -1 is not positive: Invalid argument");
}

TEST(Result, ErrnoErrorCapturesErrno) {
  errno = ENOENT;
  Error e = errno_error("open x").error();
  EXPECT_EQ(e.code(), ENOENT);
  EXPECT_EQ(e.message(), "open x: No such file or directory");
  // errno 0 is not an error code; it becomes EIO rather than "Success".
  errno = 0;
  EXPECT_EQ(errno_error("weird").error().code(), EIO);
}

TEST(Result, VoidResult) {
  auto f = [](bool fail) -> Result<void> {
    if (fail) return make_error(EAGAIN, "busy");
    return {};
  };
  EXPECT_TRUE(f(false).has_value());
  EXPECT_EQ(f(true).error().code(), EAGAIN);
}

}  // namespace
}  // namespace tandem::base
