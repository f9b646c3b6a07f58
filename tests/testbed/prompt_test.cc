// Token counting, prefix sharing, request validation and reply shapes of the
// emulator's HTTP API (testbed/prompt.h).
#include "testbed/prompt.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/text.h"

namespace tandem::testbed {
namespace {

using nlohmann::json;

TEST(Tokens, CeilOfBytesOverFourAtLeastOne) {
  EXPECT_EQ(count_tokens(""), 1u);
  EXPECT_EQ(count_tokens("a"), 1u);
  EXPECT_EQ(count_tokens("abcd"), 1u);
  EXPECT_EQ(count_tokens("abcde"), 2u);
  EXPECT_EQ(count_tokens(std::string(400, 'x')), 100u);
  EXPECT_EQ(filler_text(3), " tok tok tok");
  EXPECT_EQ(count_tokens(filler_text(7)), 7u);
}

TEST(Tokens, CommonPrefixCountsWholeTokens) {
  EXPECT_EQ(common_prefix_tokens("abcdefgh", "abcdefgh"), 2u);
  EXPECT_EQ(common_prefix_tokens("abcdefgX", "abcdefgh"), 1u);
  EXPECT_EQ(common_prefix_tokens("abcdef", "abcdefgh"), 1u);  // "ef" is a partial token of "efgh"
  EXPECT_EQ(common_prefix_tokens("abcdef", "abcdef"), 2u);    // both end there: the same token
  EXPECT_EQ(common_prefix_tokens("xbcd", "abcd"), 0u);
  EXPECT_EQ(common_prefix_tokens("", "abcd"), 0u);
}

RequestLimits limits() { return {.max_model_len = 1024, .block_size = 16, .total_blocks = 100}; }

CompletionRequest parse_ok(std::string_view body, bool chat = false) {
  auto r = parse_request(body, chat, limits());
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().field + ": " + r.error().message);
  return r.value_or(CompletionRequest{});
}

std::string bad_field(std::string_view body, bool chat = false) {
  auto r = parse_request(body, chat, limits());
  if (r) return "(accepted)";
  EXPECT_NE(r.error().message.find(r.error().field == "body" ? "JSON" : r.error().field.substr(0, 8)),
            std::string::npos)
      << r.error().message;
  return r.error().field;
}

TEST(Parse, CompletionDefaults) {
  const CompletionRequest r = parse_ok(R"({"prompt":"hello world!"})");
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.prompt, "hello world!");
  EXPECT_EQ(r.prompt_tokens, 3u);
  EXPECT_EQ(r.max_tokens, kDefaultMaxTokens);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.tool_follows);
  EXPECT_TRUE(r.tool.empty());
  EXPECT_TRUE(r.session_name.empty());
}

TEST(Parse, ToolNamesTheToolTheOutputCalls) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x","tool":"pytest"})").tool, "pytest");
  EXPECT_EQ(tool_kind_of(parse_ok(R"({"prompt":"x","tool":"pytest"})")), base::tool_kind_id("pytest"));
  EXPECT_NE(base::tool_kind_id("pytest"), 0u);
  EXPECT_EQ(tool_kind_of(parse_ok(R"({"prompt":"x"})")), 0u) << "no name: unknown";
  EXPECT_EQ(tool_kind_of(parse_ok(R"({"prompt":"x","tool":"pytest","tool_follows":false})")), 0u)
      << "the session's last round: no tool follows";
  EXPECT_TRUE(parse_ok(R"({"prompt":"x","tool":null})").tool.empty());
  EXPECT_EQ(parse_ok(R"({"prompt":"x","tool":")" + std::string(base::kMaxToolNameBytes, 't') + R"("})").tool.size(),
            base::kMaxToolNameBytes);
}

TEST(Parse, ChatConcatenatesContents) {
  const CompletionRequest r = parse_ok(
      R"({"messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efgh"}]},
          {"role":"assistant","content":null}],"session_id":"s","max_tokens":4,"stream":true,"tool_follows":false})",
      true);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.prompt, "abcdefgh");
  EXPECT_EQ(r.prompt_tokens, 2u);
  EXPECT_EQ(r.session_name, "s");
  EXPECT_EQ(r.max_tokens, 4u);
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.tool_follows);
}

