// Pieces the parts of tandemd's Server share (daemon/server.cc, the loop;
// daemon/handshake.cc; daemon/sessions.cc; daemon/intake.cc; daemon/tick.cc;
// daemon/server_ctl.cc; Clients in daemon/clients.cc; Control in
// daemon/control.cc; CtlService in daemon/ctl.cc): its constants and small
// helpers. Included only by those files.
#pragma once

#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "daemon/config.h"
#include "ipc/messages.h"
#include "ipc/records.h"
#include "sched/types.h"

namespace tandem::daemon {

inline constexpr std::string_view kVersion = "0.1.0";

// "reasoning" for REASONING: ctl's JSON keys and values are lower case.
template <class E>
std::string lower(E value) {
  std::string s(sched::to_string(value));
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// A client must say Hello this soon after connecting.
constexpr base::Duration kHelloTimeout = std::chrono::seconds(5);
// Socket messages handled per client per wake-up before others get a turn.
constexpr int kMessagesPerWake = 64;
// Pump rounds per loop iteration: each gives every pending client one batch.
constexpr int kPumpRounds = 4;
// Bad records in one batch that mark a client as hostile.
constexpr std::uint64_t kHostileRejects = 1024;
// Directives kept for an engine whose ring is full.
constexpr std::size_t kBacklogLimit = 65536;
// A warning that could repeat (refused connections, accept failures) is
// logged at most once per interval, with a count of the ones held back.
constexpr base::Duration kQuietInterval = std::chrono::seconds(10);
// accept() failing for want of fds or memory: paused this long, doubling.
constexpr base::Duration kAcceptBackoffMin = std::chrono::milliseconds(10);
constexpr base::Duration kAcceptBackoffMax = std::chrono::seconds(1);
// Per-request Errors sent to one client in a second, at most (more are
// counted, not sent: a client over a limit would otherwise flood its socket).
constexpr std::uint32_t kErrorsPerSecond = 64;

inline std::optional<Role> role_from_wire(wire::Role r) {
  switch (r) {
    case wire::Role::Engine:
      return Role::kEngine;
    case wire::Role::Runner:
      return Role::kRunner;
    case wire::Role::CtlRead:
      return Role::kCtlRead;
    case wire::Role::CtlAdmin:
      return Role::kCtlAdmin;
    default:
      return std::nullopt;
  }
}

template <class T>
ipc::Slot directive_slot(const T& record, sched::SessionId session, base::Time now) {
  return ipc::encode(record, session, base::to_ns(now));
}

}  // namespace tandem::daemon
