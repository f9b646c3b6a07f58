// What every C ABI file of libtandem (api.cc, gpu_api.cc, streamer_api.cc)
// needs for the conventions of tandem.h: reading and writing a caller's
// sz-versioned struct, and turning exceptions into -errno with a message.
// Internal; never installed. Thread-safety: free functions.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>
#include <utility>

#include <fmt/format.h>

namespace tandem::client {

// Reads a caller's sized struct: at least `min_size` bytes must be there, a
// shorter (older) struct leaves the fields it lacks zero, a longer (newer)
// one is read up to what we know.
template <class T>
bool read_sized(const T* in, std::size_t min_size, T& out) {
  if (in->sz < min_size) return false;
  out = T{};
  std::memcpy(static_cast<void*>(&out), static_cast<const void*>(in), std::min(in->sz, sizeof(T)));
  out.sz = sizeof(T);
  return true;
}

// Writes `out` into a caller's sized struct: an older, shorter one gets what
// fits, and its sz says how much was written.
template <class T>
void write_sized(T* ret, const T& out) {
  const std::size_t n = std::min(ret->sz, sizeof out);
  std::memcpy(static_cast<void*>(ret), static_cast<const void*>(&out), n);
  ret->sz = n;
}

// Runs `f`; std::bad_alloc → fail(ENOMEM, "<function>: out of memory"),
// anything else → fail(EIO, "<function>: internal error"), where `fail`
// records the message on a handle and returns -errno. A message that cannot
// be allocated either still leaves the code.
template <class Fail, class F>
int run_guarded(const char* function, Fail&& fail, F&& f) noexcept {
  try {
    return std::forward<F>(f)();
  } catch (const std::bad_alloc&) {
    try {
      return fail(ENOMEM, fmt::format("{}: out of memory", function));
    } catch (...) {  // NOLINT(bugprone-empty-catch): no memory for the message either
      return -ENOMEM;
    }
  } catch (...) {
    try {
      return fail(EIO, fmt::format("{}: internal error", function));
    } catch (...) {  // NOLINT(bugprone-empty-catch)
      return -EIO;
    }
  }
}

}  // namespace tandem::client
