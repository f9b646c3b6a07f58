// The runtime directory (issue 18, "safe runtime directory"): where the
// socket, the lock and the ownership journal live, opened so that no other
// user can make tandemd — root — create, follow or chmod anything of theirs.
//
// open_runtime_dir() resolves the longest existing prefix of the path once
// (realpath), then walks it from "/" one component at a time with
// openat(O_NOFOLLOW | O_DIRECTORY), creating what is missing (mkdirat, 0755),
// and checks each directory it holds (fstat on the fd, never the path):
//   - every directory must belong to root or to tandemd's own user, and may
//     be writable by group or others only with the sticky bit (as /tmp);
//   - the runtime directory itself must belong to tandemd's user and be
//     writable by no one else.
// A component swapped for a symlink after the resolution fails the walk. The
// caller then works only through the returned fd (openat, unlinkat, bind
// through /proc/self/fd), never by path.
//
// dir_problem() is the pure rule, tested on values.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <string_view>

#include "base/result.h"
#include "base/unique_fd.h"

namespace tandem::daemon {

// Why a directory owned by `owner` with `mode` may not be on the runtime
// dir's path of a daemon running as `euid` (`last`: it is the runtime dir
// itself), or nullptr.
const char* dir_problem(uid_t owner, mode_t mode, uid_t euid, bool last);

// The runtime directory, opened (O_DIRECTORY) after the walk above; created
// if missing. Errors name the path and the problem ("/tmp/x is owned by uid
// 65534, not by root or tandemd's uid 0: another user controls it").
base::Result<base::UniqueFd> open_runtime_dir(const std::string& path);

// A path that reaches `name` inside the directory `dirfd` through the
// process's own fd table ("/proc/self/fd/7/tandemd.sock"): for bind(), which
// takes no dirfd.
std::string fd_path(int dirfd, std::string_view name);

}  // namespace tandem::daemon
