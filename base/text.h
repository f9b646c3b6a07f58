// Untrusted text: names that clients choose (sessions, clients) and that end
// up in tandemd's logs, its JSON answers and tandemctl's tables.
//
// Two tools, both pure and total (they never throw on any input):
//   - name_problem() / check_name(): the rule a name must meet to be taken
//     at all — 1 to kMaxNameBytes bytes of valid UTF-8 (shortest forms, no
//     surrogates, at most U+10FFFF) without control characters (C0, DEL,
//     C1), line or paragraph separators (U+2028, U+2029) or bidirectional
//     overrides and isolates (U+202A..U+202E, U+2066..U+2069), which could
//     break a log line or turn a table's text around. libtandem and tandemd
//     apply the same rule, so both sides agree on every name.
//   - escape(): a printable, single-line rendering of anything, for log lines
//     and messages that echo what a client sent: the characters above and
//     every byte that is not valid UTF-8 become escapes (\n, \t, \r, \\, \",
//     \xNN, \u{NNNN}), and the text is cut at a byte budget without
//     splitting a character. An escaped string cannot forge a line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace tandem::base {

// The longest session or client name either side accepts.
inline constexpr std::size_t kMaxNameBytes = 256;
// The longest tool name libtandem takes (tandem_tool_begin, _spawn) or an
// engine's request may give: tool names only become a kind (tool_kind_id).
inline constexpr std::size_t kMaxToolNameBytes = 1024;

// Whether `s` is well-formed UTF-8 (RFC 3629: shortest forms only, no
// surrogates, nothing above U+10FFFF).
bool valid_utf8(std::string_view s);

// Why `s` is not an acceptable name ("empty", "longer than 256 bytes", "not
// valid UTF-8 at byte 7", "a control character (U+000A) at byte 5"), or
// nullptr when it is.
const char* name_problem(std::string_view s, std::size_t max_bytes = kMaxNameBytes);

// name_problem() as an error: ENAMETOOLONG for a name over `max_bytes`,
// EINVAL for any other problem; `what` names the field ("session name").
Result<void> check_name(std::string_view s, std::string_view what, std::size_t max_bytes = kMaxNameBytes);

// A printable single-line rendering of `s`; at most `max_bytes` of `s` are
// shown, then "…" if there was more.
std::string escape(std::string_view s, std::size_t max_bytes = 256);

// `s` with only what could break a line escaped (control and formatting
// characters, bytes that are not valid UTF-8; quotes and backslashes stay),
// whole: for a log line as a whole, after its parts were escaped.
std::string one_line(std::string_view s);

// The longest prefix of `s` of at most `max_bytes` bytes that does not end
// inside a UTF-8 sequence (a valid string stays valid).
std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes);

// `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD, so
// that a JSON encoder (or a Python decoder) can always take it.
std::string to_valid_utf8(std::string_view s);

}  // namespace tandem::base
