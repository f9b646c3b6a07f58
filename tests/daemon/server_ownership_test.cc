// Ownership follows credentials (issue 18): a session belongs to the runner
// handle that opened it — its uid, pid, process start and instance — across
// disconnects and daemon restarts; a runner's snapshot is its word on its
// sessions; an engine's cannot bring back one that ended. In-process: the
// "runners" are real child processes (so their pids and start times are
// real), connected through socketpairs with their credentials.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "daemon/owners.h"
#include "daemon/unplaced.h"
#include "tests/daemon/inprocess.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

// A process that only waits to be killed: a runner's pid.
class Sleeper {
 public:
  Sleeper() {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (;;) ::pause();
    }
  }
  ~Sleeper() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  ucred cred(uid_t uid = 0) const { return ucred{pid_, uid, uid}; }
  pid_t pid() const { return pid_; }
  // Reaps it once it died; true if SIGKILL ended it.
  bool killed() {
    int status = 0;
    if (pid_ <= 0 || ::waitpid(pid_, &status, 0) != pid_) return false;
    pid_ = -1;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }

 private:
  pid_t pid_ = -1;
};

json sessions(InProcessDaemon& d) {
  auto reader = d.connect();
  if (!reader.hello(wire::Role::CtlRead, "reader")) return json::object();
  return json::parse(reader.ctl("sessions").second)["sessions"];
}

const json* find(const json& list, std::uint64_t id) {
  const std::string key = fmt::format("{:#018x}", id);
  for (const auto& s : list) {
    if (s["id"] == key) return &s;
  }
  return nullptr;
}

ipc::SessionSnapshotInfo snap(std::uint64_t id, std::uint8_t state = 1) {
  ipc::SessionSnapshotInfo s;
  s.session = id;
  s.state = state;
  return s;
}

constexpr std::uint64_t kVictimInstance = 0x1111;
constexpr std::uint64_t kHostileInstance = 0x2222;

// The hostile runner resyncs the victim's session before the victim is back
// — first while the daemon runs (the victim's connection broke), then after
// a restart. It gets nothing, can close nothing; the victim gets it back.
TEST(Ownership, AResyncCannotHijackAnotherRunnersSession) {
  Sleeper victim_proc;
  Sleeper hostile_proc;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  const std::uint64_t s = base::session_id("victim-session");
  {
    auto victim = d.connect(victim_proc.cred());
    ASSERT_TRUE(victim.hello(wire::Role::Runner, "victim", std::nullopt, kVictimInstance));
    ASSERT_TRUE(victim.push(ipc::SessionOpen{}, s));
    ASSERT_NE(find(sessions(d), s), nullptr);
  }  // the victim's connection breaks; its process lives
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      d.restart();  // a kill -9 of the daemon: the journal holds who owns what
      ASSERT_TRUE(d.ok()) << d.error();
    }
    auto hostile = d.connect(hostile_proc.cred());
    ASSERT_TRUE(hostile.hello(wire::Role::Runner, "hostile", std::nullopt, kHostileInstance));
    const auto one = snap(s);
    ASSERT_TRUE(hostile.send(ipc::build_resync(std::span(&one, 1), false)));
    ASSERT_TRUE(hostile.push(ipc::SessionClose{}, s));
    const json list = sessions(d);
    const json* entry = find(list, s);
    ASSERT_NE(entry, nullptr) << "round " << round << ": the hostile runner closed the victim's session";
    EXPECT_TRUE((*entry)["held"].get<bool>()) << entry->dump();
    EXPECT_TRUE((*entry)["owner"].is_null()) << entry->dump();
    bool told = false;
    for (const auto& e : hostile.take_errors()) told |= e.session == s && e.code == EPERM && !e.fatal;
    EXPECT_TRUE(told);
    EXPECT_GE(d.server().stats().resync_refused, 1u);
  }
  // The victim (same process, same handle) reconnects: its session comes back.
  auto victim = d.connect(victim_proc.cred());
  ASSERT_TRUE(victim.hello(wire::Role::Runner, "victim", std::nullopt, kVictimInstance));
  const auto one = snap(s);
  ASSERT_TRUE(victim.send(ipc::build_resync(std::span(&one, 1), false)));
  const json list = sessions(d);
  const json* entry = find(list, s);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ((*entry)["owner"], victim.id());
  EXPECT_FALSE((*entry)["held"].get<bool>());
  // Another handle of the victim's own process is another owner too.
  auto other = d.connect(victim_proc.cred());
  ASSERT_TRUE(other.hello(wire::Role::Runner, "victim-2", std::nullopt, kHostileInstance));
  ASSERT_TRUE(other.push(ipc::SessionClose{}, s));
  EXPECT_NE(find(sessions(d), s), nullptr);
}

