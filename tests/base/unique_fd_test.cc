// UniqueFd: ownership, move over a live fd, self-move, duplicate.
#include "base/unique_fd.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int new_fd() { return ::eventfd(0, EFD_CLOEXEC); }

TEST(UniqueFd, ClosesOnDestruction) {
  int raw = new_fd();
  {
    UniqueFd fd(raw);
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(fd.get(), raw);
  }
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFd, MoveConstructTransfers) {
  int raw = new_fd();
  UniqueFd a(raw);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.get(), raw);
  EXPECT_TRUE(is_open(raw));
}

TEST(UniqueFd, MoveAssignOverLiveClosesOld) {
  int old_raw = new_fd();
  int new_raw = new_fd();
  UniqueFd a(old_raw);
  UniqueFd b(new_raw);
  a = std::move(b);
  EXPECT_FALSE(is_open(old_raw));
  EXPECT_TRUE(is_open(new_raw));
  EXPECT_EQ(a.get(), new_raw);
  EXPECT_FALSE(b.valid());  // NOLINT(bugprone-use-after-move)
}

TEST(UniqueFd, SelfMoveKeepsFd) {
  int raw = new_fd();
  UniqueFd a(raw);
  UniqueFd& alias = a;
  a = std::move(alias);
  EXPECT_EQ(a.get(), raw);
  EXPECT_TRUE(is_open(raw));
}

TEST(UniqueFd, ReleaseGivesUpOwnership) {
  int raw = new_fd();
  {
    UniqueFd a(raw);
    EXPECT_EQ(a.release(), raw);
    EXPECT_FALSE(a.valid());
  }
  EXPECT_TRUE(is_open(raw));
  ::close(raw);
}

TEST(UniqueFd, ResetToSameFdKeepsIt) {
  int raw = new_fd();
  UniqueFd a(raw);
  a.reset(raw);
  EXPECT_TRUE(is_open(raw));
}

TEST(UniqueFd, DuplicateIsCloexecAndIndependent) {
  UniqueFd a(new_fd());
  auto b = a.duplicate();
  ASSERT_TRUE(b.has_value()) << b.error().message();
  EXPECT_NE(b->get(), a.get());
  EXPECT_TRUE(::fcntl(b->get(), F_GETFD) & FD_CLOEXEC);
  int dup_raw = b->get();
  a.reset();
  EXPECT_TRUE(is_open(dup_raw));
}

TEST(UniqueFd, DuplicateOfInvalidFails) {
  UniqueFd empty;
  auto d = empty.duplicate();
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), EBADF);
}

}  // namespace
}  // namespace tandem::base
