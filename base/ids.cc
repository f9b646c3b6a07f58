// xxh64-based ids.
#include "base/ids.h"

// Inlined (the header's own implementation, the same function as the
// library's): the ledger checksums a 40-byte record for every session opened
// and closed, and the library's call took about 150 instructions a record.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>

namespace tandem::base {

std::uint64_t hash64(std::string_view s) { return XXH64(s.data(), s.size(), 0); }

namespace {
// 0 is reserved ("no session", "no kind"): the one hash that is 0 maps to 1.
std::uint64_t nonzero(std::uint64_t h) { return h == kNoSession ? 1 : h; }
}  // namespace

std::uint64_t session_id(std::string_view name) { return nonzero(hash64(name)); }

std::uint64_t tool_kind_id(std::string_view name) { return session_id(name); }

std::uint64_t principal_tool_kind(std::uint32_t principal, std::uint64_t kind) {
  if (kind == 0) return 0;
  unsigned char bytes[sizeof kind + sizeof principal];
  std::memcpy(bytes, &kind, sizeof kind);
  std::memcpy(bytes + sizeof kind, &principal, sizeof principal);
  return nonzero(XXH64(bytes, sizeof bytes, 0));
}

}  // namespace tandem::base
