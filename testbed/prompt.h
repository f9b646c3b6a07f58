// Requests and replies of tandem-engine-emu's OpenAI-style HTTP API, as pure
// functions of strings (docs/testbed.md "HTTP API"): parsing and validating a
// completion request, counting tokens, the prefix a round shares with its
// session's previous context, and the JSON replies.
//
// Tokens: the emulator has no tokenizer. A text is ceil(bytes / 4) tokens (at
// least 1), token i being bytes [4i, 4i + 4). Generated text is " tok" per
// token, exactly four bytes, so a session's context (prompt + output) keeps
// the same token boundaries as its prompt.
#pragma once

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::testbed {

inline constexpr std::string_view kFillerToken = " tok";
inline constexpr std::uint32_t kDefaultMaxTokens = 16;

// ceil(bytes / 4), at least 1.
std::uint32_t count_tokens(std::string_view text);
// The generated text of `tokens` tokens.
std::string filler_text(std::uint32_t tokens);

// What the engine can take, for validation.
struct RequestLimits {
  std::uint32_t max_model_len = 131072;
  std::uint32_t block_size = 16;
  std::uint32_t total_blocks = 0;  // 0: not checked
};

// One parsed /v1/completions or /v1/chat/completions request.
struct CompletionRequest {
  bool chat = false;
  std::string session_name;  // empty: a fresh session for this request
  std::string prompt;        // chat: the messages' contents concatenated
  std::uint32_t prompt_tokens = 0;
  bool prompt_tokens_given = false;  // from the `prompt_tokens` extension, not counted
  std::uint32_t max_tokens = kDefaultMaxTokens;
  bool stream = false;
  bool tool_follows = true;
  // The tool this round's output calls (the `tool` extension): a real
  // engine reads it from the tool call it generated; these engines' outputs
  // are not real text, so the agent names it. Empty: not known. Step
  // policies learn tool durations per kind (base::tool_kind_id of this).
  std::string tool;
  // Sampling, for engines that generate real tokens (tandem-llama; the
  // emulator ignores them): temperature 0 is greedy; `seed` fixes the draws
  // (0: a random one); ignore_eos generates max_tokens even past an
  // end-of-generation token (vLLM's extension of the same name).
  double temperature = 1.0;
  std::uint64_t seed = 0;
  bool ignore_eos = false;
  // The prompt's token ids, filled by the engine's tokenizer
  // (CompletionEngine::prepare); empty for the emulator.
  std::vector<std::int32_t> tokens;
};

// The kind of the tool that follows the request's round, as the engine
// reports it at the round's end (tandem_round_end_info.tool_kind):
// base::tool_kind_id of `tool`, 0 when no tool follows or none is named.
std::uint64_t tool_kind_of(const CompletionRequest& r);

// Why a request is refused: the field it names and a message for the client.
struct RequestError {
  std::string field;
  std::string message;
};

// Parses and validates a request body. Errors name the field: bad JSON
// ("body"), missing or mistyped fields, max_tokens outside 1..max_model_len,
// a context (prompt + max_tokens) longer than max_model_len or than the pool.
std::expected<CompletionRequest, RequestError> parse_request(std::string_view body, bool chat,
                                                             const RequestLimits& limits);

// Session affinity headers routers set (docs/testbed.md "Sessions"):
// llm-d's and NVIDIA Dynamo's. Lower case: HTTP header names are compared
// without case.
inline constexpr std::string_view kSessionTokenHeader = "x-session-token";
inline constexpr std::string_view kDynamoSessionHeader = "x-dynamo-session-id";

// The request's session key from its body's session_id and the headers'
// values (each given as many times as it was sent), in this order of
// precedence: session_id, X-Dynamo-Session-ID, x-session-token. The first
// one given becomes r.session_name and must be a valid session name
// (base::name_problem: 1..256 bytes of UTF-8 without control characters),
// as session_id must; a winning header sent twice is refused. The others
// are ignored: llm-d's x-session-token names the pod its router picked, so
// a client's own key must win over it. The field an error names: the
// header's name.
std::expected<void, RequestError> apply_session_headers(CompletionRequest& r,
                                                        const std::vector<std::string>& session_token,
                                                        const std::vector<std::string>& dynamo_session);

// The context checks of parse_request on `r.prompt_tokens` as it is now (an
// engine with a tokenizer checks again once it has counted the real tokens).
std::expected<void, RequestError> check_context(const CompletionRequest& r, const RequestLimits& limits);

// Token i of a text is bytes [4i, 4i + 4): the leading tokens `a` and `b`
// have in common. A final partial token counts when both texts end there.
std::uint32_t common_prefix_tokens(std::string_view a, std::string_view b);

// A session's previous round, for prefix sharing.
struct SessionHistory {
  bool has_previous = false;
  std::string prompt;   // previous prompt text
  std::string context;  // previous prompt + its generated text
  std::uint32_t prompt_tokens = 0;
  std::uint32_t context_tokens = 0;  // prompt_tokens + output tokens
};

// Tokens of `r`'s prompt equal to the session's previous context. Counted
// prompts compare the texts token by token. A prompt with `prompt_tokens`
// given shares the whole previous context (capped at its own length) when its
// text extends the previous prompt's and it is no shorter — the simulator's
// rule for agent rounds that append to their context — and nothing otherwise.
std::uint32_t shared_prefix(const SessionHistory& h, const CompletionRequest& r);
// The history after `r` generated `output_tokens`.
void advance_history(SessionHistory& h, const CompletionRequest& r, std::uint32_t output_tokens);

// The emulator's token ids of a prompt: token i is bytes [4i, 4i + 4) of the
// text as a little-endian integer, 0 past the text (a prompt whose
// `prompt_tokens` was given may be longer than its text).
std::vector<std::int32_t> emulated_tokens(std::string_view prompt, std::uint32_t prompt_tokens);

// The chained hashes of the full blocks of `tokens`, for KV events
// (tandem_kv_blocks_report): block b's hash is xxh64 of the previous block's
// hash (8 bytes, little-endian; 0 before the first) followed by its
// `block_size` token ids (4 bytes each, little-endian). Like vLLM's, equal
// prefixes give equal hashes; unlike vLLM's (sha256 of CBOR), they are not
// meant to be recomputed by a router.
std::vector<std::uint64_t> block_hashes(std::span<const std::int32_t> tokens, std::uint32_t block_size);

// Replies (JSON text; text that is not valid UTF-8, as a token of a byte-level
// vocabulary can be, is replaced with U+FFFD, never thrown on).
// `cached_tokens` is the prefix-cache hit of the round, `completion_tokens`
// what it generated.
struct ReplyInfo {
  std::string id;
  std::int64_t created = 0;  // Unix seconds
  std::string_view model;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t completion_tokens = 0;
  std::uint32_t cached_tokens = 0;
  std::string_view session;
};
std::string completion_reply(const CompletionRequest& r, const ReplyInfo& info, std::string_view text,
                             std::string_view finish_reason = "length");
// One SSE event's JSON for token `index` (0-based) with its text `piece`;
// the last one (`last`) carries finish_reason and usage.
std::string stream_chunk(const CompletionRequest& r, const ReplyInfo& info, std::uint32_t index, std::string_view piece,
                         bool last, std::string_view finish_reason = "length");
// {"error":{"message","type","param","code"}}.
std::string error_reply(std::string_view message, std::string_view type, std::string_view param = {});

}  // namespace tandem::testbed
