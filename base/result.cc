// Error formatting.
#include "base/result.h"

#include <cstring>

namespace tandem::base {

std::string Error::message() const {
  char buf[128];
  // GNU strerror_r returns a pointer that may or may not be `buf`.
  const char* text = strerror_r(code_, buf, sizeof buf);
  std::string out = context_;
  out += ": ";
  out += text;
  return out;
}

Error Error::wrap(std::string_view outer) && {
  std::string joined(outer);
  joined += ": ";
  joined += context_;
  context_ = std::move(joined);
  return std::move(*this);
}

}  // namespace tandem::base