// A disconnect is not the runner's end: its session (and so its tools) is
// held until its process exits.
TEST(Ownership, SessionsOutliveTheConnectionNotTheProcess) {
  Sleeper runner_proc;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  const std::uint64_t s = base::session_id("held");
  {
    auto runner = d.connect(runner_proc.cred());
    ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner", std::nullopt, kVictimInstance));
    ASSERT_TRUE(runner.push(ipc::SessionOpen{}, s));
    ASSERT_NE(find(sessions(d), s), nullptr);
  }
  ASSERT_TRUE(d.until([&] { return d.server().footprint().detached == 1; }));
  EXPECT_NE(find(sessions(d), s), nullptr);
  EXPECT_EQ(d.recording().session(s), nullptr);  // no kill
  runner_proc.kill();
  EXPECT_TRUE(d.until([&] { return find(sessions(d), s) == nullptr; }));
  EXPECT_EQ(d.server().footprint().owners, 0u);
}

// The snapshot is the runner's word: a held session it leaves out closed
// while the daemon could not hear it.
TEST(Ownership, ARunnersSnapshotIsAuthoritative) {
  Sleeper runner_proc;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  const std::uint64_t kept = base::session_id("kept");
  const std::uint64_t dropped = base::session_id("dropped");
  {
    auto runner = d.connect(runner_proc.cred());
    ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner", std::nullopt, kVictimInstance));
    ASSERT_TRUE(runner.push(ipc::SessionOpen{}, kept));
    ASSERT_TRUE(runner.push(ipc::SessionOpen{}, dropped));
    ASSERT_EQ(sessions(d).size(), 2u);
  }
  d.restart();
  ASSERT_TRUE(d.ok()) << d.error();
  ASSERT_EQ(sessions(d).size(), 2u);  // both held for it from the journal
  auto runner = d.connect(runner_proc.cred());
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner", std::nullopt, kVictimInstance));
  const auto one = snap(kept);
  ASSERT_TRUE(runner.send(ipc::build_resync(std::span(&one, 1), false)));
  const json list = sessions(d);
  EXPECT_NE(find(list, kept), nullptr);
  EXPECT_EQ(find(list, dropped), nullptr);
  // The same connection opening a session after its snapshot keeps it.
  const std::uint64_t fresh = base::session_id("fresh");
  ASSERT_TRUE(runner.push(ipc::SessionOpen{}, fresh));
  ASSERT_TRUE(runner.send(ipc::build_resync(std::span(&one, 1), false, /*ring_position=*/0)));
  EXPECT_NE(find(sessions(d), fresh), nullptr);
}

