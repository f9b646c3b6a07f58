#include "daemon/owners.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/ids.h"
#include "base/parse.h"

namespace tandem::daemon {
namespace {

constexpr std::uint32_t kMagic = 0x314A4F54;  // "TOJ1"
constexpr std::uint8_t kOpOwned = 1;
constexpr std::uint8_t kOpClosed = 2;
// The largest journal read at start; a bigger file is not one tandemd wrote.
constexpr std::size_t kMaxJournalBytes = std::size_t{64} << 20;

template <class T>
void put(std::uint8_t* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <class T>
T get(const std::uint8_t* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

std::uint64_t checksum(const std::uint8_t* record) {
  return base::hash64(std::string_view(reinterpret_cast<const char*>(record), 40));
}

// Writes all of `bytes` to `fd`; false (errno set; ENOSPC for a write that
// took nothing) when it could not.
bool write_all(int fd, const std::vector<std::uint8_t>& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

std::array<std::uint8_t, kJournalRecordBytes> journal_record(std::uint64_t session, const OwnerKey& key,
                                                             std::uint8_t closed_reason) {
  std::array<std::uint8_t, kJournalRecordBytes> r{};
  put(r.data(), kMagic);
  r[4] = closed_reason == 0 ? kOpOwned : kOpClosed;
  r[5] = closed_reason;
  put(r.data() + 8, session);
  put(r.data() + 16, key.uid);
  put(r.data() + 20, key.pid);
  put(r.data() + 24, key.start);
  put(r.data() + 32, key.instance);
  put(r.data() + 40, checksum(r.data()));
  return r;
}

JournalState parse_journal(std::span<const std::uint8_t> bytes) {
  JournalState st;
  std::deque<std::pair<std::uint64_t, Closed>> closed;
  for (std::size_t off = 0; off + kJournalRecordBytes <= bytes.size(); off += kJournalRecordBytes) {
    const std::uint8_t* r = bytes.data() + off;
    const std::uint8_t op = r[4];
    const std::uint8_t reason = r[5];
    const std::uint64_t session = get<std::uint64_t>(r + 8);
    const bool good_op =
        (op == kOpOwned && reason == 0) || (op == kOpClosed && reason >= static_cast<std::uint8_t>(Closed::kByOwner) &&
                                            reason <= static_cast<std::uint8_t>(Closed::kOwnerGone));
    if (get<std::uint32_t>(r) != kMagic || !good_op || session == 0 || get<std::uint64_t>(r + 40) != checksum(r)) {
      ++st.skipped;
      continue;
    }
    ++st.records;
    if (op == kOpOwned) {
      st.owned[session] = OwnerKey{get<std::uint32_t>(r + 16), get<std::int32_t>(r + 20), get<std::uint64_t>(r + 24),
                                   get<std::uint64_t>(r + 32)};
    } else {
      st.owned.erase(session);
      closed.emplace_back(session, static_cast<Closed>(reason));
      if (closed.size() > kJournalTombstones) closed.pop_front();
    }
  }
  // A session owned again after it closed is live, not a tombstone.
  for (const auto& c : closed) {
    if (!st.owned.contains(c.first)) st.closed.push_back(c);
  }
  if (bytes.size() % kJournalRecordBytes != 0) ++st.skipped;  // a torn last record
  return st;
}

base::Result<std::uint64_t> parse_start_time(std::string_view stat) {
  const auto close = stat.rfind(')');
  if (close == std::string_view::npos) return base::make_error(EINVAL, "stat: no ')' after the command");
  // Fields after the comm start with field 3 (state).
  std::size_t field = 3;
  std::size_t i = close + 1;
  while (i < stat.size()) {
    while (i < stat.size() && stat[i] == ' ') ++i;
    const std::size_t end = stat.find(' ', i);
    const std::string_view word = stat.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i);
    if (field == 22) {
      auto v = base::parse_int<std::uint64_t>(base::trim(word));
      if (!v) return base::propagate(std::move(v.error()), "stat: start time");
      return *v;
    }
    if (end == std::string_view::npos) break;
    i = end;
    ++field;
  }
  return base::make_error(EINVAL, "stat: fewer than 22 fields");
}

base::Result<pid_t> parse_parent_pid(std::string_view stat) {
  const auto close = stat.rfind(')');
  if (close == std::string_view::npos || close + 4 > stat.size()) return base::make_error(EINVAL, "stat: too short");
  // ") S 1234 ..." : field 3 is one character, then the parent.
  const std::string_view rest = stat.substr(close + 4);
  auto v = base::parse_int<pid_t>(rest.substr(0, rest.find(' ')));
  if (!v) return base::propagate(std::move(v.error()), "stat: parent pid");
  return *v;
}

base::Result<std::uint64_t> process_start_time(std::string_view proc_root, pid_t pid) {
  const std::string path = fmt::format("{}/{}/stat", proc_root, pid);
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return base::errno_error(path);
  char buf[1024];
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return base::errno_error(path);
  return parse_start_time(std::string_view(buf, static_cast<std::size_t>(n)));
}

base::Result<OwnerJournal> OwnerJournal::open(int dirfd, std::string name) {
  OwnerJournal j;
  j.dirfd_ = dirfd;
  j.name_ = std::move(name);
  j.fd_ = base::UniqueFd(
      ::openat(dirfd, j.name_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600));
  if (!j.fd_) return base::errno_error(fmt::format("open {} in the runtime dir", j.name_));
  struct stat st {};
  if (::fstat(j.fd_.get(), &st) != 0) return base::errno_error(fmt::format("stat {}", j.name_));
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
    return base::make_error(EPERM, fmt::format("{} in the runtime dir is not a regular file of tandemd's own "
                                               "(uid {}, {} links): remove it",
                                               j.name_, st.st_uid, st.st_nlink));
  }
  if (static_cast<std::size_t>(st.st_size) > kMaxJournalBytes) {
    spdlog::warn("{}: {} bytes is not a journal tandemd wrote; starting a new one", j.name_, st.st_size);
    if (::ftruncate(j.fd_.get(), 0) != 0) return base::errno_error(fmt::format("truncate {}", j.name_));
  } else {
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::pread(j.fd_.get(), bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    bytes.resize(got);
    j.loaded_ = parse_journal(bytes);
  }
  for (const auto& [session, key] : j.loaded_.owned) j.live_[session] = key;
  for (const auto& c : j.loaded_.closed) j.tombstones_.push_back(c);
  j.records_ = j.loaded_.records + j.loaded_.skipped;
  if (j.loaded_.skipped > 0) spdlog::warn("{}: skipped {} unreadable records", j.name_, j.loaded_.skipped);
  return j;
}

void OwnerJournal::append(std::uint64_t session, const OwnerKey& key, std::uint8_t closed_reason) {
  if (!ok()) return;
  const auto r = journal_record(session, key, closed_reason);
  pending_.insert(pending_.end(), r.begin(), r.end());
  ++records_;
}

void OwnerJournal::flush() {
  if (!ok() || pending_.empty()) return;
  const bool due = records_ > 1024 && records_ > 4 * (live_.size() + tombstones_.size());
  // A compaction writes what is live, the pending records' effects included.
  if ((!due || !compact()) && ok() && !write_all(fd_.get(), pending_)) {
    failed_ = true;
    spdlog::error("{}: write failed ({}): session ownership will not survive a restart", name_, std::strerror(errno));
  }
  pending_.clear();
}

void OwnerJournal::owned(std::uint64_t session, const OwnerKey& key) {
  OwnerKey* known = live_.find(session);
  if (known != nullptr && *known == key) return;  // already recorded
  live_[session] = key;
  append(session, key, 0);
}

void OwnerJournal::closed(std::uint64_t session, Closed why) {
  live_.erase(session);
  tombstones_.emplace_back(session, why);
  if (tombstones_.size() > kJournalTombstones) tombstones_.pop_front();
  append(session, OwnerKey{}, static_cast<std::uint8_t>(why));
}

bool OwnerJournal::compact() {
  const std::string tmp = name_ + ".new";
  (void)::unlinkat(dirfd_, tmp.c_str(), 0);
  base::UniqueFd out(::openat(dirfd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) {
    spdlog::warn("{}: cannot compact ({}); it keeps growing", name_, std::strerror(errno));
    records_ = 0;  // try again after as many records again
    return false;
  }
  std::vector<std::uint8_t> bytes;
  bytes.reserve((live_.size() + tombstones_.size()) * kJournalRecordBytes);
  for (const auto& [session, why] : tombstones_) {
    const auto r = journal_record(session, OwnerKey{}, static_cast<std::uint8_t>(why));
    bytes.insert(bytes.end(), r.begin(), r.end());
  }
  live_.for_each([&](std::uint64_t session, const OwnerKey& key) {
    const auto r = journal_record(session, key, 0);
    bytes.insert(bytes.end(), r.begin(), r.end());
  });
  if (!write_all(out.get(), bytes)) {
    spdlog::warn("{}: cannot compact ({}); it keeps growing", name_, std::strerror(errno));
    (void)::unlinkat(dirfd_, tmp.c_str(), 0);
    records_ = 0;
    return false;
  }
  if (::renameat(dirfd_, tmp.c_str(), dirfd_, name_.c_str()) != 0) {
    spdlog::warn("{}: cannot compact ({}); it keeps growing", name_, std::strerror(errno));
    (void)::unlinkat(dirfd_, tmp.c_str(), 0);
    records_ = 0;
    return false;
  }
  base::UniqueFd fresh(::openat(dirfd_, name_.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC));
  if (!fresh) {
    failed_ = true;
    spdlog::error("{}: reopen after compaction failed ({})", name_, std::strerror(errno));
    return false;
  }
  fd_ = std::move(fresh);
  records_ = live_.size() + tombstones_.size();
  return true;
}

base::Result<SessionLedger> SessionLedger::open(int dirfd) {
  auto journal = OwnerJournal::open(dirfd);
  if (!journal) return base::propagate(std::move(journal.error()), "ownership journal");
  SessionLedger l;
  l.journal_ = std::move(*journal);
  for (const auto& [id, why] : l.journal_.loaded().closed) l.remember(id, why);
  return l;
}

void SessionLedger::remember(std::uint64_t id, Closed why) {
  // The oldest goes first, so the table never holds more than its bound.
  while (order_.size() >= kTombstones) {
    const auto [old, seq] = order_.front();
    order_.pop_front();
    if (const auto* c = closed_.find(old); c != nullptr && *c >> 8 == seq) closed_.erase(old);
  }
  closed_[id] = stamp(why, ++seq_);
  order_.emplace_back(id, seq_);
}

void SessionLedger::ended(std::uint64_t id, Closed why) {
  remember(id, why);
  journal_.closed(id, why);
}

void SessionLedger::released(std::uint64_t id) {
  if (!tombstone(id)) journal_.closed(id, Closed::kByOwner);
}

std::optional<Closed> SessionLedger::tombstone(std::uint64_t id) const {
  const auto* c = closed_.find(id);
  if (c == nullptr) return std::nullopt;
  return static_cast<Closed>(*c & 0xFF);
}

Owner* Owners::find(std::uint32_t id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

const Owner* Owners::find(std::uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

Owner* Owners::find(const OwnerKey& key) {
  auto k = by_key_.find(key);
  return k == by_key_.end() ? nullptr : find(k->second);
}

Owner& Owners::add(const OwnerKey& key) {
  const std::uint32_t id = next_++;
  Owner& o = by_id_[id];
  o.id = id;
  o.key = key;
  by_key_[key] = id;
  return o;
}

void Owners::erase(std::uint32_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  by_key_.erase(it->second.key);
  by_id_.erase(it);
}

std::size_t Owners::held(uid_t uid, pid_t pid) const {
  // Held handles count, except the connecting process's own: it may be
  // coming back for them.
  std::size_t n = 0;
  for (const auto& [id, o] : by_id_) n += o.client == 0 && o.key.uid == uid && o.key.pid != pid ? 1 : 0;
  return n;
}

std::size_t Owners::detached() const {
  std::size_t n = 0;
  for (const auto& [id, o] : by_id_) n += o.client == 0 ? 1 : 0;
  return n;
}

}  // namespace tandem::daemon
