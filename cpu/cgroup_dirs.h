// A tool call's cgroup directories, in the one shape every side uses, and the
// one codec for handing them from tandemd to a runner (docs/host.md
// "Spawning tools").
//
// CgroupDirs is what the cgroup manager gives out for a cgroup
// (CgroupManager::dirs), what cpu::spawn() places a process in, and what
// cpu::read_usage() reads accounting from: the v2 directory, the v1
// directories in the manager's hierarchy order, and which of the v1
// directories holds each controller whose accounting is read from v1
// (cpuacct, memory, cpu), as an index among them.
//
// On the wire (ipc/schema/tandem.fbs ToolPlacement) the directories travel as
// SCM_RIGHTS fds in a fixed order, the v2 directory first if there is one and
// then the v1 ones, and the message carries a DirsLayout: whether there is a
// v2 directory, how many v1 ones, and the three indexes. encode_dirs() makes
// the layout and the fds in their order; decode_dirs() takes the fds that
// arrived, owns them at once, checks them against the layout, and gives back
// the same CgroupDirs over them. The receiver trusts nothing: a count that
// does not match the fds, an index outside the v1 directories, an fd that is
// not a directory, or one directory given twice is an error (EPROTO), and then
// every fd is closed.
//
// Thread-safety: value types and pure functions (decode_dirs() only fstat()s
// the fds it owns). Linked into libtandem.so: no globals with constructors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"

namespace tandem::cpu {

// Directory fds of one cgroup, borrowed (open while in use); -1 or empty: none.
struct CgroupDirs {
  int v2_dir = -1;           // the cgroup2 directory (O_PATH | O_DIRECTORY is fine)
  std::vector<int> v1_dirs;  // v1 directories, in the manager's hierarchy order; joined in order before exec
  // The v1 directory whose files give this controller's accounting, as an
  // index into v1_dirs; -1 where it does not come from v1.
  int cpuacct = -1;
  int memory = -1;
  int cpu = -1;

  // v1_dirs[index], or -1 for a negative or out-of-range index.
  int v1_dir(int index) const {
    return index < 0 || static_cast<std::size_t>(index) >= v1_dirs.size() ? -1
                                                                          : v1_dirs[static_cast<std::size_t>(index)];
  }
  bool empty() const { return v2_dir < 0 && v1_dirs.empty(); }
};

// What the message says beside the fds: ToolPlacement's has_v2, v1_count,
// cpuacct_fd, memory_fd and cpu_fd, field for field.
struct DirsLayout {
  bool has_v2 = false;
  std::uint8_t v1_count = 0;
  std::int8_t cpuacct = -1;  // index among the v1 directories, -1 = none
  std::int8_t memory = -1;
  std::int8_t cpu = -1;
  bool operator==(const DirsLayout&) const = default;
};

// Most directories one placement carries (the same as ipc::kMaxMessageFds,
// which the daemon checks at compile time).
inline constexpr std::size_t kMaxPlacementDirs = 8;

// The layout and the fds to send, in order (borrowed from `dirs`).
struct EncodedDirs {
  DirsLayout layout;
  std::vector<int> fds;
};
// REQUIRES: `dirs` has its indexes in range and at most kMaxPlacementDirs
// directories (what CgroupManager::dirs() gives).
EncodedDirs encode_dirs(const CgroupDirs& dirs);

// The receiver's directories: owns the fds that arrived; dirs() is the
// CgroupDirs over them. Move-only.
// Thread-safety: a value type.
class ReceivedDirs {
 public:
  ReceivedDirs() = default;  // none
  const CgroupDirs& dirs() const { return dirs_; }
  bool empty() const { return fds_.empty(); }

 private:
  friend base::Result<ReceivedDirs> decode_dirs(const DirsLayout& layout, std::vector<base::UniqueFd> fds);
  std::vector<base::UniqueFd> fds_;
  CgroupDirs dirs_;  // over fds_ (moving the vector keeps the fd numbers)
};

// Checks `fds`, as they arrived, against `layout` and takes them. Errors
// (EPROTO, every fd closed): no directory at all, more than
// kMaxPlacementDirs, a count that is not has_v2 + v1_count, an index that is
// neither -1 nor one of the v1 directories, an fd that is not a directory,
// the same directory twice.
base::Result<ReceivedDirs> decode_dirs(const DirsLayout& layout, std::vector<base::UniqueFd> fds);

}  // namespace tandem::cpu
