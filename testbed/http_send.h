// Sending a request on a kept-alive HTTP connection that the server may have
// closed meanwhile (tandem-agents' rounds, docs/replay.md).
//
// An engine closes a keep-alive connection that sat idle past its timeout
// (tandem-engine-emu: 1 s; a tool call ran in between) or that served its
// quota of requests. When that close crosses the client's next request on the
// wire, the request's write fails, or its first read does, and no response
// has begun: the server never read the request. send_fresh_if_stale() sends
// it once more then, on a new connection (httplib reconnects after a failed
// send). A failure after the response began is returned as it is: the engine
// served part of it, and sending it again would serve it twice. So is a read
// that failed after kStaleWithin (a timeout, or an engine that died while it
// served the request).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>

namespace tandem::testbed {

inline constexpr std::chrono::milliseconds kStaleWithin{1000};

struct SendOutcome {
  httplib::Result result;
  bool resent = false;  // the first send met a closed connection
};

// `req.response_handler`, if set, still runs (and may still cancel). Nothing
// is sent again once `*stop` is true (httplib::Client::stop() cuts a request
// the same way a closed connection does).
SendOutcome send_fresh_if_stale(httplib::Client& client, httplib::Request req, const std::atomic<bool>* stop = nullptr);

}  // namespace tandem::testbed
