// UnplacedTools: the tool processes a runner started outside any cgroup
// (TANDEM_TOOL_ALLOW_UNPLACED), which tandemd can only reach by pid.
//
// A tool is tracked when its TOOL_START (or the resync listing it) names its
// pid, and only if that process is a child of the runner that names it:
// tandemd kills nobody else's processes. It holds a pidfd, so a recycled pid
// is never signalled; the pidfd is taken before the parent is read, and the
// parent counts only if the pidfd is still unsignalled afterwards (the stat
// read was of that process). Tracked tools are killed with their session and
// checked dead by `tandemctl session kill`.
//
// Bounds: at most `per_session` tools a session (limits.tools_per_session);
// a runner holds at most sessions_per_client sessions.
//
// Thread-safety: one thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/unique_fd.h"

namespace tandem::daemon {

class UnplacedTools {
 public:
  struct Tool {
    std::uint32_t call = 0;
    std::int32_t pid = 0;
    base::UniqueFd pidfd;
  };
  enum class Tracked : std::uint8_t {
    kIgnored,     // no pid, already tracked, or the session holds per_session already
    kUnverified,  // not a child of the runner (or gone): not tracked
    kTracked,
  };

  // `proc_root` is /proc but in tests.
  explicit UnplacedTools(std::string proc_root = "/proc") : proc_root_(std::move(proc_root)) {}

  // Tool `call` of `session`, process `pid`, named by the runner whose
  // process is `runner_pid`.
  Tracked track(std::uint64_t session, std::uint32_t call, std::int32_t pid, pid_t runner_pid, std::size_t per_session);
  // The tool's TOOL_END: no longer tracked.
  void ended(std::uint64_t session, std::uint32_t call);
  // SIGKILLs the session's tools (by pidfd) and forgets them; returns them,
  // so a caller can wait on their pidfds to see them gone.
  std::vector<Tool> kill(std::uint64_t session);
  std::size_t sessions() const { return by_session_.size(); }

 private:
  std::string proc_root_;
  std::unordered_map<std::uint64_t, std::vector<Tool>> by_session_;
};

}  // namespace tandem::daemon
