// Request parsing, token arithmetic and replies of the emulator's HTTP API.
#include "testbed/prompt.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/text.h"

namespace tandem::testbed {
namespace {

using nlohmann::json;

std::unexpected<RequestError> bad(std::string field, std::string message) {
  return std::unexpected(RequestError{std::move(field), std::move(message)});
}

// An integer field in [lo, hi]; `out` untouched when absent.
std::expected<void, RequestError> get_uint(const json& body, const char* field, std::uint64_t lo, std::uint64_t hi,
                                           std::uint32_t& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_number_integer()) return bad(field, std::string("'") + field + "' must be an integer");
  const bool negative = it->is_number_integer() && !it->is_number_unsigned() && it->get<std::int64_t>() < 0;
  const std::uint64_t v = negative ? 0 : it->get<std::uint64_t>();
  if (negative || v < lo || v > hi) {
    return bad(field,
               std::string("'") + field + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  }
  out = static_cast<std::uint32_t>(v);
  return {};
}

std::expected<void, RequestError> get_bool(const json& body, const char* field, bool& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_boolean()) return bad(field, std::string("'") + field + "' must be a boolean");
  out = it->get<bool>();
  return {};
}

// The text of a chat message's content: a string or an array of parts with "text".
std::expected<void, RequestError> append_content(const json& content, std::size_t i, std::string& out) {
  const std::string field = "messages[" + std::to_string(i) + "].content";
  if (content.is_string()) {
    out += content.get_ref<const std::string&>();
    return {};
  }
  if (content.is_array()) {
    for (const json& part : content) {
      auto t = part.is_object() ? part.find("text") : part.end();
      if (!part.is_object() || t == part.end() || !t->is_string()) {
        return bad(field, "'" + field + "' parts must be objects with a string 'text'");
      }
      out += t->get_ref<const std::string&>();
    }
    return {};
  }
  return bad(field, "'" + field + "' must be a string or an array of text parts");
}

json usage_json(const ReplyInfo& info) {
  return {{"prompt_tokens", info.prompt_tokens},
          {"completion_tokens", info.completion_tokens},
          {"total_tokens", info.prompt_tokens + info.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", info.cached_tokens}}}};
}

// Total: invalid UTF-8 (a byte-level token, a client's string) becomes U+FFFD.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::uint32_t count_tokens(std::string_view text) {
  const std::uint64_t t = (static_cast<std::uint64_t>(text.size()) + 3) / 4;
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(t, 1, std::numeric_limits<std::uint32_t>::max()));
}

std::string filler_text(std::uint32_t tokens) {
  std::string s;
  s.reserve(static_cast<std::size_t>(tokens) * kFillerToken.size());
  for (std::uint32_t i = 0; i < tokens; ++i) s += kFillerToken;
  return s;
}

std::uint64_t tool_kind_of(const CompletionRequest& r) {
  return r.tool_follows && !r.tool.empty() ? base::tool_kind_id(r.tool) : 0;
}

std::expected<CompletionRequest, RequestError> parse_request(std::string_view body, bool chat,
                                                             const RequestLimits& limits) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("body", "the request body is not valid JSON");
  if (!j.is_object()) return bad("body", "the request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (chat) {
    auto m = j.find("messages");
    if (m == j.end()) return bad("messages", "'messages' is required");
    if (!m->is_array() || m->empty()) return bad("messages", "'messages' must be a non-empty array");
    for (std::size_t i = 0; i < m->size(); ++i) {
      const json& msg = (*m)[i];
      auto c = msg.is_object() ? msg.find("content") : msg.end();
      if (!msg.is_object() || c == msg.end()) {
        const std::string field = "messages[" + std::to_string(i) + "].content";
        return bad(field, "'" + field + "' is required");
      }
      if (c->is_null()) continue;  // e.g. an assistant message that only called a tool
      if (auto ok = append_content(*c, i, r.prompt); !ok) return std::unexpected(ok.error());
    }
  } else {
    auto p = j.find("prompt");
    if (p == j.end()) return bad("prompt", "'prompt' is required");
    if (!p->is_string()) return bad("prompt", "'prompt' must be a string");
    r.prompt = p->get<std::string>();
  }
  if (auto s = j.find("session_id"); s != j.end() && !s->is_null()) {
    if (!s->is_string() || s->get_ref<const std::string&>().empty()) {
      return bad("session_id", "'session_id' must be a non-empty string");
    }
    if (const char* problem = base::name_problem(s->get_ref<const std::string&>())) {
      return bad("session_id", std::string("'session_id' is not a valid session name: ") + problem);
    }
    r.session_name = s->get<std::string>();
  }
  const std::uint32_t max_len = limits.max_model_len;
  if (auto ok = get_uint(j, "max_tokens", 1, max_len, r.max_tokens); !ok) return std::unexpected(ok.error());
  if (auto ok = get_bool(j, "stream", r.stream); !ok) return std::unexpected(ok.error());
  if (auto ok = get_bool(j, "tool_follows", r.tool_follows); !ok) return std::unexpected(ok.error());
  if (auto ok = get_bool(j, "ignore_eos", r.ignore_eos); !ok) return std::unexpected(ok.error());
  if (auto t = j.find("tool"); t != j.end() && !t->is_null()) {
    if (!t->is_string() || t->get_ref<const std::string&>().empty() ||
        t->get_ref<const std::string&>().size() > base::kMaxToolNameBytes) {
      return bad("tool", "'tool' must be a tool name of 1 to " + std::to_string(base::kMaxToolNameBytes) + " bytes");
    }
    r.tool = t->get<std::string>();
  }
  if (auto t = j.find("temperature"); t != j.end() && !t->is_null()) {
    if (!t->is_number() || !(t->get<double>() >= 0.0) || t->get<double>() > 2.0) {
      return bad("temperature", "'temperature' must be a number between 0 and 2");
    }
    r.temperature = t->get<double>();
  }
  if (auto sd = j.find("seed"); sd != j.end() && !sd->is_null()) {
    if (!sd->is_number_integer()) return bad("seed", "'seed' must be an integer");
    r.seed = sd->is_number_unsigned() ? sd->get<std::uint64_t>() : static_cast<std::uint64_t>(sd->get<std::int64_t>());
  }
  r.prompt_tokens = count_tokens(r.prompt);
  if (j.contains("prompt_tokens") && !j["prompt_tokens"].is_null()) {
    if (auto ok = get_uint(j, "prompt_tokens", 1, max_len, r.prompt_tokens); !ok) return std::unexpected(ok.error());
    r.prompt_tokens_given = true;
  }
  if (auto ok = check_context(r, limits); !ok) return std::unexpected(ok.error());
  return r;
}

