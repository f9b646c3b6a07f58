// libFuzzer target for tandemd's ctl request handling and what clients can
// put into its answers: ctl requests (any command, arguments and cursor,
// from an admin and from `nobody`), session names from runners and an
// engine (valid, not UTF-8, forged), ring records that open and close
// sessions, ToolPrepares, garbage datagrams and dropped connections, all on
// one in-process tandemd (tests/fuzz/daemon_driver.h checks every answer).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/daemon_driver.h"

namespace {

using namespace tandem;
using fuzzing::Bytes;

const std::vector<std::string> kCommands = {"status",       "engines",       "sessions", "tools",   "gpu",
                                            "metrics",      "events",        "policy",   "drain",   "undrain",
                                            "session-kill", "session-evict", "reload",   "nonsense"};

void ctl(fuzzing::Driver& d, Bytes& in) {
  auto& c = d.client(in.u8() % 2 == 0 ? 4 : 5);
  const std::uint8_t k = in.u8();
  std::string command = k < 240 ? kCommands[k % kCommands.size()] : in.str(80);
  std::vector<std::string> args;
  const int n = in.u8() % 4;
  for (int i = 0; i < n; ++i) {
    const std::uint8_t a = in.u8();
    if (a < 64) {
      args.push_back(fuzzing::names()[a % fuzzing::names().size()]);
    } else if (a < 96) {
      args.emplace_back(a % 2 == 0 ? "set" : "get");
    } else if (a < 128) {
      args.emplace_back(a % 2 == 0 ? "window_max" : "tick_ms");
    } else {
      args.push_back(in.str(300));
    }
  }
  // Keep the tick sane: a `policy set tick_ms` the fuzzer picks may be legal.
  if (command == "reload") command = "status";
  const std::string cursor = in.u8() < 32 ? in.str(40) : "";
  (void)c.send(ipc::build_ctl_request(command, args, true, cursor));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto& d = fuzzing::driver();
  Bytes in(data, size);
  for (int ops = 0; ops < 32 && !in.empty(); ++ops) {
    switch (in.u8() % 7) {
      case 0:
      case 1:
        ctl(d, in);
        break;
      case 2: {  // a session name, from a runner or the engine
        const int who = in.u8() % 4;
        const std::uint8_t k = in.u8();
        const std::string name = k < 200 ? fuzzing::names()[k % fuzzing::names().size()] : in.str(400);
        const std::uint64_t id = in.u8() < 200 ? base::session_id(name) : in.u64();
        (void)d.client(who).send(ipc::build_session_name(id, name));
        break;
      }
      case 3: {  // a runner opens or closes a session, or the engine submits a round
        const int who = in.u8() % 4;
        const std::uint64_t s = fuzzing::pick_session(in);
        const std::uint8_t what = in.u8();
        if (who == 3) {
          ipc::RoundSubmit r;
          r.prompt_tokens = what;
          r.projected_blocks = what % 16;
          (void)d.client(3).push(r, s);
        } else if (what % 2 == 0) {
          (void)d.client(who).push(ipc::SessionOpen{}, s);
        } else {
          (void)d.client(who).push(ipc::SessionClose{}, s);
        }
        break;
      }
      case 4: {  // a ToolPrepare
        const int who = in.u8() % 3;
        (void)d.client(who).send(ipc::build_tool_prepare(in.u32(), fuzzing::pick_session(in), in.u32(), 1, {}));
        break;
      }
      case 5: {  // garbage
        const std::string bytes = in.str(512);
        if (!bytes.empty()) {
          (void)::send(d.client(in.u8() % fuzzing::Driver::kClients).fd(), bytes.data(), bytes.size(),
                       MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        break;
      }
      case 6:
        d.drop(in.u8() % fuzzing::Driver::kClients);
        break;
    }
    d.settle();
  }
  return 0;
}
