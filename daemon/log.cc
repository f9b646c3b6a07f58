#include "daemon/log.h"

#include <ctime>
#include <string>

#include <spdlog/pattern_formatter.h>

#include "base/text.h"

namespace tandem::daemon {
namespace {

// "<6>" for info and so on: sd-daemon(3) priority prefixes.
class PriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm*/, spdlog::memory_buf_t& dest) override {
    const char* p = "<6>";
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        p = "<7>";
        break;
      case spdlog::level::info:
        p = "<6>";
        break;
      case spdlog::level::warn:
        p = "<4>";
        break;
      case spdlog::level::err:
        p = "<3>";
        break;
      case spdlog::level::critical:
        p = "<2>";
        break;
      default:
        break;
    }
    dest.append(p, p + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<PriorityFlag>(); }
};

// The message, escaped so that it stays on its line.
class OneLineMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm*/, spdlog::memory_buf_t& dest) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    const std::string line = base::one_line(text);
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<OneLineMessage>(); }
};

}  // namespace

std::unique_ptr<spdlog::formatter> make_log_formatter() {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<PriorityFlag>('N').add_flag<OneLineMessage>('V').set_pattern("%N%V");
  return formatter;
}

std::shared_ptr<spdlog::logger> make_logger(spdlog::sink_ptr sink, std::string_view level) {
  auto logger = std::make_shared<spdlog::logger>("tandemd", std::move(sink));
  logger->set_formatter(make_log_formatter());
  logger->set_level(spdlog::level::from_str(std::string(level)));
  logger->flush_on(spdlog::level::trace);
  return logger;
}

}  // namespace tandem::daemon
