#include "testbed/http_send.h"

#include <chrono>
#include <memory>
#include <utility>

namespace tandem::testbed {

SendOutcome send_fresh_if_stale(httplib::Client& client, httplib::Request req, const std::atomic<bool>* stop) {
  // The flag lives on the heap so the copy of the handler in each send sees
  // the same one.
  auto began = std::make_shared<bool>(false);
  httplib::ResponseHandler inner = std::move(req.response_handler);
  req.response_handler = [began, inner](const httplib::Response& response) {
    *began = true;
    return inner ? inner(response) : true;
  };
  const auto sent_at = std::chrono::steady_clock::now();
  SendOutcome out{client.send(req), false};
  // A close that crossed the request fails it at once; a read that failed
  // later (a timeout, an engine that died while serving) may have been
  // served, and is not sent again.
  const bool at_once = std::chrono::steady_clock::now() - sent_at < kStaleWithin;
  const bool stale =
      !out.result && !*began && (stop == nullptr || !stop->load()) &&
      (out.result.error() == httplib::Error::Write || (out.result.error() == httplib::Error::Read && at_once));
  if (stale) {
    out.resent = true;
    out.result = client.send(req);
  }
  return out;
}

}  // namespace tandem::testbed
