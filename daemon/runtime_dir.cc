#include "daemon/runtime_dir.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "base/parse.h"
#include "base/text.h"

namespace tandem::daemon {

const char* dir_problem(uid_t owner, mode_t mode, uid_t euid, bool last) {
  if (last) {
    if (owner != euid) return "is not owned by tandemd's own user: another user controls it";
    if ((mode & (S_IWGRP | S_IWOTH)) != 0)
      return "is writable by group or others: another user could plant files in it";
    return nullptr;
  }
  if (owner != 0 && owner != euid) return "is owned by another user, who could replace what lies beneath it";
  if ((mode & (S_IWGRP | S_IWOTH)) != 0 && (mode & S_ISVTX) == 0) {
    return "is writable by group or others without the sticky bit: another user could replace what lies beneath it";
  }
  return nullptr;
}

std::string fd_path(int dirfd, std::string_view name) { return fmt::format("/proc/self/fd/{}/{}", dirfd, name); }

namespace {

base::Result<void> check(int fd, const std::string& shown, uid_t euid, bool last) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return base::errno_error(fmt::format("runtime dir: stat {}", shown));
  if (!S_ISDIR(st.st_mode)) return base::make_error(ENOTDIR, fmt::format("runtime dir: {} is not a directory", shown));
  if (const char* problem = dir_problem(st.st_uid, st.st_mode, euid, last)) {
    return base::make_error(EPERM, fmt::format("runtime dir: {} (owner uid {}, mode {:04o}) {}; tandemd (uid {}) "
                                               "refuses to start there",
                                               shown, st.st_uid, st.st_mode & 07777, problem, euid));
  }
  return {};
}

}  // namespace

base::Result<base::UniqueFd> open_runtime_dir(const std::string& path) {
  if (path.empty() || path.front() != '/') {
    return base::make_error(EINVAL, fmt::format("runtime dir {} is not an absolute path", base::escape(path)));
  }
  const uid_t euid = ::geteuid();
  // The longest prefix that exists, resolved once; the rest is created.
  std::vector<std::string_view> parts = base::split(path, '/', true);
  for (std::string_view p : parts) {
    if (p == "..") return base::make_error(EINVAL, fmt::format("runtime dir {} holds '..'", base::escape(path)));
  }
  std::size_t existing = parts.size();
  std::string resolved;
  for (;; --existing) {
    std::string prefix = "/";
    for (std::size_t i = 0; i < existing; ++i) prefix += fmt::format("{}{}", i == 0 ? "" : "/", parts[i]);
    char buf[PATH_MAX];
    if (::realpath(prefix.c_str(), buf) != nullptr) {
      resolved = buf;
      break;
    }
    if (errno != ENOENT || existing == 0) {
      return base::errno_error(fmt::format("runtime dir: resolve {}", base::escape(prefix)));
    }
  }
  std::vector<std::string> walk;
  for (std::string_view p : base::split(resolved, '/', true)) walk.emplace_back(p);
  const std::size_t existing_parts = walk.size();
  for (std::size_t i = existing; i < parts.size(); ++i) {
    if (parts[i] != ".") walk.emplace_back(parts[i]);
  }

  base::UniqueFd dir(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return base::errno_error("runtime dir: open /");
  if (auto ok = check(dir.get(), "/", euid, walk.empty()); !ok) return base::propagate(std::move(ok.error()));
  std::string shown;
  for (std::size_t i = 0; i < walk.size(); ++i) {
    const bool last = i + 1 == walk.size();
    shown += "/" + walk[i];
    const int flags = (last ? O_RDONLY : O_PATH) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    base::UniqueFd next(::openat(dir.get(), walk[i].c_str(), flags));
    if (!next && errno == ENOENT && i >= existing_parts) {
      if (::mkdirat(dir.get(), walk[i].c_str(), 0755) != 0 && errno != EEXIST) {
        return base::errno_error(fmt::format("runtime dir: create {}", base::escape(shown)));
      }
      next = base::UniqueFd(::openat(dir.get(), walk[i].c_str(), flags));
    }
    if (!next) {
      const int err = errno;
      struct stat st {};
      if (::fstatat(dir.get(), walk[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        return base::make_error(ELOOP, fmt::format("runtime dir: {} became a symbolic link while tandemd opened it; "
                                                   "refusing to follow it",
                                                   base::escape(shown)));
      }
      return base::make_error(err, fmt::format("runtime dir: open {}", base::escape(shown)));
    }
    if (auto ok = check(next.get(), base::escape(shown), euid, last); !ok) {
      return base::propagate(std::move(ok.error()));
    }
    dir = std::move(next);
  }
  return dir;
}

}  // namespace tandem::daemon
