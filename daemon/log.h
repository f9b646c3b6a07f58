// tandemd's log lines (docs/architecture.md "Processes"): one line per message on stderr,
// prefixed with its sd-daemon priority ("<6>" info, "<4>" warn, …), which
// journald turns into priorities.
//
// A line is total: whatever a message holds — a client's name, a path, an
// error text — is rendered on that one line. The formatter escapes every
// control or formatting character and every byte that is not valid UTF-8 in
// the message (base::one_line), so nothing a client sends can end the line
// and start a forged one ("\n<0>pwned" stays "\n<0>pwned", visibly, on the
// line that carries it). Call sites still quote client strings with
// base::escape(), which also escapes quotes; this is the backstop.
#pragma once

#include <memory>
#include <string_view>

#include <spdlog/formatter.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/sink.h>

namespace tandem::daemon {

// "<N>message" with the message made one line.
std::unique_ptr<spdlog::formatter> make_log_formatter();

// A logger writing such lines to `sink`, at `level` (main: stderr; tests: a
// stream they read back).
std::shared_ptr<spdlog::logger> make_logger(spdlog::sink_ptr sink, std::string_view level);

}  // namespace tandem::daemon