TEST(Parse, PromptTokensOverridesTheCount) {
  const CompletionRequest r = parse_ok(R"({"prompt":"x","prompt_tokens":500})");
  EXPECT_EQ(r.prompt_tokens, 500u);
  EXPECT_TRUE(r.prompt_tokens_given);
}

TEST(Parse, ErrorsNameTheField) {
  EXPECT_EQ(bad_field("{not json"), "body");
  EXPECT_EQ(bad_field("[1,2]"), "body");
  EXPECT_EQ(bad_field(R"({"max_tokens":3})"), "prompt");
  EXPECT_EQ(bad_field(R"({"prompt":7})"), "prompt");
  EXPECT_EQ(bad_field(R"({"prompt":"a","max_tokens":0})"), "max_tokens");
  EXPECT_EQ(bad_field(R"({"prompt":"a","max_tokens":-2})"), "max_tokens");
  EXPECT_EQ(bad_field(R"({"prompt":"a","max_tokens":2.5})"), "max_tokens");
  EXPECT_EQ(bad_field(R"({"prompt":"a","max_tokens":1025})"), "max_tokens");
  EXPECT_EQ(bad_field(R"({"prompt":"a","stream":"yes"})"), "stream");
  EXPECT_EQ(bad_field(R"({"prompt":"a","tool_follows":1})"), "tool_follows");
  EXPECT_EQ(bad_field(R"({"prompt":"a","tool":3})"), "tool");
  EXPECT_EQ(bad_field(R"({"prompt":"a","tool":""})"), "tool");
  EXPECT_EQ(bad_field(R"({"prompt":"a","tool":")" + std::string(base::kMaxToolNameBytes + 1, 't') + R"("})"), "tool");
  EXPECT_EQ(bad_field(R"({"prompt":"a","session_id":5})"), "session_id");
  EXPECT_EQ(bad_field(R"({"prompt":"a","session_id":""})"), "session_id");
  EXPECT_EQ(bad_field(R"({"prompt":"a","session_id":"a\nb"})"), "session_id") << "a control character";
  EXPECT_EQ(bad_field(R"({"prompt":"a","session_id":")" + std::string(257, 's') + R"("})"), "session_id");
  EXPECT_EQ(bad_field(R"({"prompt":"a","prompt_tokens":0})"), "prompt_tokens");
  EXPECT_EQ(bad_field(R"({"prompt":"a","prompt_tokens":1000,"max_tokens":100})"), "max_tokens");
  EXPECT_EQ(bad_field(R"({"prompt":"a"})", true), "messages");
  EXPECT_EQ(bad_field(R"({"messages":[]})", true), "messages");
  EXPECT_EQ(bad_field(R"({"messages":[{"role":"user"}]})", true), "messages[0].content");
  EXPECT_EQ(bad_field(R"({"messages":[{"content":"a"},{"content":3}]})", true), "messages[1].content");
}

TEST(Parse, ContextMustFitThePool) {
  // 100 blocks of 16 tokens: 1600 tokens, more than max_model_len here, so use a smaller pool.
  auto r = parse_request(R"({"prompt":"x","prompt_tokens":100,"max_tokens":100})", false,
                         {.max_model_len = 1024, .block_size = 16, .total_blocks = 10});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().field, "max_tokens");
  EXPECT_NE(r.error().message.find("KV blocks"), std::string::npos);
}

TEST(Prefix, CountedPromptsShareTheirCommonTokens) {
  SessionHistory h;
  CompletionRequest r1 = parse_ok(R"({"prompt":"0123456789ab"})");  // 3 tokens
  EXPECT_EQ(shared_prefix(h, r1), 0u);
  advance_history(h, r1, 2);
  EXPECT_EQ(h.context, "0123456789ab tok tok");
  EXPECT_EQ(h.context_tokens, 5u);
  // Appends to the previous context: shares all of it.
  const CompletionRequest r2 = parse_ok(R"({"prompt":"0123456789ab tok tok and more"})");
  EXPECT_EQ(shared_prefix(h, r2), 5u);
  // Rewrites the middle: shares up to the change.
  const CompletionRequest r3 = parse_ok(R"({"prompt":"01234567XXXX tok tok"})");
  EXPECT_EQ(shared_prefix(h, r3), 2u);
  // A shorter prompt shares no more than itself.
  const CompletionRequest r4 = parse_ok(R"({"prompt":"01234567"})");
  EXPECT_EQ(shared_prefix(h, r4), 2u);
}

