#include "base/text.h"

#include <cerrno>

#include <fmt/format.h>

namespace tandem::base {
namespace {

// One decoded character: its code point and length, or length 0 for a byte
// that does not start a valid sequence.
struct Decoded {
  char32_t cp = 0;
  std::size_t len = 0;
};

Decoded decode(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return {c, 1};
  std::size_t len = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
    min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
    min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
    min = 0x10000;
  } else {
    return {};
  }
  if (i + len > s.size()) return {};
  for (std::size_t k = 1; k < len; ++k) {
    if ((b(k) & 0xC0) != 0x80) return {};
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
  return {cp, len};
}

// Characters that may not appear in a name and are escaped in renderings.
bool forbidden(char32_t cp) {
  return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.len == 0) return false;
    i += d.len;
  }
  return true;
}

const char* name_problem(std::string_view s, std::size_t max_bytes) {
  if (s.empty()) return "empty";
  if (s.size() > max_bytes) return "too long";
  for (std::size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.len == 0) return "not valid UTF-8";
    if (forbidden(d.cp)) return "contains a control or formatting character";
    i += d.len;
  }
  return nullptr;
}

Result<void> check_name(std::string_view s, std::string_view what, std::size_t max_bytes) {
  const char* problem = name_problem(s, max_bytes);
  if (problem == nullptr) return {};
  if (s.size() > max_bytes) {
    return make_error(ENAMETOOLONG, fmt::format("{} is {} bytes, longer than {}", what, s.size(), max_bytes));
  }
  return make_error(EINVAL, fmt::format("{} \"{}\" is {}", what, escape(s, 64), problem));
}

namespace {

std::string escape_impl(std::string_view s, std::size_t max_bytes, bool quotes) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes) + 8);
  std::size_t i = 0;
  while (i < s.size()) {
    const Decoded d = decode(s, i);
    const std::size_t len = d.len == 0 ? 1 : d.len;
    if (i + len > max_bytes) break;
    if (d.len == 0) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i]));
    } else if (d.cp == '\n') {
      out += "\\n";
    } else if (d.cp == '\t') {
      out += "\\t";
    } else if (d.cp == '\r') {
      out += "\\r";
    } else if (quotes && d.cp == '\\') {
      out += "\\\\";
    } else if (quotes && d.cp == '"') {
      out += "\\\"";
    } else if (forbidden(d.cp)) {
      out += d.cp < 0x100 ? fmt::format("\\x{:02x}", static_cast<unsigned>(d.cp))
                          : fmt::format("\\u{{{:04x}}}", static_cast<unsigned>(d.cp));
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  if (i < s.size()) out += "…";
  return out;
}

}  // namespace

std::string escape(std::string_view s, std::size_t max_bytes) { return escape_impl(s, max_bytes, true); }

std::string one_line(std::string_view s) { return escape_impl(s, s.size(), false); }

std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  std::size_t end = max_bytes;
  // Back off continuation bytes, then drop a lead byte whose sequence would
  // not fit (at most three steps: a sequence is at most four bytes).
  std::size_t back = 0;
  while (end > 0 && back < 3 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) {
    --end;
    ++back;
  }
  return s.substr(0, end);
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(s.substr(i, d.len));
      i += d.len;
    }
  }
  return out;
}

}  // namespace tandem::base