// A runner closes its session while the engine keeps the KV of its last
// round: the engine's snapshot — at once, or after a daemon restart —
// cannot bring it back, and the engine is told to forget it.
TEST(Ownership, AnEngineSnapshotCannotRecreateAClosedSession) {
  Sleeper runner_proc;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  const std::uint64_t s = base::session_id("closed-one");
  auto engine = d.connect();
  ASSERT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info()));
  {
    auto runner = d.connect(runner_proc.cred());
    ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner", std::nullopt, kVictimInstance));
    ASSERT_TRUE(runner.push(ipc::SessionOpen{}, s));
    ipc::RoundSubmit submit;
    submit.prompt_tokens = 100;
    submit.projected_blocks = 8;
    ASSERT_TRUE(engine.push(submit, s));
    ASSERT_NE(find(sessions(d), s), nullptr);
    ASSERT_TRUE(runner.push(ipc::SessionClose{}, s));
    ASSERT_TRUE(d.until([&] { return find(sessions(d), s) == nullptr; }));
    ASSERT_TRUE(d.until([&] { return d.server().footprint().sessions == 0; }));  // reaped at a tick
  }
  bool closed = false;
  for (const ipc::Record& r : engine.directives()) closed |= r.type() == ipc::RecordType::kClose && r.session() == s;
  EXPECT_TRUE(closed) << "the engine was not told the session ended";
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      d.restart();
      ASSERT_TRUE(d.ok()) << d.error();
      engine = d.connect();
      ASSERT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info()));
    }
    ipc::SessionSnapshotInfo acting = snap(s, static_cast<std::uint8_t>(sched::SessionState::kActing));
    acting.blocks_held = 8;
    ASSERT_TRUE(engine.send(ipc::build_resync(std::span(&acting, 1), false)));
    EXPECT_EQ(find(sessions(d), s), nullptr) << "round " << round << ": the closed session came back";
    bool told = false;
    for (const ipc::Record& r : engine.directives()) told |= r.type() == ipc::RecordType::kClose && r.session() == s;
    EXPECT_TRUE(told) << "round " << round;
  }
}

// What an engine may do to a runner's session: run its rounds. Not name it,
// not change whether its tool runs through a snapshot.
TEST(Ownership, AnEngineActsOnARunnersSessionOnlyThroughItsRounds) {
  Sleeper runner_proc;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  const std::string name = "runner-owned";
  const std::uint64_t s = base::session_id(name);
  auto runner = d.connect(runner_proc.cred());
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner", std::nullopt, kVictimInstance));
  ASSERT_TRUE(runner.push(ipc::SessionOpen{}, s));
  ASSERT_TRUE(runner.send(ipc::build_session_name(s, name)));
  auto engine = d.connect();
  ASSERT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info()));
  ASSERT_NE(find(sessions(d), s), nullptr);
  // Its snapshot says the session is in a tool call, holding KV: no.
  ipc::SessionSnapshotInfo acting = snap(s, static_cast<std::uint8_t>(sched::SessionState::kActing));
  acting.blocks_held = 8;
  acting.name = name;
  ASSERT_TRUE(engine.send(ipc::build_resync(std::span(&acting, 1), false)));
  json entry = *find(sessions(d), s);
  EXPECT_NE(entry["state"], "acting") << entry.dump();
  EXPECT_EQ(entry["in_tool"], false);
  // A name that hashes to the runner's id from the engine (ids are hashes:
  // such names can be made): the runner's name stands, and the engine's
  // session is not refused for trying.
  ASSERT_TRUE(engine.send(ipc::build_session_name(s, name)));
  (void)sessions(d);
  EXPECT_TRUE(engine.take_errors().empty());
  EXPECT_EQ((*find(sessions(d), s))["name"], name);
  // KV events and round ends without its round: rejected.
  const auto rejected = d.server().stats().records_rejected;
  ipc::KvEvent ev;
  ev.kind = static_cast<std::uint8_t>(ipc::KvEventKind::kEvicted);
  ev.blocks = 1;
  ASSERT_TRUE(engine.push(ev, s));
  (void)sessions(d);
  EXPECT_EQ(d.server().stats().records_rejected, rejected + 1);
  // Its rounds: yes.
  ipc::RoundSubmit submit;
  submit.prompt_tokens = 10;
  submit.projected_blocks = 1;
  ASSERT_TRUE(engine.push(submit, s));
  entry = *find(sessions(d), s);
  EXPECT_TRUE(entry["round_in_flight"].get<bool>()) << entry.dump();
}