TEST(Prefix, GivenTokenCountsShareWhenTheTextExtends) {
  SessionHistory h;
  const CompletionRequest r1 = parse_ok(R"({"prompt":"task","prompt_tokens":300})");
  advance_history(h, r1, 20);
  EXPECT_EQ(h.context_tokens, 320u);
  EXPECT_EQ(shared_prefix(h, parse_ok(R"({"prompt":"task+tool","prompt_tokens":400})")), 320u);
  EXPECT_EQ(shared_prefix(h, parse_ok(R"({"prompt":"task","prompt_tokens":310})")), 310u);
  EXPECT_EQ(shared_prefix(h, parse_ok(R"({"prompt":"task","prompt_tokens":200})")), 0u);  // shorter: rewritten
  EXPECT_EQ(shared_prefix(h, parse_ok(R"({"prompt":"other","prompt_tokens":400})")), 0u);
}

TEST(Requests, SamplingFieldsAreValidated) {
  const CompletionRequest r = parse_ok(R"({"prompt":"x","temperature":0,"seed":7,"ignore_eos":true})");
  EXPECT_EQ(r.temperature, 0.0);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_TRUE(r.ignore_eos);
  const CompletionRequest d = parse_ok(R"({"prompt":"x"})");
  EXPECT_EQ(d.temperature, 1.0);
  EXPECT_FALSE(d.ignore_eos);
  for (const char* bad : {R"({"prompt":"x","temperature":-1})", R"({"prompt":"x","temperature":"hot"})",
                          R"({"prompt":"x","temperature":2.5})"}) {
    auto e = parse_request(bad, false, {});
    ASSERT_FALSE(e) << bad;
    EXPECT_EQ(e.error().field, "temperature");
  }
  auto e = parse_request(R"({"prompt":"x","seed":1.5})", false, {});
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().field, "seed");
  e = parse_request(R"({"prompt":"x","ignore_eos":1})", false, {});
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().field, "ignore_eos");
}

CompletionRequest with_body_session(std::string session) {
  CompletionRequest r;
  r.session_name = std::move(session);
  return r;
}

TEST(SessionHeaders, EachSourceAloneNamesTheSession) {
  using V = std::vector<std::string>;
  CompletionRequest r = with_body_session("body");
  ASSERT_TRUE(apply_session_headers(r, {}, {}));
  EXPECT_EQ(r.session_name, "body");
  r = with_body_session("");
  ASSERT_TRUE(apply_session_headers(r, V{"llm-d"}, {}));
  EXPECT_EQ(r.session_name, "llm-d");
  r = with_body_session("");
  ASSERT_TRUE(apply_session_headers(r, {}, V{"dynamo"}));
  EXPECT_EQ(r.session_name, "dynamo");
  r = with_body_session("");
  ASSERT_TRUE(apply_session_headers(r, {}, {}));
  EXPECT_EQ(r.session_name, "") << "none: a fresh session";
}

TEST(SessionHeaders, TheBodyThenDynamosHeaderThenLlmdsTokenWin) {
  using V = std::vector<std::string>;
  CompletionRequest r = with_body_session("s");
  ASSERT_TRUE(apply_session_headers(r, V{"t"}, V{"d"}));
  EXPECT_EQ(r.session_name, "s");
  r = with_body_session("");
  ASSERT_TRUE(apply_session_headers(r, V{"t"}, V{"d"}));
  EXPECT_EQ(r.session_name, "d");
  r = with_body_session("");
  ASSERT_TRUE(apply_session_headers(r, V{"t"}, {}));
  EXPECT_EQ(r.session_name, "t");
  r = with_body_session("");
  ASSERT_TRUE(apply_session_headers(r, {}, {}));
  EXPECT_EQ(r.session_name, "");
  // What loses is not looked at: a router's odd token does not fail a
  // request that names its session.
  r = with_body_session("");
  ASSERT_TRUE(apply_session_headers(r, V{"a\x01b", "x"}, V{"d"}));
  EXPECT_EQ(r.session_name, "d");
  // The winner sent twice is refused, naming it; nothing changes.
  r = with_body_session("");
  auto e = apply_session_headers(r, {}, V{"d", "e"});
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().field, "x-dynamo-session-id");
  EXPECT_NE(e.error().message.find("more than once"), std::string::npos) << e.error().message;
  EXPECT_EQ(r.session_name, "") << "untouched on error";
}

