// What the OpenAI-style HTTP front (testbed/http_api.h) shares with the
// engines behind it, tandem-engine-emu and tandem-llama (engines/llama): a
// round in flight (Job) and the interface an engine offers the front
// (CompletionEngine).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "testbed/prompt.h"

namespace tandem::testbed {

using base::Duration;
using base::Time;

// One HTTP request's round, shared by the HTTP worker that waits on it and
// the engine thread that fills it. Thread-safety: the request fields are
// immutable once submitted; the progress fields are behind `mu_`.
class Job {
 public:
  Job(CompletionRequest request, std::string id, std::int64_t created)
      : request_(std::move(request)), id_(std::move(id)), created_(created) {}

  const CompletionRequest& request() const { return request_; }
  const std::string& id() const { return id_; }
  std::int64_t created() const { return created_; }

  struct Progress {
    std::uint32_t tokens = 0;         // generated so far
    std::uint32_t cached_tokens = 0;  // prefix-cache hit when the round was scheduled
    bool done = false;                // all tokens generated
    int status = 0;                   // non-zero: failed with this HTTP status
    std::string error;
    std::string session;                   // the session's name
    std::string finish_reason = "length";  // "length", or "stop" at an end-of-generation token
  };
  // Waits until more than `seen` tokens exist, the job ends, or `deadline`.
  Progress wait(std::uint32_t seen, Time deadline) const;
  // The text of generated tokens [from, to): the pieces an engine with a
  // tokenizer added, else the emulator's filler (" tok" per token).
  std::string text(std::uint32_t from, std::uint32_t to) const;

  // Engine thread.
  void set_session(std::string name);
  void set_cached(std::uint32_t cached);
  void add_tokens(std::uint32_t total);  // the emulator: counts only
  void add_piece(std::string piece);     // an engine with a tokenizer: one token's text
  void finish(std::string_view reason = "length");
  void fail(int status, std::string message);

 private:
  const CompletionRequest request_;
  const std::string id_;
  const std::int64_t created_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Progress p_;
  std::vector<std::string> pieces_;  // one per token, when the engine gives text
};

enum class SubmitStatus {
  kQueued,
  kBusy,      // a round of this session is in flight
  kDraining,  // shutting down
};

// An engine behind the HTTP front. Thread-safety: every call may come from
// any HTTP worker thread at once.
class CompletionEngine {
 public:
  virtual ~CompletionEngine() = default;
  // What a request may ask for (validated by parse_request).
  virtual RequestLimits limits() const = 0;
  // Completes a parsed request with what only the engine knows (its
  // tokenizer's token ids and count); an error answers 400 naming the field.
  virtual std::expected<void, RequestError> prepare(CompletionRequest& /*r*/) const { return {}; }
  virtual SubmitStatus submit(std::shared_ptr<Job> job) = 0;
  virtual std::string stats_json() const = 0;  // GET /stats
  virtual bool connected() const = 0;          // to tandemd, for GET /health
  virtual std::string_view model() const = 0;
};

}  // namespace tandem::testbed
