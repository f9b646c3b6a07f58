// The handshake's verdict: what a client's Hello (ipc/schema/tandem.fbs)
// asks for, judged against the protocol version, the config's [roles] and
// the peer's SO_PEERCRED credentials, before the daemon gives it anything.
// Pure over its inputs (it reads the client registry only to know whether
// one more ctl client fits): it sends, creates and changes nothing; the
// Server acts on the verdict (daemon/handshake.cc on_hello: the segment and
// rings, the Welcome, a runner's handle, an engine's PolicyConfig).
//
// Thread-safety: a function of its arguments.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "daemon/clients.h"
#include "daemon/config.h"
#include "ipc/schema/tandem_generated.h"
#include "sched/types.h"

namespace tandem::daemon {

// What the client gets when its Hello is taken.
struct HelloTerms {
  Role role = Role::kCtlRead;
  std::string name;
  std::uint64_t instance = 0;  // Hello.instance
  // Engines only.
  sched::EngineParams engine;
  std::int32_t gpu_index = -1;
  std::uint32_t saturating_tokens = 0;
};

struct HelloVerdict {
  bool taken = false;
  // The role, name and instance passed (they are in `terms`), whether or not
  // what came after them did: a client refused for its engine parameters
  // is logged under its role and name.
  bool identified = false;
  HelloTerms terms;
  int code = 0;             // the refusal's errno
  std::string why;          // and its message, as the client is told
  bool bad_name = false;    // refused for its client name (counted as names_refused)
  bool over_limit = false;  // refused at the ctl cap (counted as clients_refused_limits)
};

// `daemon_euid` is the daemon's own user (geteuid()), which may take any role.
HelloVerdict judge_hello(const wire::Hello& hello, const CompiledConfig& config, uid_t uid, gid_t gid,
                         uid_t daemon_euid, const Clients& clients);

}  // namespace tandem::daemon
