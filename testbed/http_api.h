// tandem-engine-emu's OpenAI-style HTTP routes (docs/testbed.md "HTTP API"):
// /v1/completions, /v1/chat/completions (plain and SSE streaming),
// /v1/models, /health, /stats. Handlers run on cpp-httplib's worker threads;
// each completion becomes a Job handed to the Emulator, and the worker waits
// on it (streams send one SSE event per token as the engine's steps end).
#pragma once

#include <httplib.h>

#include "testbed/emulator.h"

namespace tandem::testbed {

// Installs the routes on `server`; `emu` must outlive it.
void install_routes(httplib::Server& server, Emulator& emu);

}  // namespace tandem::testbed
