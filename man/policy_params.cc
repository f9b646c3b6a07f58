// tandem-man-policies: prints the policy registry (sched/registry.h) as
// tab-separated records for gen_config_page.py, which turns them into the
// POLICY PARAMETERS section of tandemd.toml(5). Built and run at build time,
// so the page lists exactly the parameters the daemon validates against.
//
//   policy <TAB> name <TAB> summary
//   param  <TAB> policy <TAB> name <TAB> default <TAB> min <TAB> max <TAB> doc
//
//   tandem-man-policies [FILE]      (stdout without FILE)
//
// Numbers are printed as integers when they are whole, else in the shortest
// form that reads back to the same double. Exits 1 if a registry string
// could not be carried in this format (a tab or a newline in it), or the
// output could not be written.
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sched/registry.h"

namespace {

std::string number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{}", v);
}

// A field must not contain the format's separators.
bool clean(std::string_view s) { return s.find_first_of("\t\n\r") == std::string_view::npos; }

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fputs("usage: tandem-man-policies [FILE]\n", stderr);
    return 2;
  }
  std::string out;
  for (const tandem::sched::PolicyEntry& p : tandem::sched::policy_registry()) {
    if (!clean(p.name) || !clean(p.summary)) {
      std::fprintf(stderr, "tandem-man-policies: policy '%.*s': tab or newline in its name or summary\n",
                   static_cast<int>(p.name.size()), p.name.data());
      return 1;
    }
    out += fmt::format("policy\t{}\t{}\n", p.name, p.summary);
    for (const tandem::sched::ParamSpec& s : p.params) {
      if (!clean(s.name) || !clean(s.doc)) {
        std::fprintf(stderr, "tandem-man-policies: %.*s.%.*s: tab or newline in its name or doc\n",
                     static_cast<int>(p.name.size()), p.name.data(), static_cast<int>(s.name.size()), s.name.data());
        return 1;
      }
      out += fmt::format("param\t{}\t{}\t{}\t{}\t{}\t{}\n", p.name, s.name, number(s.default_value), number(s.min),
                         number(s.max), s.doc);
    }
  }
  const char* path = argc == 2 ? argv[1] : nullptr;
  std::FILE* f = path != nullptr ? std::fopen(path, "we") : stdout;
  const bool ok = f != nullptr && std::fputs(out.c_str(), f) != EOF && std::fflush(f) == 0;
  if (!ok) std::perror(fmt::format("tandem-man-policies: {}", path != nullptr ? path : "stdout").c_str());
  if (f != nullptr && f != stdout && std::fclose(f) != 0 && ok) {
    std::perror(fmt::format("tandem-man-policies: {}", path).c_str());
    return 1;
  }
  return ok ? 0 : 1;
}
