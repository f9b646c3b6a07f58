// The codec of a tool placement's cgroup directories (cpu/cgroup_dirs.h):
// what the daemon encodes from a cgroup's directories, sent as tandemd sends
// it (the ToolPlacement message with the fds over SCM_RIGHTS), comes back as
// the same directories in the same roles; and what a hostile or broken
// sender can put in the message (a wrong count of fds, an index outside the
// v1 directories, one directory twice, an fd that is no directory) is
// refused, with every fd that came closed. Plain directories in a temp dir
// stand in for cgroups: the codec only looks at what they are, so no root.
#include "cpu/cgroup_dirs.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "cpu/cgroup.h"
#include "ipc/messages.h"

namespace tandem::cpu {
namespace {

namespace fs = std::filesystem;

// Directories standing in for one cgroup in each of several hierarchies.
class Dirs {
 public:
  explicit Dirs(int n) {
    char tmpl[] = "/tmp/tandem-cgroup-dirs-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    for (int i = 0; i < n; ++i) {
      const fs::path p = root_ / std::to_string(i);
      fs::create_directory(p);
      fds_.emplace_back(::open(p.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    }
  }
  ~Dirs() {
    fds_.clear();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  int fd(std::size_t i) const { return fds_[i].get(); }
  const fs::path& root() const { return root_; }

 private:
  fs::path root_;
  std::vector<base::UniqueFd> fds_;
};

ino_t inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

// Duplicates of `fds`, as SCM_RIGHTS would deliver them.
std::vector<base::UniqueFd> dup_all(const std::vector<int>& fds) {
  std::vector<base::UniqueFd> out;
  out.reserve(fds.size());
  for (int fd : fds) out.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  return out;
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// Sends `info` with `fds` as tandemd sends a ToolPlacement, receives it as
// libtandem does, and decodes the directories.
base::Result<ReceivedDirs> through_the_socket(const ipc::ToolPlacementInfo& info, const std::vector<int>& fds) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  base::UniqueFd a(sv[0]);
  base::UniqueFd b(sv[1]);
  auto sent = ipc::send_message(a.get(), ipc::build_tool_placement(info), fds);
  EXPECT_TRUE(sent) << sent.error().message();
  auto got = ipc::recv_message(b.get());
  EXPECT_TRUE(got) << got.error().message();
  if (!got) return base::make_error(EIO, "not received");
  const ipc::ToolPlacementInfo back = ipc::parse_tool_placement(*got->message()->payload_as_ToolPlacement());
  return decode_dirs(DirsLayout{back.has_v2, back.v1_count, back.cpuacct_fd, back.memory_fd, back.cpu_fd},
                     std::move(got->fds));
}

ipc::ToolPlacementInfo info_of(const DirsLayout& l) {
  ipc::ToolPlacementInfo info;
  info.request = 1;
  info.cgroup_id = 42;
  info.has_v2 = l.has_v2;
  info.v1_count = l.v1_count;
  info.cpuacct_fd = l.cpuacct;
  info.memory_fd = l.memory;
  info.cpu_fd = l.cpu;
  return info;
}

TEST(CgroupDirs, AHybridPlacementComesBackInTheSameRoles) {
  // v2, and v1 hierarchies cpu,cpuacct (both from one), cpuset, memory, pids.
  Dirs d(5);
  CgroupDirs sent;
  sent.v2_dir = d.fd(0);
  sent.v1_dirs = {d.fd(1), d.fd(2), d.fd(3), d.fd(4)};
  sent.cpu = 0;
  sent.cpuacct = 0;  // co-mounted with cpu: the same directory in two roles is fine
  sent.memory = 2;
  const EncodedDirs e = encode_dirs(sent);
  EXPECT_EQ(e.layout, (DirsLayout{true, 4, 0, 2, 0}));
  EXPECT_EQ(e.fds, (std::vector<int>{d.fd(0), d.fd(1), d.fd(2), d.fd(3), d.fd(4)}));

  auto got = through_the_socket(info_of(e.layout), e.fds);
  ASSERT_TRUE(got) << got.error().message();
  const CgroupDirs& r = got->dirs();
  EXPECT_EQ(inode(r.v2_dir), inode(d.fd(0)));
  ASSERT_EQ(r.v1_dirs.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(inode(r.v1_dirs[i]), inode(d.fd(i + 1))) << i;
  EXPECT_EQ(inode(r.v1_dir(r.cpu)), inode(d.fd(1)));
  EXPECT_EQ(inode(r.v1_dir(r.cpuacct)), inode(d.fd(1)));
  EXPECT_EQ(inode(r.v1_dir(r.memory)), inode(d.fd(3)));
  // The receiver's own fds, not the sender's, and they stay open with it.
  EXPECT_NE(r.v2_dir, d.fd(0));
  const int v2 = r.v2_dir;
  ReceivedDirs moved = std::move(*got);
  EXPECT_EQ(moved.dirs().v2_dir, v2);
  EXPECT_TRUE(is_open(v2));
  moved = ReceivedDirs();
  EXPECT_FALSE(is_open(v2)) << "the received fds are owned";
}

TEST(CgroupDirs, PureV2AndPureV1) {
  Dirs d(3);
  CgroupDirs v2;
  v2.v2_dir = d.fd(0);
  auto e = encode_dirs(v2);
  EXPECT_EQ(e.layout, (DirsLayout{true, 0, -1, -1, -1}));
  auto got = through_the_socket(info_of(e.layout), e.fds);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(inode(got->dirs().v2_dir), inode(d.fd(0)));
  EXPECT_TRUE(got->dirs().v1_dirs.empty());
  EXPECT_EQ(got->dirs().v1_dir(got->dirs().memory), -1);

  CgroupDirs v1;
  v1.v1_dirs = {d.fd(1), d.fd(2)};
  v1.memory = 1;
  e = encode_dirs(v1);
  EXPECT_EQ(e.layout, (DirsLayout{false, 2, -1, 1, -1}));
  got = through_the_socket(info_of(e.layout), e.fds);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->dirs().v2_dir, -1);
  EXPECT_EQ(inode(got->dirs().v1_dir(got->dirs().memory)), inode(d.fd(2)));
}

TEST(CgroupDirs, WhatTheManagerGivesIsWhatReadUsageReads) {
  // dirs() and read_usage() meet in CgroupDirs: a v1 memory directory given
  // by index is read for memory, and the v2 one for cpu.stat.
  Dirs d(2);
  auto write = [&](int i, const char* name, const char* text) {
    FILE* f = std::fopen((d.root() / std::to_string(i) / name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  write(0, "cpu.stat", "usage_usec 7\nuser_usec 5\nsystem_usec 2\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n");
  write(1, "memory.usage_in_bytes", "4096\n");
  write(1, "memory.max_usage_in_bytes", "8192\n");
  write(1, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  CgroupDirs dirs;
  dirs.v2_dir = d.fd(0);
  dirs.v1_dirs = {d.fd(1)};
  dirs.memory = 0;
  auto u = read_usage(dirs);
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_EQ(u->cpu_ns, 7000u);
  EXPECT_EQ(u->memory_bytes, 4096u);
  EXPECT_EQ(u->memory_peak, 8192u);
  EXPECT_EQ(u->oom_kills, 3u);
}

struct Hostile {
  const char* what;
  DirsLayout layout;
  std::vector<int> which;  // indexes into the test's directories (5 = a plain file)
  const char* needle;
};

TEST(CgroupDirs, HostileLayoutsAreRefusedAndEveryFdClosed) {
  Dirs d(4);
  const fs::path file = d.root() / "file";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  base::UniqueFd file_fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(file_fd);
  auto fd_of = [&](int i) { return i == 5 ? file_fd.get() : d.fd(static_cast<std::size_t>(i)); };
  const std::vector<Hostile> cases = {
      {"fewer fds than said", {true, 2, -1, -1, -1}, {0, 1}, "carried 2 fds, expected 3"},
      {"more fds than said", {true, 1, -1, -1, -1}, {0, 1, 2}, "carried 3 fds, expected 2"},
      {"fds without a layout", {false, 0, -1, -1, -1}, {0}, "names no cgroup directory"},
      {"nothing at all", {false, 0, -1, -1, -1}, {}, "names no cgroup directory"},
      {"more than a message can carry", {true, 9, -1, -1, -1}, {0, 1}, "at most 8"},
      {"an index past the v1 directories", {true, 2, -1, 2, -1}, {0, 1, 2}, "memory directory's index 2"},
      {"an index into v2's place", {true, 0, -1, -1, 0}, {0}, "cpu directory's index 0"},
      {"a negative index other than -1", {false, 2, -7, -1, -1}, {1, 2}, "cpuacct directory's index -7"},
      {"one directory twice", {true, 2, -1, -1, -1}, {0, 1, 1}, "fds 1 and 2 of the placement are the same"},
      {"v2 given again as v1", {true, 1, -1, -1, -1}, {0, 0}, "fds 0 and 1 of the placement are the same"},
      {"a file, not a directory", {true, 1, -1, 0, -1}, {0, 5}, "fd 1 of the placement is no directory"},
  };
  for (const Hostile& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<int> fds;
    fds.reserve(c.which.size());
    for (int i : c.which) fds.push_back(fd_of(i));
    std::vector<base::UniqueFd> owned = dup_all(fds);
    std::vector<int> numbers;
    numbers.reserve(owned.size());
    for (const auto& o : owned) numbers.push_back(o.get());
    auto r = decode_dirs(c.layout, std::move(owned));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), EPROTO);
    EXPECT_NE(r.error().message().find(c.needle), std::string::npos) << r.error().message();
    for (int n : numbers) EXPECT_FALSE(is_open(n)) << "fd " << n << " left open";
  }
  // The same refusals through the real message and socket.
  auto r = through_the_socket(info_of({true, 3, -1, -1, -1}), {d.fd(0), d.fd(1)});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("carried 2 fds, expected 4"), std::string::npos) << r.error().message();
  r = through_the_socket(info_of({true, 1, 1, -1, -1}), {d.fd(0), d.fd(1)});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("cpuacct directory's index 1"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace tandem::cpu