// A runner's SESSION_CLOSE can overtake its engine's ROUND_END (the engine's
// records wait in its ring for the tick). The late record is skipped and
// counted apart, never held against the engine; so is one that comes after
// the session has left the table (its tombstone says it ended). A record
// about a session that never was is still rejected.
TEST(Ownership, RecordsAboutAClosedSessionAreLateNotRejected) {
  Sleeper runner_proc;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  const std::uint64_t s = base::session_id("closing");
  auto runner = d.connect(runner_proc.cred());
  ASSERT_TRUE(runner.hello(wire::Role::Runner, "runner", std::nullopt, kVictimInstance));
  ASSERT_TRUE(runner.push(ipc::SessionOpen{}, s));
  auto engine = d.connect();
  ASSERT_TRUE(engine.hello(wire::Role::Engine, "engine", test_engine_info()));
  ipc::RoundSubmit submit;
  submit.prompt_tokens = 10;
  submit.projected_blocks = 1;
  ASSERT_TRUE(engine.push(submit, s));
  ASSERT_NE(find(sessions(d), s), nullptr);
  ASSERT_TRUE((*find(sessions(d), s))["round_in_flight"].get<bool>());
  const daemon::ServerStats before = d.server().stats();

  ASSERT_TRUE(runner.push(ipc::SessionClose{}, s));
  (void)sessions(d);
  ipc::RoundEnd end;
  end.output_tokens = 5;
  end.blocks_held = 1;
  ASSERT_TRUE(engine.push(end, s));
  (void)sessions(d);
  EXPECT_EQ(d.server().stats().records_late, before.records_late + 1);
  EXPECT_EQ(d.server().stats().records_rejected, before.records_rejected);

  ASSERT_TRUE(d.until([&] { return find(sessions(d), s) == nullptr; })) << "the tick reaps the closed session";
  ipc::KvEvent ev;
  ev.kind = static_cast<std::uint8_t>(ipc::KvEventKind::kEvicted);
  ev.blocks = 1;
  ASSERT_TRUE(engine.push(ev, s));
  (void)sessions(d);
  EXPECT_EQ(d.server().stats().records_late, before.records_late + 2);
  EXPECT_EQ(d.server().stats().records_rejected, before.records_rejected);

  ASSERT_TRUE(engine.push(ev, base::session_id("never-opened")));
  (void)sessions(d);
  EXPECT_EQ(d.server().stats().records_rejected, before.records_rejected + 1);
  EXPECT_EQ(d.server().stats().records_late, before.records_late + 2);
  EXPECT_TRUE(engine.take_errors().empty());
  EXPECT_FALSE(engine.closed());
}

// A client that sends no Hello.instance (an older libtandem, a raw client)
// is its process's one handle: reconnecting, it gets back what it held; a
// second one beside it is a handle of its own. It is never sent a non-fatal
// Error (an older libtandem would drop its connection on it).
TEST(Ownership, AClientWithoutAnInstanceIsItsProcesssHandle) {
  Sleeper proc;
  InProcessDaemon d;
  ASSERT_TRUE(d.ok()) << d.error();
  const std::uint64_t s = base::session_id("old-client");
  {
    auto old = d.connect(proc.cred());
    ASSERT_TRUE(old.hello(wire::Role::Runner, "old", std::nullopt, 0));
    ASSERT_TRUE(old.push(ipc::SessionOpen{}, s));
    ASSERT_NE(find(sessions(d), s), nullptr);
  }
  auto again = d.connect(proc.cred());
  ASSERT_TRUE(again.hello(wire::Role::Runner, "old", std::nullopt, 0));
  const auto one = snap(s);
  ASSERT_TRUE(again.send(ipc::build_resync(std::span(&one, 1), false)));
  json list = sessions(d);
  ASSERT_NE(find(list, s), nullptr);
  EXPECT_EQ((*find(list, s))["owner"], again.id());
  auto beside = d.connect(proc.cred());
  ASSERT_TRUE(beside.hello(wire::Role::Runner, "old-2", std::nullopt, 0));
  ASSERT_TRUE(beside.send(ipc::build_resync(std::span(&one, 1), false)));
  ASSERT_TRUE(beside.push(ipc::SessionClose{}, s));
  list = sessions(d);
  ASSERT_NE(find(list, s), nullptr);
  EXPECT_EQ((*find(list, s))["owner"], again.id());
  EXPECT_TRUE(beside.take_errors().empty());
  EXPECT_FALSE(beside.closed());
}