TEST(SessionHeaders, ValuesAreCheckedAsSessionIdIs) {
  using V = std::vector<std::string>;
  for (const std::string& bad : {std::string(), std::string("a\x01b"), std::string(257, 'x'), std::string("\xff")}) {
    CompletionRequest r;
    auto e = apply_session_headers(r, V{bad}, {});
    ASSERT_FALSE(e) << bad;
    EXPECT_EQ(e.error().field, "x-session-token");
    e = apply_session_headers(r, {}, V{bad});
    ASSERT_FALSE(e) << bad;
    EXPECT_EQ(e.error().field, "x-dynamo-session-id");
  }
  CompletionRequest r;
  auto twice = apply_session_headers(r, V{"a", "a"}, {});
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message.find("more than once"), std::string::npos);
  ASSERT_TRUE(apply_session_headers(r, V{std::string(256, 'x')}, {})) << "256 bytes is the limit";
}

TEST(BlockHashes, ChainedOverFullBlocks) {
  auto hashes = [](std::string_view text, std::uint32_t tokens) {
    return block_hashes(emulated_tokens(text, tokens), 16);
  };
  const auto a = hashes(std::string(400, 'a'), 100);
  ASSERT_EQ(a.size(), 6u) << "100 tokens: 6 full blocks";
  const auto b = hashes(std::string(400, 'a') + "zzzz", 101);
  EXPECT_EQ(b, a) << "the same full blocks";
  const auto c = hashes("b" + std::string(399, 'a'), 100);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_NE(c[i], a[i]) << "a change in block 0 changes every later hash " << i;
  // Blocks 1 and 2 hold the same tokens: only the chain tells them apart.
  EXPECT_NE(a[1], a[2]);
  EXPECT_EQ(hashes("", 32).size(), 2u) << "prompt_tokens given past the text";
  EXPECT_TRUE(hashes("abc", 1).empty());
  EXPECT_EQ(emulated_tokens("abcde", 3), (std::vector<std::int32_t>{0x64636261, 0x65, 0}));
}

TEST(Replies, OpenAiShapes) {
  const CompletionRequest r = parse_ok(R"({"prompt":"hello world!","max_tokens":3})");
  ReplyInfo info{.id = "cmpl-1",
                 .created = 5,
                 .model = "m",
                 .prompt_tokens = 3,
                 .completion_tokens = 3,
                 .cached_tokens = 0,
                 .session = ""};
  const json j = json::parse(completion_reply(r, info, filler_text(3)));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["choices"][0]["text"], " tok tok tok");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 6);
  const json c0 = json::parse(stream_chunk(r, info, 0, kFillerToken, false));
  EXPECT_TRUE(c0["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(c0.contains("usage"));
  const json c2 = json::parse(stream_chunk(r, info, 2, kFillerToken, true));
  EXPECT_EQ(c2["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c2["usage"]["total_tokens"], 6);

  const CompletionRequest chat = parse_ok(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3})", true);
  const json cj = json::parse(completion_reply(chat, info, filler_text(3)));
  EXPECT_EQ(cj["object"], "chat.completion");
  EXPECT_EQ(cj["choices"][0]["message"]["content"], " tok tok tok");
  const json cc = json::parse(stream_chunk(chat, info, 0, kFillerToken, false));
  EXPECT_EQ(cc["object"], "chat.completion.chunk");
  EXPECT_EQ(cc["choices"][0]["delta"]["role"], "assistant");

  // A stop before max_tokens, and text that is not UTF-8 (a byte-level
  // token): replaced, not thrown on.
  const json stop = json::parse(completion_reply(r, info, "ab\xff", "stop"));
  EXPECT_EQ(stop["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stop["choices"][0]["text"], "ab\xef\xbf\xbd");
  const json cs = json::parse(stream_chunk(chat, info, 1, "\xc3", true, "stop"));
  EXPECT_EQ(cs["choices"][0]["delta"]["content"], "\xef\xbf\xbd");
  EXPECT_EQ(cs["choices"][0]["finish_reason"], "stop");

  const json e = json::parse(error_reply("'max_tokens' must be", "invalid_request_error", "max_tokens"));
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "max_tokens");
}

}  // namespace
}  // namespace tandem::testbed
