// tandem-test-tool: a stand-in for an agent's tool process in tests (issue 6).
//
// One small, dependency-free program whose subcommands behave like the tools
// the CPU plane manages: burning CPU, growing memory, escaping as a daemon,
// forking storms, and reporting what the process looks like from inside (its
// cgroups, session, cwd, signals, fds, environment). Run with --help for the
// list. Usage errors exit 2 with a message on stderr.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr int kUsageExit = 2;
constexpr std::size_t kMiB = 1024 * 1024;
constexpr std::size_t kMemStepMiB = 16;

constexpr const char* kUsage =
    "usage: tandem-test-tool COMMAND [ARGS]\n"
    "\n"
    "  burn-cpu SECONDS           busy-loop until the process has used SECONDS of CPU time, exit 0\n"
    "  burn-mem MIB [HOLD]        allocate and touch MIB MiB in steps of 16 MiB, printing progress,\n"
    "                             hold it HOLD seconds (default 0), exit 0\n"
    "  daemonize SECONDS          double-fork a grandchild in a new session that sleeps SECONDS with\n"
    "                             stdio on /dev/null; print its pid; the first child and this process exit 0\n"
    "  sleep SECONDS              sleep, exit 0\n"
    "  exit CODE                  exit with CODE (0-255)\n"
    "  raise SIGNAL               end by SIGNAL (a number or a name such as TERM), default action\n"
    "  storm N                    fork+exec /bin/true N times, waiting for each; exit 1 if one fails\n"
    "  self [VAR...]              print pid, ppid, sid, cwd, SigBlk/SigIgn, open fds, the VARs and\n"
    "                             /proc/self/cgroup, one 'key=value' per line, exit 0\n"
    "  --help                     this text\n"
    "\n"
    "SECONDS may be fractional.\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "tandem-test-tool: %s\n(run 'tandem-test-tool --help' for usage)\n", message.c_str());
  std::exit(kUsageExit);
}

// A whole-string, finite, non-negative number of seconds.
double parse_seconds(const char* what, const char* text) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(v) || v < 0) {
    usage_error(std::string(what) + ": '" + text + "' is not a non-negative number of seconds");
  }
  return v;
}

// A whole-string decimal integer in [lo, hi].
long parse_int(const char* what, const char* text, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    usage_error(std::string(what) + ": '" + text + "' is not an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  }
  return v;
}

void expect_args(const char* cmd, int argc, int min, int max) {
  if (argc < min || argc > max) {
    usage_error(std::string(cmd) + ": expected " +
                (min == max ? std::to_string(min) : std::to_string(min) + "-" + std::to_string(max)) +
                " argument(s), got " + std::to_string(argc));
  }
}

double clock_seconds(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Sleeps to an absolute CLOCK_MONOTONIC deadline, through signals that interrupt it.
void sleep_seconds(double seconds) {
  timespec deadline{};
  ::clock_gettime(CLOCK_MONOTONIC, &deadline);
  auto whole = static_cast<time_t>(seconds);
  long frac = std::lround((seconds - static_cast<double>(whole)) * 1e9);
  deadline.tv_sec += whole;
  deadline.tv_nsec += frac;
  while (deadline.tv_nsec >= 1'000'000'000) {
    deadline.tv_nsec -= 1'000'000'000;
    ++deadline.tv_sec;
  }
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nullptr) == EINTR) {
  }
}

int cmd_burn_cpu(double seconds) {
  // CPU time, not wall time: under contention or a cpu.max quota the loop
  // takes longer but always consumes what was asked.
  const double start = clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
  volatile std::uint64_t sink = 0;
  while (clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - start < seconds) {
    for (int i = 0; i < 100'000; ++i) sink = sink * 6364136223846793005ULL + 1442695040888963407ULL;
  }
  return 0;
}

int cmd_burn_mem(long mib, double hold) {
  const long page = ::sysconf(_SC_PAGESIZE);
  long done = 0;
  while (done < mib) {
    long step = std::min<long>(kMemStepMiB, mib - done);
    std::size_t bytes = static_cast<std::size_t>(step) * kMiB;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "tandem-test-tool: burn-mem: mmap %ld MiB after %ld MiB: %s\n", step, done,
                   std::strerror(errno));
      return 1;
    }
    // Touch every page so it is resident (and charged to the memory cgroup).
    auto* bytes_p = static_cast<volatile unsigned char*>(p);
    for (std::size_t off = 0; off < bytes; off += static_cast<std::size_t>(page)) bytes_p[off] = 1;
    done += step;
    std::printf("allocated %ld MiB\n", done);
    std::fflush(stdout);
  }
  sleep_seconds(hold);
  return 0;
}