TEST(OwnerJournal, ParsesWhatItWroteAndSkipsWhatItDidNot) {
  const daemon::OwnerKey a{1000, 42, 7, 9};
  std::vector<std::uint8_t> bytes;
  auto add = [&](const auto& r) { bytes.insert(bytes.end(), r.begin(), r.end()); };
  add(daemon::journal_record(1, a, 0));
  add(daemon::journal_record(2, a, 0));
  add(daemon::journal_record(2, {}, static_cast<std::uint8_t>(daemon::Closed::kByOwner)));
  auto garbage = daemon::journal_record(3, a, 0);
  garbage[20] ^= 0xff;  // a scribbled pid: the checksum no longer matches
  add(garbage);
  std::vector<std::uint8_t> torn = bytes;
  torn.insert(torn.end(), {1, 2, 3});
  const auto st = daemon::parse_journal(torn);
  ASSERT_EQ(st.owned.size(), 1u);
  EXPECT_EQ(st.owned.at(1), a);
  ASSERT_EQ(st.closed.size(), 1u);
  EXPECT_EQ(st.closed[0].first, 2u);
  EXPECT_EQ(st.skipped, 2u);  // the scribbled record and the torn tail
  // Reopened after it closed: live, not a tombstone.
  add(daemon::journal_record(2, a, 0));
  const auto again = daemon::parse_journal(bytes);
  EXPECT_TRUE(again.closed.empty());
  EXPECT_EQ(again.owned.size(), 2u);
}

// A temporary runtime dir for a journal: made, opened and, at the end,
// removed with the journal in it.
class JournalDir {
 public:
  JournalDir() {
    char tmpl[] = "/tmp/tandem-journal-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
    if (!path_.empty()) fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  ~JournalDir() {
    if (fd_ >= 0) ::close(fd_);
    if (path_.empty()) return;
    ::unlink(journal().c_str());
    ::rmdir(path_.c_str());
  }
  JournalDir(const JournalDir&) = delete;
  JournalDir& operator=(const JournalDir&) = delete;
  int fd() const { return fd_; }
  std::string journal() const { return path_ + "/owners"; }

 private:
  std::string path_;
  int fd_ = -1;
};

// What the journal records reaches the file at flush(), in one write, and
// survives a compaction taken at a flush.
TEST(OwnerJournal, RecordsReachTheFileAtFlushAndSurviveCompaction) {
  const JournalDir dir;
  const int dirfd = dir.fd();
  ASSERT_GE(dirfd, 0);
  const std::string file = dir.journal();
  auto size = [&] {
    struct stat st {};
    return ::stat(file.c_str(), &st) == 0 ? static_cast<std::size_t>(st.st_size) : std::size_t{0};
  };
  const daemon::OwnerKey a{1000, 42, 7, 9};
  {
    auto j = daemon::OwnerJournal::open(dirfd);
    ASSERT_TRUE(j) << j.error().message();
    j->owned(1, a);
    j->owned(2, a);
    j->closed(2, daemon::Closed::kByOwner);
    EXPECT_EQ(size(), 0u);  // recorded, not yet written
    j->flush();
    EXPECT_EQ(size(), 3 * daemon::kJournalRecordBytes);
    j->flush();  // nothing pending: nothing written
    EXPECT_EQ(size(), 3 * daemon::kJournalRecordBytes);
    // Many sessions come and go; one stays. Compaction keeps the file to
    // what is live and the tombstones.
    for (std::uint64_t s = 100; s < 10100; ++s) {
      j->owned(s, a);
      j->closed(s, daemon::Closed::kByOwner);
      if (s % 100 == 0) j->flush();
    }
    j->owned(5000, a);
    j->flush();
    EXPECT_TRUE(j->ok());
    EXPECT_LT(size(), 20000 * daemon::kJournalRecordBytes);  // what was appended: 20,000 records and more
  }
  auto again = daemon::OwnerJournal::open(dirfd);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again->loaded().owned.size(), 2u);  // sessions 1 and 5000
  EXPECT_EQ(again->loaded().owned.count(5000), 1u);
  EXPECT_EQ(again->loaded().closed.size(), daemon::kJournalTombstones);
  EXPECT_EQ(again->loaded().closed.back().first, 10099u);
}

