// UnplacedTools (daemon/unplaced.h).
#include "daemon/unplaced.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>

#include <fmt/format.h>

#include "daemon/owners.h"

namespace tandem::daemon {

UnplacedTools::Tracked UnplacedTools::track(std::uint64_t session, std::uint32_t call, std::int32_t pid,
                                            pid_t runner_pid, std::size_t per_session) {
  if (pid <= 0 || runner_pid <= 0) return Tracked::kIgnored;
  const auto it = by_session_.find(session);
  const std::vector<Tool> none;
  const std::vector<Tool>& tools = it == by_session_.end() ? none : it->second;
  const bool known = std::any_of(tools.begin(), tools.end(), [&](const Tool& t) { return t.call == call; });
  if (known || tools.size() >= per_session) return Tracked::kIgnored;
  base::UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  bool child = false;
  if (fd) {
    const std::string path = fmt::format("{}/{}/stat", proc_root_, pid);
    base::UniqueFd stat(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    char buf[1024];
    const ssize_t n = stat ? ::read(stat.get(), buf, sizeof buf - 1) : -1;
    pollfd p{fd.get(), POLLIN, 0};
    child = n > 0 && parse_parent_pid(std::string_view(buf, static_cast<std::size_t>(n))).value_or(0) == runner_pid &&
            ::poll(&p, 1, 0) == 0;
  }
  if (!child) return Tracked::kUnverified;
  by_session_[session].push_back(Tool{call, pid, std::move(fd)});
  return Tracked::kTracked;
}

void UnplacedTools::ended(std::uint64_t session, std::uint32_t call) {
  auto it = by_session_.find(session);
  if (it == by_session_.end()) return;
  std::erase_if(it->second, [&](const Tool& t) { return t.call == call; });
  if (it->second.empty()) by_session_.erase(it);
}

std::vector<UnplacedTools::Tool> UnplacedTools::kill(std::uint64_t session) {
  auto it = by_session_.find(session);
  if (it == by_session_.end()) return {};
  std::vector<Tool> tools = std::move(it->second);
  by_session_.erase(it);
  for (const Tool& t : tools) (void)::syscall(SYS_pidfd_send_signal, t.pidfd.get(), SIGKILL, nullptr, 0);
  return tools;
}

}  // namespace tandem::daemon
