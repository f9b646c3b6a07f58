// The OpenAI-style HTTP routes of tandem-engine-emu and tandem-llama
// (docs/testbed.md "HTTP API"): /v1/completions, /v1/chat/completions (plain
// and SSE streaming), /v1/models, /health, /stats. Handlers run on
// cpp-httplib's worker threads; each completion becomes a Job handed to the
// engine, and the worker waits on it (streams send one SSE event per token
// as the engine's steps end).
#pragma once

#include <httplib.h>

#include "testbed/front.h"

namespace tandem::testbed {

// Installs the routes on `server`; `engine` must outlive it.
void install_routes(httplib::Server& server, CompletionEngine& engine);

}  // namespace tandem::testbed
