// Prints the C layout of every struct in tandem.h and tandem_gpu.h, and the
// ids of a few names, for tests/python/test_tandem.py: the ctypes mirrors in
// libclient/python/tandem/_ffi.py are compared with what the C compiler
// does, so the two cannot drift apart unnoticed. The structs and members are
// not listed here: abi_layout_gen.py reads them from the headers at build
// time, so a member added to a header is checked with no line written here.
//
// Output, one fact a line:
//   size <struct> <sizeof>
//   field <struct> <member> <offsetof> <sizeof member>
//   session_id <name> <id in hex>     (base::session_id: what libtandem uses)
//   enum <enumerator> <value>         (enumerators and array-bound macros)
#include <cstddef>
#include <cstdio>
#include <string_view>

#include "base/ids.h"
#include "tandem/tandem.h"
#include "tandem/tandem_gpu.h"

namespace {

// sizeof of a pointer member is what we want here, not a mistake.
// NOLINTBEGIN(bugprone-sizeof-expression)
#define SIZE(s) std::printf("size %s %zu\n", #s, sizeof(s))
#define FIELD(s, m) std::printf("field %s %s %zu %zu\n", #s, #m, offsetof(s, m), sizeof(s::m))

// One SIZE and one FIELD per member for every struct of the headers, in
// order, generated at build time from the headers (abi_layout_gen.py).
void print_layouts() {
#include "abi_layout_structs.inc"
}

#undef SIZE
#undef FIELD
// NOLINTEND(bugprone-sizeof-expression)

// The enumerators the binding mirrors as Python enums.
#define ENUM(e) std::printf("enum %s %d\n", #e, static_cast<int>(e))

void print_enums() {
  ENUM(TANDEM_TOOL_EXITED);
  ENUM(TANDEM_TOOL_SIGNALED);
  ENUM(TANDEM_TOOL_OOM_KILLED);
  ENUM(TANDEM_TOOL_KILLED_MEMORY);
  ENUM(TANDEM_TOOL_KILLED_POLICY);
  ENUM(TANDEM_TOOL_KILLED_SESSION);
  ENUM(TANDEM_TOOL_ALLOW_UNPLACED);
  ENUM(TANDEM_TOOL_UNPLACED);
  ENUM(TANDEM_TOOL_CGROUP_NS);
  ENUM(TANDEM_TOOL_UID_CHANGED);
  ENUM(TANDEM_TOOL_DAEMON_LOST);
  ENUM(TANDEM_DIR_CLOSE);
  ENUM(TANDEM_GPU_STAGE_DECODE);
  ENUM(TANDEM_GPU_STAGE_PREFILL);
  ENUM(TANDEM_GPU_MAX_STAGES);
  ENUM(TANDEM_GPU_MAX_PARTITIONS);
}

#undef ENUM

}  // namespace

int main() {
  print_layouts();
  print_enums();
  // Names without spaces: the output is split on whitespace.
  for (std::string_view name : {"abc", "session-1", "agent/7:task", "pytest"}) {
    std::printf("session_id %.*s %016llx\n", static_cast<int>(name.size()), name.data(),
                static_cast<unsigned long long>(tandem::base::session_id(name)));
  }
  return 0;
}
