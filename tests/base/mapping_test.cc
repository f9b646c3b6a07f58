// Mapping: map, move over live, self-move, unmap on destruction.
#include "base/mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "base/unique_fd.h"

namespace tandem::base {
namespace {

constexpr std::size_t kLen = 4096;

UniqueFd memfd() {
  UniqueFd fd(::memfd_create("mapping-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), kLen), 0);
  return fd;
}

// mincore() fails with ENOMEM on an unmapped page: a probe that never faults.
bool is_mapped(void* addr) {
  unsigned char vec;
  return ::mincore(addr, 1, &vec) == 0;
}

TEST(Mapping, MapsSharedMemory) {
  UniqueFd fd = memfd();
  auto a = Mapping::map(fd.get(), kLen, PROT_READ | PROT_WRITE, MAP_SHARED);
  auto b = Mapping::map(fd.get(), kLen, PROT_READ, MAP_SHARED);
  ASSERT_TRUE(a && b);
  static_cast<char*>(a->data())[10] = 'x';
  EXPECT_EQ(static_cast<char*>(b->data())[10], 'x');
  EXPECT_EQ(a->size(), kLen);
  EXPECT_EQ(a->bytes().size(), kLen);
}

TEST(Mapping, UnmapsOnDestruction) {
  UniqueFd fd = memfd();
  void* addr = nullptr;
  {
    auto m = Mapping::map(fd.get(), kLen, PROT_READ, MAP_SHARED);
    ASSERT_TRUE(m);
    addr = m->data();
    EXPECT_TRUE(is_mapped(addr));
  }
  EXPECT_FALSE(is_mapped(addr));
}

TEST(Mapping, MoveAssignOverLiveUnmapsOld) {
  UniqueFd fd = memfd();
  auto a = Mapping::map(fd.get(), kLen, PROT_READ, MAP_SHARED);
  auto b = Mapping::map(fd.get(), kLen, PROT_READ, MAP_SHARED);
  ASSERT_TRUE(a && b);
  void* old_addr = a->data();
  void* new_addr = b->data();
  *a = std::move(*b);
  EXPECT_FALSE(is_mapped(old_addr));
  EXPECT_TRUE(is_mapped(new_addr));
  EXPECT_EQ(a->data(), new_addr);
  EXPECT_FALSE(b->valid());  // NOLINT(bugprone-use-after-move)
}

TEST(Mapping, SelfMoveKeepsMapping) {
  UniqueFd fd = memfd();
  auto a = Mapping::map(fd.get(), kLen, PROT_READ, MAP_SHARED);
  ASSERT_TRUE(a);
  void* addr = a->data();
  Mapping& alias = *a;
  *a = std::move(alias);
  EXPECT_EQ(a->data(), addr);
  EXPECT_TRUE(is_mapped(addr));
}

TEST(Mapping, BadArgumentsFailCleanly) {
  EXPECT_EQ(Mapping::map(-1, kLen, PROT_READ, MAP_SHARED).error().code(), EBADF);
  UniqueFd fd = memfd();
  EXPECT_EQ(Mapping::map(fd.get(), 0, PROT_READ, MAP_SHARED).error().code(), EINVAL);
}

}  // namespace
}  // namespace tandem::base
