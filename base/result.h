// Result<T> and Error: tandem's one error channel.
//
// A fallible function returns Result<T>, which is std::expected<T, Error>
// marked [[nodiscard]] (as a thin subclass, so a dropped result is a compile
// error under -Werror rather than a silent bug). Error carries a positive errno
// value and a context string saying what was being done; callers add context
// on the way up with Error::wrap(). Nothing in tandem throws across a module
// boundary; invariants are asserts.
#pragma once

#include <cerrno>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace tandem::base {

// Thread-safety: a value type; distinct instances may be used concurrently.
class Error {
 public:
  Error(int code, std::string context) : code_(code), context_(std::move(context)) {}

  // The errno value (always > 0).
  int code() const { return code_; }
  // What failed, innermost detail last: "attach segment: header: bad magic".
  const std::string& context() const { return context_; }
  // "<context>: <strerror(code)>".
  std::string message() const;

  // Prefixes the context with `outer` ("outer: inner").
  Error wrap(std::string_view outer) &&;

 private:
  int code_;
  std::string context_;
};

template <class T>
class [[nodiscard]] Result : public std::expected<T, Error> {
 public:
  using std::expected<T, Error>::expected;
  // From a plain std::expected (e.g. one built by generic code).
  Result(std::expected<T, Error>&& e) : std::expected<T, Error>(std::move(e)) {}  // NOLINT(google-explicit-constructor)
};

// An error value to return from a function returning Result<T>.
inline std::unexpected<Error> make_error(int code, std::string context) {
  return std::unexpected<Error>(Error(code, std::move(context)));
}

// An error carrying the current errno; call immediately after the failed call.
inline std::unexpected<Error> errno_error(std::string context) {
  int code = errno;
  return make_error(code > 0 ? code : EIO, std::move(context));
}

// Passes an error up unchanged, optionally with more context.
inline std::unexpected<Error> propagate(Error e) { return std::unexpected<Error>(std::move(e)); }
inline std::unexpected<Error> propagate(Error e, std::string_view outer) {
  return std::unexpected<Error>(std::move(e).wrap(outer));
}

}  // namespace tandem::base
