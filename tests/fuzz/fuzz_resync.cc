// libFuzzer target for the resync path: Resync snapshots (any state,
// residency, names, tools, `more` chains and ring positions) from runners of
// two uids and an engine, between records and dropped connections, on one
// in-process tandemd (tests/fuzz/daemon_driver.h checks every answer and
// that what it holds stays bounded); and the ownership journal's parser on
// the raw input, whose replay must be consistent with itself.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "daemon/owners.h"
#include "tests/fuzz/daemon_driver.h"

namespace {

using namespace tandem;
using fuzzing::Bytes;

void resync(fuzzing::Driver& d, Bytes& in) {
  const int who = in.u8() % 4;  // runners 0..2, the engine 3
  std::vector<ipc::SessionSnapshotInfo> snaps;
  const int n = in.u8() % 40;
  for (int i = 0; i < n; ++i) {
    ipc::SessionSnapshotInfo s;
    s.session = fuzzing::pick_session(in);
    const std::uint8_t k = in.u8();
    if (k < 128) {
      s.name = fuzzing::names()[k % fuzzing::names().size()];
    } else if (k < 160) {
      s.name = in.str(300);
    }
    s.state = in.u8() % 8;
    s.residency = in.u8() % 8;
    s.round = in.u8();
    s.blocks_held = in.u8();
    s.in_tool = in.u8() % 2 == 1;
    s.tool_kind = in.u8();
    const int tools = in.u8() % 3;
    for (int t = 0; t < tools; ++t) {
      // pid: ours, 1, or whatever (never killed unless it is the runner's child).
      const std::uint8_t p = in.u8();
      const std::int32_t pid = p < 100   ? static_cast<std::int32_t>(::getpid())
                               : p < 200 ? 1
                                         : static_cast<std::int32_t>(in.u32());
      s.tools.push_back(ipc::ToolSnapshotInfo{in.u32(), pid, in.u8() < 128 ? 0 : in.u64()});
    }
    snaps.push_back(std::move(s));
  }
  const bool more = in.u8() < 64;
  (void)d.client(who).send(ipc::build_resync(snaps, more, in.u8() < 128 ? 0 : in.u32()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The journal a previous tandemd left is read at start: whatever bytes it
  // holds, the replay is total and consistent.
  const auto journal = daemon::parse_journal(std::span(data, size));
  for (const auto& [id, key] : journal.owned) {
    if (id == 0) fuzzing::broken("a journal entry for session 0");
  }
  for (const auto& [id, why] : journal.closed) {
    if (journal.owned.contains(id)) fuzzing::broken("a session both owned and closed");
  }
  if (journal.records + journal.skipped > size / daemon::kJournalRecordBytes + 1) fuzzing::broken("journal count");

  auto& d = fuzzing::driver();
  Bytes in(data, size);
  for (int ops = 0; ops < 24 && !in.empty(); ++ops) {
    switch (in.u8() % 5) {
      case 0:
      case 1:
        resync(d, in);
        break;
      case 2: {
        const int who = in.u8() % 3;
        const std::uint64_t s = fuzzing::pick_session(in);
        if (in.u8() % 2 == 0) {
          (void)d.client(who).push(ipc::SessionOpen{}, s);
        } else {
          (void)d.client(who).push(ipc::SessionClose{}, s);
        }
        break;
      }
      case 3: {
        ipc::RoundSubmit r;
        r.prompt_tokens = 10;
        r.projected_blocks = 1;
        const std::uint64_t s = fuzzing::pick_session(in);
        (void)d.client(3).push(r, s);
        if (in.u8() % 2 == 0) {
          ipc::RoundEnd e;
          e.header.flags = ipc::kRoundEndToolFollows;
          (void)d.client(3).push(e, s);
        }
        break;
      }
      case 4:
        d.drop(in.u8() % 4);
        break;
    }
    d.settle();
  }
  // Every few inputs, a reader looks at it all.
  auto [status, body] = d.client(4).ctl("sessions");
  if (status != 0 && status != -1) fuzzing::broken("ctl sessions failed", body);
  return 0;
}
