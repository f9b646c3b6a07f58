// Pure parsers.
#include "base/parse.h"

#include <cmath>
#include <limits>

namespace tandem::base {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// Splits "123abc" into the numeric prefix and the unit suffix.
std::pair<std::string_view, std::string_view> split_unit(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() &&
         ((s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == 'e' || s[i] == 'E' || s[i] == '+' || s[i] == '-')) {
    // 'e' only counts as an exponent when a digit or sign follows it.
    if ((s[i] == 'e' || s[i] == 'E') &&
        !(i + 1 < s.size() && ((s[i + 1] >= '0' && s[i + 1] <= '9') || s[i + 1] == '-' || s[i + 1] == '+'))) {
      break;
    }
    ++i;
  }
  return {s.substr(0, i), s.substr(i)};
}

}  // namespace

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep, bool skip_empty) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    std::size_t pos = s.find(sep, start);
    std::string_view field = s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start);
    if (!(skip_empty && field.empty())) out.push_back(field);
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

Result<double> parse_double(std::string_view s) {
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || !std::isfinite(value)) {
    return make_error(EINVAL, "not a number: '" + std::string(s) + "'");
  }
  return value;
}

Result<std::uint64_t> parse_size(std::string_view s) {
  auto [digits, unit] = split_unit(s);
  auto n = parse_int<std::uint64_t>(digits);
  if (!n) return make_error(n.error().code(), "not a size: '" + std::string(s) + "'");
  unsigned shift = 0;
  if (unit.empty() || iequals(unit, "b")) {
    shift = 0;
  } else if (iequals(unit, "k") || iequals(unit, "kib")) {
    shift = 10;
  } else if (iequals(unit, "m") || iequals(unit, "mib")) {
    shift = 20;
  } else if (iequals(unit, "g") || iequals(unit, "gib")) {
    shift = 30;
  } else if (iequals(unit, "t") || iequals(unit, "tib")) {
    shift = 40;
  } else {
    return make_error(EINVAL,
                      "unknown size unit '" + std::string(unit) + "' in '" + std::string(s) + "' (use K, M, G, T)");
  }
  if (shift > 0 && *n > (std::numeric_limits<std::uint64_t>::max() >> shift)) {
    return make_error(ERANGE, "size out of range: '" + std::string(s) + "'");
  }
  return *n << shift;
}

Result<Duration> parse_duration(std::string_view s) {
  auto [number, unit] = split_unit(s);
  double scale = 0;
  if (unit == "ns") {
    scale = 1;
  } else if (unit == "us") {
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1e6;
  } else if (unit == "s") {
    scale = 1e9;
  } else if (unit == "m") {
    scale = 60e9;
  } else if (unit == "h") {
    scale = 3600e9;
  } else {
    return make_error(EINVAL, "duration '" + std::string(s) + "' needs a unit: ns, us, ms, s, m or h");
  }
  auto value = parse_double(number);
  if (!value || *value < 0) return make_error(EINVAL, "not a duration: '" + std::string(s) + "'");
  double ns = *value * scale;
  if (ns > static_cast<double>(std::numeric_limits<std::int64_t>::max())) {
    return make_error(ERANGE, "duration out of range: '" + std::string(s) + "'");
  }
  return Duration(static_cast<std::int64_t>(std::llround(ns)));
}

Result<std::vector<std::pair<std::string_view, std::string_view>>> parse_key_values(std::string_view text) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  std::size_t line_no = 0;
  for (std::string_view line : split(text, '\n')) {
    ++line_no;
    line = trim(line);
    if (line.empty()) continue;
    std::size_t gap = 0;
    while (gap < line.size() && !is_space(line[gap])) ++gap;
    std::string_view key = line.substr(0, gap);
    std::string_view value = trim(line.substr(gap));
    if (value.empty()) {
      return make_error(EINVAL, "line " + std::to_string(line_no) + ": key '" + std::string(key) + "' has no value");
    }
    out.emplace_back(key, value);
  }
  return out;
}

}  // namespace tandem::base