std::expected<void, RequestError> check_context(const CompletionRequest& r, const RequestLimits& limits) {
  const std::uint32_t max_len = limits.max_model_len;
  const std::uint64_t context = static_cast<std::uint64_t>(r.prompt_tokens) + r.max_tokens;
  const char* prompt_field = r.prompt_tokens_given ? "prompt_tokens" : (r.chat ? "messages" : "prompt");
  if (r.prompt_tokens >= max_len) {
    return bad(prompt_field, "the prompt is " + std::to_string(r.prompt_tokens) + " tokens; the model's context is " +
                                 std::to_string(max_len));
  }
  if (context > max_len) {
    return bad("max_tokens", "prompt (" + std::to_string(r.prompt_tokens) + " tokens) + 'max_tokens' (" +
                                 std::to_string(r.max_tokens) + ") exceeds the model's context of " +
                                 std::to_string(max_len) + " tokens");
  }
  if (limits.total_blocks != 0 && limits.block_size != 0 &&
      (context + limits.block_size - 1) / limits.block_size > limits.total_blocks) {
    return bad("max_tokens", "prompt + 'max_tokens' (" + std::to_string(context) + " tokens) needs more than the " +
                                 std::to_string(limits.total_blocks) + " KV blocks of the pool");
  }
  return {};
}

std::uint32_t common_prefix_tokens(std::string_view a, std::string_view b) {
  const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  const auto common = static_cast<std::size_t>(mismatch.first - a.begin());
  std::size_t tokens = common / 4;
  // The last, partial token is the same token only if both texts end there.
  if (common == a.size() && common == b.size() && common % 4 != 0) ++tokens;
  return static_cast<std::uint32_t>(std::min<std::size_t>(tokens, std::numeric_limits<std::uint32_t>::max()));
}

std::uint32_t shared_prefix(const SessionHistory& h, const CompletionRequest& r) {
  if (!h.has_previous) return 0;
  if (r.prompt_tokens_given) {
    if (!r.prompt.starts_with(h.prompt) || r.prompt_tokens < h.prompt_tokens) return 0;
    return std::min(r.prompt_tokens, h.context_tokens);
  }
  return std::min(r.prompt_tokens, common_prefix_tokens(r.prompt, h.context));
}

