// tandemctl's output: the daemon's JSON answers (docs/tandemctl.md) turned
// into text for people.
//
// Pure: no I/O, no clock. The daemon's JSON is treated as untrusted-ish
// input: a missing key, a null or a value of the wrong type renders as "-",
// strings are stripped of control characters (a session name cannot break a
// table or move the cursor), and nothing here throws. Only a body that is
// not JSON at all, or whose top-level shape is wrong (no "sessions" list in a
// `sessions` answer), is an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace tandem::ctl {

// What a cell shows when the daemon left a value out (or sent null).
inline constexpr std::string_view kMissing = "-";

// Commands this build of tandemctl knows how to render.
bool known_command(std::string_view command);

// A table before layout: the header and, per row, one cell per column.
// Thread-safety: a value type.
struct Table {
  std::vector<std::string> header;
  std::vector<bool> right_aligned;  // per column: numbers are right-aligned
  std::vector<std::vector<std::string>> rows;
};

// Lays a table out: columns two spaces apart, each as wide as its widest
// cell, no trailing blanks. A table without rows prints its header and
// "(none)".
std::string format_table(const Table& table);

// The cells of `tandemctl engines` / `tandemctl sessions`. `reply` is the
// whole answer ({"engines": [...]}, {"sessions": [...]}).
// Errors: EBADMSG (no list under the expected key).
base::Result<Table> engines_table(const nlohmann::json& reply);
base::Result<Table> sessions_table(const nlohmann::json& reply);
// `tandemctl tools`: per session with tool cgroups, its calls, processes,
// CPU, memory, cpu.weight and state (throttled, frozen, orphan, protected).
base::Result<Table> tools_table(const nlohmann::json& reply);

// `tandemctl status`: aligned "key: value" lines, nested objects flattened to
// dotted keys ("sessions.reasoning"). The keys the daemon is documented to
// send come first, in a fixed order and shown as "-" when absent; any other
// key it sends follows, so a newer daemon's additions are not hidden.
// Errors: EBADMSG (the reply is not an object).
base::Result<std::string> render_status(const nlohmann::json& reply);

// The text for `command`'s answer `body` (the CtlResponse body): a table or
// key list, or with `json` the body pretty-printed.
// Errors: EBADMSG (body is not JSON, or has the wrong shape), EINVAL (a
// command this build does not know).
base::Result<std::string> render(std::string_view command, std::string_view body, bool json);

// `tandemctl events`: one line per event ("+12.345s  round_end  agent-1
// (00ab…)  round 3: …"), or with `json` one JSON object per line. `since` is
// advanced to the last event shown. A gap (events that left the daemon's
// window before they were read) is said in a line of its own.
base::Result<std::string> render_events(std::string_view body, bool json, std::uint64_t& since);
// One part of `tandemctl top`'s screen: a status summary, the engines
// table or the sessions table.
base::Result<std::string> render_top_part(std::string_view command, std::string_view body);
// `tandemctl gpu` (ctl/render_gpu.cc): a line naming NVML's library, interval
// and the sample's age, then a table of devices (GPU, NAME, UTIL%, MEM%,
// MEMORY used/total GiB, SM.MHZ, MEM.MHZ, POWER, TEMP), a table of GPU
// processes (GPU, PID, CLIENT, ROLE, MEMORY) and the fields NVML could not
// read. Without NVML: "NVML: unavailable (<reason>)".
// Errors: EBADMSG (not an object; no "devices" list for the tables).
base::Result<std::string> render_gpu(const nlohmann::json& reply);
base::Result<Table> gpu_devices_table(const nlohmann::json& reply);
base::Result<Table> gpu_processes_table(const nlohmann::json& reply);
// `tandemctl policy`: the policy, its tick and epoch, then a table of its
// parameters (value, default, range).
base::Result<std::string> render_policy(const nlohmann::json& reply);

// Helpers, exposed for tests.
// A value as a cell: strings (cleaned), numbers, booleans as yes/no; null,
// absent and containers as "-".
std::string cell(const nlohmann::json& object, std::string_view key);
// `s` with every control character replaced by '?'.
std::string clean(std::string_view s);
// Seconds as a short duration: "0.4s", "12.3s", "2m05s", "1h02m", "3d04h".
std::string format_age(double seconds);

}  // namespace tandem::ctl
