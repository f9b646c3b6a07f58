// The HTTP routes.
#include "testbed/http_api.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <random>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace tandem::testbed {
namespace {

constexpr auto kWaitSlice = std::chrono::milliseconds(500);

void send_error(httplib::Response& res, int status, std::string_view message, std::string_view type,
                std::string_view param = {}) {
  res.status = status;
  res.set_content(error_reply(message, type, param), "application/json");
}

std::string request_id(bool chat) {
  static std::atomic<std::uint64_t> next{1};
  static const std::uint32_t kSalt = std::random_device{}();
  return fmt::format("{}-{:08x}{:08x}", chat ? "chatcmpl" : "cmpl", kSalt, next.fetch_add(1));
}

ReplyInfo reply_info(const Job& job, const Job::Progress& p, std::string_view model) {
  ReplyInfo info;
  info.id = job.id();
  info.created = job.created();
  info.model = model;
  info.prompt_tokens = job.request().prompt_tokens;
  info.completion_tokens = p.tokens;
  info.cached_tokens = p.cached_tokens;
  info.session = job.request().session_name;
  return info;
}

void complete(const httplib::Request& req, httplib::Response& res, CompletionEngine& emu, bool chat) {
  auto parsed = parse_request(req.body, chat, emu.limits());
  if (parsed) {
    auto values = [&](std::string_view name) {
      std::vector<std::string> out;
      const std::string key(name);
      const std::size_t n = req.get_header_value_count(key);
      out.reserve(n);
      for (std::size_t i = 0; i < n; ++i) out.push_back(req.get_header_value(key, i));
      return out;
    };
    if (auto ok = apply_session_headers(*parsed, values(kSessionTokenHeader), values(kDynamoSessionHeader)); !ok) {
      parsed = std::unexpected(ok.error());
    }
  }
  if (parsed) {
    if (auto ok = emu.prepare(*parsed); !ok) parsed = std::unexpected(ok.error());
  }
  if (!parsed) {
    send_error(res, 400, parsed.error().message, "invalid_request_error", parsed.error().field);
    return;
  }
  auto job = std::make_shared<Job>(std::move(*parsed), request_id(chat), static_cast<std::int64_t>(std::time(nullptr)));
  switch (emu.submit(job)) {
    case SubmitStatus::kQueued:
      break;
    case SubmitStatus::kBusy:
      send_error(res, 409,
                 fmt::format("session '{}' already has a round in flight; send its next round after this one ends",
                             job->request().session_name),
                 "invalid_request_error", "session_id");
      return;
    case SubmitStatus::kDraining:
      send_error(res, 503, "the engine is shutting down", "server_error");
      return;
  }
  const std::string model(emu.model());
  if (!job->request().stream) {
    base::MonotonicClock clock;
    Job::Progress p;
    do {
      p = job->wait(job->request().max_tokens, clock.now() + kWaitSlice);
    } while (!p.done && p.status == 0);
    if (p.status != 0) {
      send_error(res, p.status, p.error, "server_error");
      return;
    }
    res.set_content(
        completion_reply(job->request(), reply_info(*job, p, model), job->text(0, p.tokens), p.finish_reason),
        "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  struct Stream {
    std::uint32_t sent = 0;    // tokens sent
    bool finish_sent = false;  // a chunk carried finish_reason
  };
  auto st = std::make_shared<Stream>();
  res.set_chunked_content_provider(
      "text/event-stream", [job, st, model](std::size_t /*offset*/, httplib::DataSink& sink) {
        base::MonotonicClock clock;
        const Job::Progress p = job->wait(st->sent, clock.now() + kWaitSlice);
        if (!sink.is_writable()) return false;  // the client left; the round runs to its end regardless
        const ReplyInfo info = reply_info(*job, p, model);
        const std::uint32_t max = job->request().max_tokens;
        auto send = [&](std::string_view piece, bool last) {
          const std::string event =
              "data: " + stream_chunk(job->request(), info, st->sent, piece, last, p.finish_reason) + "\n\n";
          st->finish_sent = st->finish_sent || last;
          return sink.write(event.data(), event.size());
        };
        // The token that reaches max_tokens carries finish_reason; a round
        // that stops earlier (an end-of-generation token) gets an empty
        // closing chunk once it is done.
        for (; st->sent < p.tokens; ++st->sent) {
          const bool last = st->sent + 1 == max || (p.done && st->sent + 1 == p.tokens);
          if (!send(job->text(st->sent, st->sent + 1), last)) return false;
        }
        if (p.done && !st->finish_sent && !send("", true)) return false;
        if (p.status != 0) {
          const std::string event = "data: " + error_reply(p.error, "server_error") + "\n\n";
          if (!sink.write(event.data(), event.size())) return false;
        }
        if (p.done || p.status != 0) {
          static constexpr std::string_view kDone = "data: [DONE]\n\n";
          if (!sink.write(kDone.data(), kDone.size())) return false;
          sink.done();
        }
        return true;
      });
}

}  // namespace

void install_routes(httplib::Server& server, CompletionEngine& emu) {
  server.Post("/v1/completions",
              [&emu](const httplib::Request& req, httplib::Response& res) { complete(req, res, emu, false); });
  server.Post("/v1/chat/completions",
              [&emu](const httplib::Request& req, httplib::Response& res) { complete(req, res, emu, true); });
  server.Get("/v1/models", [&emu](const httplib::Request& /*req*/, httplib::Response& res) {
    const nlohmann::json m = {{"object", "list"},
                              {"data", nlohmann::json::array({{{"id", emu.model()},
                                                               {"object", "model"},
                                                               {"created", 0},
                                                               {"owned_by", "tandem"},
                                                               {"max_model_len", emu.limits().max_model_len}}})}};
    res.set_content(m.dump(), "application/json");
  });
  server.Get("/health", [&emu](const httplib::Request& /*req*/, httplib::Response& res) {
    const nlohmann::json h = {{"status", "ok"}, {"connected", emu.connected()}};
    res.set_content(h.dump(), "application/json");
  });
  server.Get("/stats", [&emu](const httplib::Request& /*req*/, httplib::Response& res) {
    res.set_content(emu.stats_json(), "application/json");
  });
  // Errors httplib raises itself (unknown path, wrong method): an OpenAI-style body.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 404 ? fmt::format("no route for {} {}", req.method, req.path)
                                              : fmt::format("HTTP {}", res.status);
    res.set_content(error_reply(msg, "invalid_request_error"), "application/json");
  });
}

}  // namespace tandem::testbed