void advance_history(SessionHistory& h, const CompletionRequest& r, std::uint32_t output_tokens) {
  h.has_previous = true;
  h.prompt = r.prompt;
  h.context = r.prompt + filler_text(output_tokens);
  h.prompt_tokens = r.prompt_tokens;
  h.context_tokens = r.prompt_tokens + output_tokens;
}

std::string completion_reply(const CompletionRequest& r, const ReplyInfo& info, std::string_view text,
                             std::string_view finish_reason) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  if (r.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json out = {{"id", info.id},
              {"object", r.chat ? "chat.completion" : "text_completion"},
              {"created", info.created},
              {"model", info.model},
              {"choices", json::array({choice})},
              {"usage", usage_json(info)}};
  if (!info.session.empty()) out["session_id"] = info.session;
  return dump(out);
}

std::string stream_chunk(const CompletionRequest& r, const ReplyInfo& info, std::uint32_t index, std::string_view piece,
                         bool last, std::string_view finish_reason) {
  json choice = {{"index", 0}, {"finish_reason", last ? json(finish_reason) : json(nullptr)}};
  if (r.chat) {
    json delta = {{"content", piece}};
    if (index == 0) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = piece;
  }
  json out = {{"id", info.id},
              {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", info.created},
              {"model", info.model},
              {"choices", json::array({choice})}};
  if (last) out["usage"] = usage_json(info);
  return dump(out);
}

std::string error_reply(std::string_view message, std::string_view type, std::string_view param) {
  json e = {{"message", message}, {"type", type}, {"code", nullptr}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  return dump(json{{"error", e}});
}

std::expected<void, RequestError> apply_session_headers(CompletionRequest& r,
                                                        const std::vector<std::string>& session_token,
                                                        const std::vector<std::string>& dynamo_session) {
  // The body's session_id, then Dynamo's header, then llm-d's: the first one
  // given is the key, and only it is checked. llm-d's session-affinity
  // scorer fills x-session-token with the pod it picked, not the
  // conversation, so it comes last and never overrides a key the client
  // chose (docs/testbed.md "Sessions").
  if (!r.session_name.empty()) return {};
  for (const auto& [header, values] :
       {std::pair<std::string_view, const std::vector<std::string>*>{kDynamoSessionHeader, &dynamo_session},
        {kSessionTokenHeader, &session_token}}) {
    if (values->empty()) continue;
    if (values->size() > 1) {
      return bad(std::string(header), "header '" + std::string(header) + "' is given more than once");
    }
    if (const char* problem = base::name_problem(values->front())) {
      return bad(std::string(header), "header '" + std::string(header) + "' is not a valid session name: " + problem);
    }
    r.session_name = values->front();
    return {};
  }
  return {};
}

std::vector<std::int32_t> emulated_tokens(std::string_view prompt, std::uint32_t prompt_tokens) {
  std::vector<std::int32_t> out(prompt_tokens, 0);
  for (std::size_t i = 0; i < out.size() && 4 * i < prompt.size(); ++i) {
    std::uint32_t v = 0;
    for (std::size_t b = 0; b < 4 && 4 * i + b < prompt.size(); ++b) {
      v |= static_cast<std::uint32_t>(static_cast<unsigned char>(prompt[4 * i + b])) << (8 * b);
    }
    out[i] = static_cast<std::int32_t>(v);
  }
  return out;
}

std::vector<std::uint64_t> block_hashes(std::span<const std::int32_t> tokens, std::uint32_t block_size) {
  std::vector<std::uint64_t> out;
  if (block_size == 0) return out;
  const std::size_t blocks = tokens.size() / block_size;
  out.reserve(blocks);
  std::string bytes(8 + std::size_t{block_size} * 4, '\0');
  std::uint64_t parent = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(parent >> (8 * i));
    for (std::size_t t = 0; t < block_size; ++t) {
      const auto v = static_cast<std::uint32_t>(tokens[b * block_size + t]);
      for (std::size_t i = 0; i < 4; ++i) bytes[8 + 4 * t + i] = static_cast<char>(v >> (8 * i));
    }
    parent = base::hash64(bytes);
    out.push_back(parent);
  }
  return out;
}

}  // namespace tandem::testbed