// The ledger: tombstones by reason, the newest kTombstones; a revived
// session loses its tombstone; an ending without one leaves no tombstone
// now but is no longer owned after a restart; all of it read back.
TEST(SessionLedger, RemembersEndingsAndOwnersAcrossAReopen) {
  const JournalDir dir;
  const int dirfd = dir.fd();
  ASSERT_GE(dirfd, 0);
  const daemon::OwnerKey a{1000, 42, 7, 9};
  {
    auto l = daemon::SessionLedger::open(dirfd);
    ASSERT_TRUE(l) << l.error().message();
    EXPECT_EQ(l->tombstones(), 0u);
    l->owned(1, a);
    l->owned(2, a);
    l->owned(3, a);
    l->ended(1, daemon::Closed::kKilled);
    EXPECT_EQ(l->tombstone(1), daemon::Closed::kKilled);
    l->released(2);  // finished: no tombstone now
    EXPECT_FALSE(l->tombstone(2));
    l->ended(4, daemon::Closed::kByOwner);
    l->revive(4);  // opened again
    EXPECT_FALSE(l->tombstone(4));
    l->released(1);  // a tombstone already says why 1 ended: it stays kKilled
    EXPECT_EQ(l->tombstone(1), daemon::Closed::kKilled);
    l->flush();
  }
  {
    auto l = daemon::SessionLedger::open(dirfd);
    ASSERT_TRUE(l) << l.error().message();
    EXPECT_EQ(l->tombstone(1), daemon::Closed::kKilled);
    EXPECT_EQ(l->tombstone(2), daemon::Closed::kByOwner);  // the journal's close of a released session
    ASSERT_EQ(l->loaded().owned.size(), 1u);               // only 3 is still owned
    EXPECT_EQ(l->loaded().owned.at(3), a);
  }
  daemon::SessionLedger mem;  // no journal: tombstones only
  for (std::uint64_t id = 1; id <= daemon::kTombstones + 10; ++id) mem.ended(id, daemon::Closed::kByOwner);
  EXPECT_EQ(mem.tombstones(), daemon::kTombstones);
  EXPECT_FALSE(mem.tombstone(10));                         // the oldest went
  EXPECT_EQ(mem.tombstone(11), daemon::Closed::kByOwner);  // the oldest kept
  EXPECT_TRUE(mem.tombstone(daemon::kTombstones + 10));
  // Ending the oldest again makes it the newest, with its new reason; the
  // next ending then takes the one after it.
  mem.ended(11, daemon::Closed::kKilled);
  mem.ended(daemon::kTombstones + 11, daemon::Closed::kOwnerGone);
  EXPECT_EQ(mem.tombstones(), daemon::kTombstones);
  EXPECT_EQ(mem.tombstone(11), daemon::Closed::kKilled);
  EXPECT_FALSE(mem.tombstone(12));
  EXPECT_EQ(mem.tombstone(13), daemon::Closed::kByOwner);
  EXPECT_EQ(mem.tombstone(daemon::kTombstones + 11), daemon::Closed::kOwnerGone);
}

