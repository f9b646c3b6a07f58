// Stable 64-bit identifiers from strings.
//
// A session id is xxh64(name, seed 0), so every process that knows a session's
// name (runner, engine, tandemctl) derives the same id without asking anyone.
// 0 is reserved for "no session" on the wire: the one name that hashes to 0
// maps to 1 instead. Tool kinds ("pytest", "Read") are hashed the same way.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem::base {

inline constexpr std::uint64_t kNoSession = 0;

// xxh64 of the bytes of `s` with seed 0.
std::uint64_t hash64(std::string_view s);

// Non-zero id for a session name.
std::uint64_t session_id(std::string_view name);

// Non-zero id for a tool kind (the tool's name).
std::uint64_t tool_kind_id(std::string_view name);

// The kind `kind` as reported by principal `principal` (tandemd: the
// runner's uid): xxh64 of both, non-zero, so that the same name reported by
// two principals is two kinds. 0 (no kind) stays 0.
std::uint64_t principal_tool_kind(std::uint32_t principal, std::uint64_t kind);

}  // namespace tandem::base
