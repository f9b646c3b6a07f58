// xxh64-based ids.
#include "base/ids.h"

#include <xxhash.h>

namespace tandem::base {

std::uint64_t hash64(std::string_view s) { return XXH64(s.data(), s.size(), 0); }

std::uint64_t session_id(std::string_view name) {
  std::uint64_t h = hash64(name);
  return h == kNoSession ? 1 : h;
}

std::uint64_t tool_kind_id(std::string_view name) { return session_id(name); }

}  // namespace tandem::base