TEST(Owners, FindsHandlesByIdAndKeyAndCountsTheDetached) {
  daemon::Owners owners;
  const daemon::OwnerKey a{1000, 42, 7, 9};
  const daemon::OwnerKey b{1000, 43, 8, 9};
  daemon::Owner& oa = owners.add(a);
  const std::uint32_t ida = oa.id;
  oa.client = 5;
  const std::uint32_t idb = owners.add(b).id;
  EXPECT_NE(ida, idb);
  ASSERT_NE(owners.find(a), nullptr);
  EXPECT_EQ(owners.find(a)->id, ida);
  EXPECT_EQ(owners.find(idb)->key, b);
  EXPECT_EQ(owners.size(), 2u);
  EXPECT_EQ(owners.detached(), 1u);      // b has no connection
  EXPECT_EQ(owners.held(1000, 1), 1u);   // b's, held for another process of the uid
  EXPECT_EQ(owners.held(1000, 43), 0u);  // b's own process is not charged for it
  EXPECT_EQ(owners.held(2000, 1), 0u);
  owners.erase(idb);
  EXPECT_EQ(owners.find(b), nullptr);
  EXPECT_EQ(owners.find(idb), nullptr);
  owners.erase(idb);  // twice: nothing
  EXPECT_EQ(owners.size(), 1u);
  EXPECT_NE(owners.add(b).id, idb);  // ids are never reused
}

// Unplaced tools: only the naming runner's children are tracked (here the
// test process is the runner), at most per_session a session; killed, and
// forgotten, with their session.
TEST(UnplacedTools, TracksOnlyTheRunnersChildrenAndKillsThemWithTheSession) {
  using T = daemon::UnplacedTools::Tracked;
  daemon::UnplacedTools tools;
  Sleeper a, b, c;
  const pid_t me = ::getpid();
  EXPECT_EQ(tools.track(1, 1, a.pid(), me, 4), T::kTracked);
  EXPECT_EQ(tools.track(1, 1, a.pid(), me, 4), T::kIgnored);              // already tracked
  EXPECT_EQ(tools.track(1, 2, a.pid(), me + 100000, 4), T::kUnverified);  // not that runner's child
  EXPECT_EQ(tools.track(2, 1, ::getppid(), me, 4), T::kUnverified);       // not a child at all
  EXPECT_EQ(tools.track(2, 2, 0, me, 4), T::kIgnored);                    // no pid
  EXPECT_EQ(tools.sessions(), 1u);                                        // nothing kept for session 2
  EXPECT_EQ(tools.track(3, 1, b.pid(), me, 1), T::kTracked);
  EXPECT_EQ(tools.track(3, 2, c.pid(), me, 1), T::kIgnored);  // session 3 is at per_session
  tools.ended(3, 1);
  EXPECT_EQ(tools.track(3, 2, c.pid(), me, 1), T::kTracked);
  const auto killed = tools.kill(1);
  ASSERT_EQ(killed.size(), 1u);
  EXPECT_EQ(killed[0].pid, a.pid());
  EXPECT_TRUE(a.killed());
  EXPECT_TRUE(tools.kill(1).empty());  // forgotten
  EXPECT_EQ(tools.kill(3).size(), 1u);
  EXPECT_TRUE(c.killed());
  EXPECT_EQ(tools.sessions(), 0u);
  // b ended (its TOOL_END) before: not killed with its session.
  EXPECT_EQ(::kill(b.pid(), 0), 0);
}

TEST(OwnerJournal, StartTimeIsCountedAfterTheCommand) {
  const std::string stat = "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
  auto t = daemon::parse_start_time(stat);
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(*t, 98765u);
  auto p = daemon::parse_parent_pid(stat);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, 1);
  EXPECT_FALSE(daemon::parse_start_time("1234 (no close"));
  EXPECT_FALSE(daemon::parse_start_time("1 (x) S 1 2"));
}

}  // namespace
}  // namespace tandem::testing
