// Small pure parsers for the text the kernel and config files hand us.
//
// Every parser takes a string_view, reads nothing else, and returns a Result
// whose error (EINVAL, or ERANGE for overflow) names the offending text.
// I/O lives elsewhere: read a file, then parse the string.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/result.h"

namespace tandem::base {

// Strips ASCII whitespace from both ends.
std::string_view trim(std::string_view s);

// Splits on `sep`; empty fields are kept unless `skip_empty`.
std::vector<std::string_view> split(std::string_view s, char sep, bool skip_empty = false);

// A whole decimal integer ("42", "-7"); surrounding whitespace is not allowed.
template <std::integral Int>
Result<Int> parse_int(std::string_view s) {
  Int value{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec == std::errc::result_out_of_range) {
    return make_error(ERANGE, "integer out of range: '" + std::string(s) + "'");
  }
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    return make_error(EINVAL, "not an integer: '" + std::string(s) + "'");
  }
  return value;
}

// A whole finite decimal floating-point number ("0.9", "1e-3").
Result<double> parse_double(std::string_view s);

// A byte count: an integer with an optional binary suffix K, M, G, T (or KiB,
// MiB, GiB, TiB; case-insensitive); "64M" = 64 MiB. Overflow is ERANGE.
Result<std::uint64_t> parse_size(std::string_view s);

// A duration: a non-negative number with a unit ns, us, ms, s, m or h
// ("200ms", "1.5s"). A bare number is rejected: units are never guessed.
Result<Duration> parse_duration(std::string_view s);

// "key value" lines (cpu.stat, memory.stat): one pair per non-empty line,
// separated by whitespace. A line without a value is an error.
Result<std::vector<std::pair<std::string_view, std::string_view>>> parse_key_values(std::string_view text);

}  // namespace tandem::base
