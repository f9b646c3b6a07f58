// The codec of a tool call's cgroup directories (cpu/cgroup_dirs.h).
#include "cpu/cgroup_dirs.h"

#include <sys/stat.h>

#include <cassert>
#include <cerrno>
#include <utility>

#include <fmt/format.h>

namespace tandem::cpu {

EncodedDirs encode_dirs(const CgroupDirs& dirs) {
  assert((dirs.v2_dir >= 0 ? 1u : 0u) + dirs.v1_dirs.size() <= kMaxPlacementDirs);
  auto index = [&](int i) {
    assert(i >= -1 && i < static_cast<int>(dirs.v1_dirs.size()));
    return static_cast<std::int8_t>(i);
  };
  EncodedDirs e;
  e.layout.has_v2 = dirs.v2_dir >= 0;
  e.layout.v1_count = static_cast<std::uint8_t>(dirs.v1_dirs.size());
  e.layout.cpuacct = index(dirs.cpuacct);
  e.layout.memory = index(dirs.memory);
  e.layout.cpu = index(dirs.cpu);
  if (dirs.v2_dir >= 0) e.fds.push_back(dirs.v2_dir);
  e.fds.insert(e.fds.end(), dirs.v1_dirs.begin(), dirs.v1_dirs.end());
  return e;
}

base::Result<ReceivedDirs> decode_dirs(const DirsLayout& layout, std::vector<base::UniqueFd> fds) {
  // `fds` is owned from here: every return below that is not the success
  // closes them.
  const std::size_t expected = (layout.has_v2 ? 1u : 0u) + layout.v1_count;
  if (expected == 0) return base::make_error(EPROTO, "the placement names no cgroup directory");
  if (expected > kMaxPlacementDirs) {
    return base::make_error(EPROTO, fmt::format("the placement names {} cgroup directories; at most {} are possible",
                                                expected, kMaxPlacementDirs));
  }
  if (fds.size() != expected) {
    return base::make_error(EPROTO, fmt::format("ToolPlacement carried {} fds, expected {}", fds.size(), expected));
  }
  for (auto [name, index] :
       {std::pair{"cpuacct", layout.cpuacct}, std::pair{"memory", layout.memory}, std::pair{"cpu", layout.cpu}}) {
    if (index < -1 || index >= static_cast<int>(layout.v1_count)) {
      return base::make_error(EPROTO, fmt::format("the {} directory's index {} is not one of the {} v1 directories",
                                                  name, index, layout.v1_count));
    }
  }
  struct Identity {
    dev_t dev;
    ino_t ino;
  };
  std::vector<Identity> seen;
  seen.reserve(fds.size());
  for (std::size_t i = 0; i < fds.size(); ++i) {
    struct stat st {};
    if (!fds[i] || ::fstat(fds[i].get(), &st) != 0) {
      return base::make_error(EPROTO, fmt::format("fd {} of the placement cannot be looked at", i));
    }
    if (!S_ISDIR(st.st_mode)) return base::make_error(EPROTO, fmt::format("fd {} of the placement is no directory", i));
    for (std::size_t j = 0; j < seen.size(); ++j) {
      if (seen[j].dev == st.st_dev && seen[j].ino == st.st_ino) {
        return base::make_error(EPROTO, fmt::format("fds {} and {} of the placement are the same directory", j, i));
      }
    }
    seen.push_back({st.st_dev, st.st_ino});
  }
  ReceivedDirs r;
  r.fds_ = std::move(fds);
  std::size_t next = 0;
  if (layout.has_v2) r.dirs_.v2_dir = r.fds_[next++].get();
  for (; next < r.fds_.size(); ++next) r.dirs_.v1_dirs.push_back(r.fds_[next].get());
  // Checked above: -1 (none) or a v1 index.
  auto index = [](std::int8_t i) { return i < 0 ? -1 : static_cast<int>(static_cast<unsigned char>(i)); };
  r.dirs_.cpuacct = index(layout.cpuacct);
  r.dirs_.memory = index(layout.memory);
  r.dirs_.cpu = index(layout.cpu);
  return r;
}

}  // namespace tandem::cpu
