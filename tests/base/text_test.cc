#include "base/text.h"

#include <cerrno>
#include <string>

#include <gtest/gtest.h>

namespace tandem::base {
namespace {

TEST(Text, ValidUtf8AcceptsShortestFormsOnly) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("agent-1"));
  EXPECT_TRUE(valid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));  // é € 😀
  EXPECT_FALSE(valid_utf8("agent-\xff\xfe"));
  EXPECT_FALSE(valid_utf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(valid_utf8("\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(valid_utf8("\xE2\x82"));          // cut short
  EXPECT_FALSE(valid_utf8("\x80"));              // a lone continuation byte
}

TEST(Text, NamesMustBeShortValidAndPrintable) {
  EXPECT_EQ(name_problem("agent-42"), nullptr);
  EXPECT_EQ(name_problem("r\xC3\xA9sum\xC3\xA9"), nullptr);
  EXPECT_EQ(name_problem(std::string(256, 'a')), nullptr);
  EXPECT_NE(name_problem(std::string(257, 'a')), nullptr);
  EXPECT_NE(name_problem(""), nullptr);
  EXPECT_NE(name_problem("agent-\xff\xfe"), nullptr);
  EXPECT_NE(name_problem("a\nb"), nullptr);
  EXPECT_NE(name_problem("a\x7f"), nullptr);
  EXPECT_NE(name_problem("a\xC2\x85"), nullptr);                // NEL (C1)
  EXPECT_NE(name_problem("a\xE2\x80\xA8"), nullptr);            // U+2028
  EXPECT_NE(name_problem("evil\xE2\x80\xAEgnp.exe"), nullptr);  // U+202E: right-to-left override
  EXPECT_NE(name_problem(std::string("a\0b", 3)), nullptr);

  auto too_long = check_name(std::string(300, 'x'), "session name");
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().code(), ENAMETOOLONG);
  EXPECT_NE(too_long.error().message().find("300 bytes"), std::string::npos);
  auto bad = check_name("x\n<0>pwned", "client name");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), EINVAL);
  EXPECT_EQ(bad.error().message().find('\n'), std::string::npos) << bad.error().message();
  EXPECT_TRUE(check_name("fine", "name"));
}

TEST(Text, EscapeIsOneLineAndShowsEveryByte) {
  EXPECT_EQ(escape("agent-1"), "agent-1");
  EXPECT_EQ(escape("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(escape("x\n<0>pwned"), "x\\n<0>pwned");
  EXPECT_EQ(escape("a\tb\rc\\d\"e"), "a\\tb\\rc\\\\d\\\"e");
  EXPECT_EQ(escape("agent-\xff\xfe"), "agent-\\xff\\xfe");
  EXPECT_EQ(escape("a\x1b[31m"), "a\\x1b[31m");
  EXPECT_EQ(escape("a\xE2\x80\xAE"), "a\\u{202e}");
  EXPECT_EQ(escape(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(escape("abcdef", 3), "abc…");
  // A character that does not fit the budget is left out whole.
  EXPECT_EQ(escape("ab\xC3\xA9", 3), "ab…");
  for (int c = 0; c < 256; ++c) {
    const std::string s(1, static_cast<char>(c));
    const std::string e = escape(s);
    EXPECT_EQ(e.find('\n'), std::string::npos);
    EXPECT_EQ(e.find('\r'), std::string::npos);
    EXPECT_TRUE(valid_utf8(e)) << c;
  }
}

TEST(Text, OneLineEscapesOnlyWhatBreaksALine) {
  EXPECT_EQ(one_line("client \"a\\b\" left"), "client \"a\\b\" left");
  EXPECT_EQ(one_line("x\n<0>pwned"), "x\\n<0>pwned");
  EXPECT_EQ(one_line("a\xff"), "a\\xff");
  const std::string long_text(10000, 'y');
  EXPECT_EQ(one_line(long_text), long_text);
}

TEST(Text, Utf8PrefixNeverSplitsACharacter) {
  const std::string s =
      "ab\xE2\x82\xAC"
      "cd";  // ab€cd
  EXPECT_EQ(utf8_prefix(s, 100), s);
  EXPECT_EQ(utf8_prefix(s, 2), "ab");
  EXPECT_EQ(utf8_prefix(s, 3), "ab");
  EXPECT_EQ(utf8_prefix(s, 4), "ab");
  EXPECT_EQ(utf8_prefix(s, 5), "ab\xE2\x82\xAC");
  for (std::size_t n = 0; n <= s.size(); ++n) EXPECT_TRUE(valid_utf8(utf8_prefix(s, n))) << n;
}

TEST(Text, ToValidUtf8ReplacesBadBytes) {
  EXPECT_EQ(to_valid_utf8("ok"), "ok");
  EXPECT_EQ(to_valid_utf8("a\xff"
                          "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_TRUE(valid_utf8(to_valid_utf8("agent-\xff\xfe\xC0\xAF\xED\xA0\x80")));
}

}  // namespace
}  // namespace tandem::base