int cmd_daemonize(double seconds) {
  std::fflush(stdout);
  pid_t first = ::fork();
  if (first < 0) {
    std::fprintf(stderr, "tandem-test-tool: daemonize: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (first == 0) {
    if (::setsid() < 0) ::_exit(1);
    pid_t grandchild = ::fork();
    if (grandchild < 0) ::_exit(1);
    if (grandchild == 0) {
      // A real daemon lets go of its stdio, so a reader of the tool's output
      // sees EOF when the tool exits even though this process lives on.
      int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      if (null_fd >= 0) {
        for (int fd = 0; fd < 3; ++fd) ::dup2(null_fd, fd);
        ::close(null_fd);
      }
      sleep_seconds(seconds);
      ::_exit(0);
    }
    char line[32];
    int len = std::snprintf(line, sizeof line, "%d\n", static_cast<int>(grandchild));
    ssize_t n = ::write(STDOUT_FILENO, line, static_cast<std::size_t>(len));
    ::_exit(n == len ? 0 : 1);
  }
  int status = 0;
  while (::waitpid(first, &status, 0) < 0) {
    if (errno != EINTR) {
      std::fprintf(stderr, "tandem-test-tool: daemonize: waitpid: %s\n", std::strerror(errno));
      return 1;
    }
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int parse_signal(const char* text) {
  struct Named {
    const char* name;
    int sig;
  };
  static constexpr Named kNames[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ILL", SIGILL},
                                     {"ABRT", SIGABRT}, {"FPE", SIGFPE},   {"KILL", SIGKILL}, {"SEGV", SIGSEGV},
                                     {"PIPE", SIGPIPE}, {"ALRM", SIGALRM}, {"TERM", SIGTERM}, {"USR1", SIGUSR1},
                                     {"USR2", SIGUSR2}};
  std::string_view name = text;
  if (name.starts_with("SIG")) name.remove_prefix(3);
  for (const auto& n : kNames) {
    if (name == n.name) return n.sig;
  }
  return static_cast<int>(parse_int("raise", text, 1, SIGRTMAX));
}

int cmd_raise(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  sigset_t set;
  ::sigemptyset(&set);
  ::sigaddset(&set, sig);
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);
  std::fprintf(stderr, "tandem-test-tool: raise: signal %d did not end the process\n", sig);
  return 1;
}

int cmd_storm(long n) {
  for (long i = 0; i < n; ++i) {
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "tandem-test-tool: storm: fork %ld of %ld: %s\n", i + 1, n, std::strerror(errno));
      return 1;
    }
    if (pid == 0) {
      ::execl("/bin/true", "true", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) {
        std::fprintf(stderr, "tandem-test-tool: storm: waitpid: %s\n", std::strerror(errno));
        return 1;
      }
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "tandem-test-tool: storm: /bin/true %ld of %ld failed (status %#x)\n", i + 1, n,
                   static_cast<unsigned>(status));
      return 1;
    }
  }
  return 0;
}

std::string read_file(const char* path) {
  std::string out;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// The value of "Key:\t..." in /proc/self/status.
std::string status_field(const std::string& status, std::string_view key) {
  std::size_t pos = 0;
  while (pos < status.size()) {
    std::size_t eol = status.find('\n', pos);
    if (eol == std::string::npos) eol = status.size();
    std::string_view line(status.data() + pos, eol - pos);
    if (line.starts_with(key) && line.size() > key.size() && line[key.size()] == ':') {
      line.remove_prefix(key.size() + 1);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      return std::string(line);
    }
    pos = eol + 1;
  }
  return "?";
}

int cmd_self(int argc, char** argv) {
  std::printf("pid=%d\nppid=%d\nsid=%d\n", static_cast<int>(::getpid()), static_cast<int>(::getppid()),
              static_cast<int>(::getsid(0)));
  std::vector<char> cwd(4096);
  std::printf("cwd=%s\n", ::getcwd(cwd.data(), cwd.size()) != nullptr ? cwd.data() : "?");
  std::string status = read_file("/proc/self/status");
  std::printf("sigblk=%s\nsigign=%s\n", status_field(status, "SigBlk").c_str(), status_field(status, "SigIgn").c_str());

  std::string fds;
  if (DIR* d = ::opendir("/proc/self/fd"); d != nullptr) {
    std::vector<int> list;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      int fd = std::atoi(e->d_name);
      if (fd != ::dirfd(d)) list.push_back(fd);
    }
    ::closedir(d);
    std::sort(list.begin(), list.end());
    for (int fd : list) fds += (fds.empty() ? "" : ",") + std::to_string(fd);
  }
  std::printf("fds=%s\n", fds.c_str());

  for (int i = 0; i < argc; ++i) {
    const char* v = std::getenv(argv[i]);  // NOLINT(concurrency-mt-unsafe): single-threaded
    std::printf("env:%s=%s\n", argv[i], v != nullptr ? v : "(unset)");
  }
  std::string cgroup = read_file("/proc/self/cgroup");
  std::size_t pos = 0;
  while (pos < cgroup.size()) {
    std::size_t eol = cgroup.find('\n', pos);
    if (eol == std::string::npos) eol = cgroup.size();
    std::printf("cgroup=%.*s\n", static_cast<int>(eol - pos), cgroup.data() + pos);
    pos = eol + 1;
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kUsageExit;
  }
  std::string_view cmd = argv[1];
  int nargs = argc - 2;
  char** args = argv + 2;
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "burn-cpu") {
    expect_args("burn-cpu", nargs, 1, 1);
    return cmd_burn_cpu(parse_seconds("burn-cpu", args[0]));
  }
  if (cmd == "burn-mem") {
    expect_args("burn-mem", nargs, 1, 2);
    long mib = parse_int("burn-mem", args[0], 0, 1L << 30);
    double hold = nargs == 2 ? parse_seconds("burn-mem", args[1]) : 0.0;
    return cmd_burn_mem(mib, hold);
  }
  if (cmd == "daemonize") {
    expect_args("daemonize", nargs, 1, 1);
    return cmd_daemonize(parse_seconds("daemonize", args[0]));
  }
  if (cmd == "sleep") {
    expect_args("sleep", nargs, 1, 1);
    sleep_seconds(parse_seconds("sleep", args[0]));
    return 0;
  }
  if (cmd == "exit") {
    expect_args("exit", nargs, 1, 1);
    return static_cast<int>(parse_int("exit", args[0], 0, 255));
  }
  if (cmd == "raise") {
    expect_args("raise", nargs, 1, 1);
    return cmd_raise(parse_signal(args[0]));
  }
  if (cmd == "storm") {
    expect_args("storm", nargs, 1, 1);
    return cmd_storm(parse_int("storm", args[0], 0, 1L << 24));
  }
  if (cmd == "self") return cmd_self(nargs, args);
  usage_error("unknown command '" + std::string(cmd) + "'");
}
