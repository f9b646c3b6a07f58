// Socket messages: every builder round-trips over a real SOCK_SEQPACKET pair;
// fds arrive as the same open files and O_CLOEXEC; and every way a datagram can
// be bad (closed peer, oversized, garbage, wrong identifier, unknown payload,
// truncated, too many fds) is an error that leaks no fd and leaves the socket
// usable.
#include "ipc/messages.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::ipc {
namespace {

using Bytes = std::vector<std::uint8_t>;

struct SocketPair {
  base::UniqueFd a;
  base::UniqueFd b;
};

SocketPair make_pair(int extra_flags = 0) {
  int sv[2] = {-1, -1};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | extra_flags, 0, sv), 0) << std::strerror(errno);
  // Room for the oversized datagrams below whatever the system default.
  int size = 512 * 1024;
  ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  return SocketPair{base::UniqueFd(sv[0]), base::UniqueFd(sv[1])};
}

std::size_t count_open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Sends `bytes` on a, receives on b; fails the test if either side fails.
ReceivedMessage round_trip(const Bytes& bytes, std::span<const int> fds = {}) {
  SocketPair p = make_pair();
  auto sent = send_message(p.a.get(), bytes, fds);
  EXPECT_TRUE(sent) << sent.error().message();
  auto got = recv_message(p.b.get());
  EXPECT_TRUE(got) << got.error().message();
  if (!got) return {};
  EXPECT_EQ(got->bytes, bytes);
  return std::move(*got);
}

template <class T>
void expect_error(const base::Result<T>& r, int code, std::string_view needle) {
  ASSERT_FALSE(r) << "expected an error containing \"" << needle << "\"";
  EXPECT_EQ(r.error().code(), code) << r.error().message();
  EXPECT_NE(r.error().context().find(needle), std::string::npos) << r.error().context();
}

// A Message whose payload type and table are chosen freely, which the
// builders never produce.
Bytes raw_message(wire::Payload type, bool with_table) {
  flatbuffers::FlatBufferBuilder fbb;
  flatbuffers::Offset<void> payload;
  if (with_table) payload = wire::CreateError(fbb, EIO).Union();
  wire::FinishMessageBuffer(fbb, wire::CreateMessage(fbb, type, payload));
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

Bytes resync_with(std::size_t sessions) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::SessionSnapshot>> snapshots;
  snapshots.reserve(sessions);
  for (std::size_t i = 0; i < sessions; ++i) snapshots.push_back(wire::CreateSessionSnapshot(fbb));
  auto resync = wire::CreateResync(fbb, fbb.CreateVector(snapshots));
  wire::FinishMessageBuffer(fbb, wire::CreateMessage(fbb, wire::Payload::Resync, resync.Union()));
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

// sendmsg() with `count` copies of `fd` attached, bypassing send_message()'s
// limit, as a hostile client would.
void send_raw_with_fds(int sock, const Bytes& bytes, int fd, std::size_t count) {
  std::vector<int> fds(count, fd);
  std::vector<unsigned char> control(CMSG_SPACE(sizeof(int) * count), 0);
  iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * count);
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * count);
  ASSERT_EQ(::sendmsg(sock, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size())) << std::strerror(errno);
}

// After a rejected datagram the connection must still carry the next one.
void expect_still_usable(const SocketPair& p) {
  Bytes next = build_error(ENOENT, "next");
  ASSERT_TRUE(send_message(p.a.get(), next));
  auto got = recv_message(p.b.get());
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->message()->payload_as_Error()->code(), ENOENT);
}

// --- Round trips -------------------------------------------------------------

TEST(Messages, HelloFromEngineRoundTrips) {
  EngineInfo engine{.gpu_index = 2, .block_size = 16, .total_blocks = 8192, .max_seqs = 256, .token_budget = 8192};
  ReceivedMessage m = round_trip(build_hello(wire::Role::Engine, "engine-0", 4242, engine));
  ASSERT_NE(m.message(), nullptr);
  const wire::Hello* hello = m.message()->payload_as_Hello();
  ASSERT_NE(hello, nullptr);
  EXPECT_EQ(hello->protocol_version(), kProtocolVersion);
  EXPECT_EQ(hello->role(), wire::Role::Engine);
  ASSERT_NE(hello->name(), nullptr);
  EXPECT_EQ(hello->name()->string_view(), "engine-0");
  EXPECT_EQ(hello->pid(), 4242);
  ASSERT_NE(hello->engine(), nullptr);
  EXPECT_EQ(hello->engine()->gpu_index(), 2);
  EXPECT_EQ(hello->engine()->block_size(), 16u);
  EXPECT_EQ(hello->engine()->total_blocks(), 8192u);
  EXPECT_EQ(hello->engine()->max_seqs(), 256u);
  EXPECT_EQ(hello->engine()->token_budget(), 8192u);
  EXPECT_TRUE(m.fds.empty());
}

TEST(Messages, HelloFromRunnerHasNoEngine) {
  ReceivedMessage m = round_trip(build_hello(wire::Role::Runner, "openhands-runner", 7));
  ASSERT_NE(m.message(), nullptr);
  const wire::Hello* hello = m.message()->payload_as_Hello();
  ASSERT_NE(hello, nullptr);
  EXPECT_EQ(hello->protocol_version(), kProtocolVersion);
  EXPECT_EQ(hello->role(), wire::Role::Runner);
  EXPECT_EQ(hello->name()->string_view(), "openhands-runner");
  EXPECT_EQ(hello->pid(), 7);
  EXPECT_EQ(hello->engine(), nullptr);
}

TEST(Messages, WelcomeRoundTrips) {
  ReceivedMessage m = round_trip(
      build_welcome({.client_id = 17, .segment_size = 1ull << 33, .event_slots = 4096, .directive_slots = 1024}));
  ASSERT_NE(m.message(), nullptr);
  const wire::Welcome* welcome = m.message()->payload_as_Welcome();
  ASSERT_NE(welcome, nullptr);
  EXPECT_EQ(welcome->protocol_version(), kProtocolVersion);
  EXPECT_EQ(welcome->client_id(), 17u);
  EXPECT_EQ(welcome->segment_size(), 1ull << 33);
  EXPECT_EQ(welcome->event_slots(), 4096u);
  EXPECT_EQ(welcome->directive_slots(), 1024u);
}

TEST(Messages, ErrorRoundTrips) {
  ReceivedMessage m = round_trip(build_error(EPERM, "role engine not granted to uid 1000"));
  ASSERT_NE(m.message(), nullptr);
  const wire::Error* error = m.message()->payload_as_Error();
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->code(), EPERM);
  EXPECT_EQ(error->message()->string_view(), "role engine not granted to uid 1000");
}

TEST(Messages, SessionNameRoundTrips) {
  ReceivedMessage m = round_trip(build_session_name(0xfedcba9876543210ull, "swe-bench/astropy-1234"));
  ASSERT_NE(m.message(), nullptr);
  const wire::SessionName* sn = m.message()->payload_as_SessionName();
  ASSERT_NE(sn, nullptr);
  EXPECT_EQ(sn->session(), 0xfedcba9876543210ull);
  EXPECT_EQ(sn->name()->string_view(), "swe-bench/astropy-1234");
}

TEST(Messages, ResyncRequestRoundTrips) {
  ReceivedMessage m = round_trip(build_resync_request("daemon restarted"));
  ASSERT_NE(m.message(), nullptr);
  const wire::ResyncRequest* rr = m.message()->payload_as_ResyncRequest();
  ASSERT_NE(rr, nullptr);
  EXPECT_EQ(rr->reason()->string_view(), "daemon restarted");
}

TEST(Messages, ResyncRoundTrips) {
  std::vector<SessionSnapshotInfo> sessions(2);
  sessions[0].session = 7;
  sessions[0].name = "agent-7";
  sessions[0].state = 2;
  sessions[0].round = 3;
  sessions[0].blocks_held = 40;
  sessions[0].in_tool = true;
  sessions[0].tool_kind = 99;
  sessions[1].session = 8;
  ReceivedMessage m = round_trip(build_resync(sessions, true));
  ASSERT_NE(m.message(), nullptr);
  const wire::Resync* r = m.message()->payload_as_Resync();
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->more());
  ASSERT_EQ(r->sessions()->size(), 2u);
  const wire::SessionSnapshot* s = r->sessions()->Get(0);
  EXPECT_EQ(s->session(), 7u);
  EXPECT_EQ(s->name()->string_view(), "agent-7");
  EXPECT_EQ(s->state(), 2);
  EXPECT_EQ(s->round(), 3u);
  EXPECT_EQ(s->blocks_held(), 40u);
  EXPECT_TRUE(s->in_tool());
  EXPECT_EQ(s->tool_kind(), 99u);
}

TEST(Messages, PolicyConfigRoundTripsWithAlignedValues) {
  const std::vector<std::string> keys = {"window_max", "residency"};
  const std::vector<double> values = {30.0, 1.0};
  Bytes bytes = build_policy_config(4, "tandem", keys, values);
  ReceivedMessage m = round_trip(bytes);
  ASSERT_NE(m.message(), nullptr);
  const wire::PolicyConfig* p = m.message()->payload_as_PolicyConfig();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->epoch(), 4u);
  EXPECT_EQ(p->name()->string_view(), "tandem");
  ASSERT_EQ(p->keys()->size(), 2u);
  EXPECT_EQ(p->keys()->Get(1)->string_view(), "residency");
  ASSERT_EQ(p->values()->size(), 2u);
  EXPECT_EQ(p->values()->Get(0), 30.0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p->values()->data()) % 8, 0u);
}

// Every policy name with no parameters verifies: the builder leaves an
// empty vector's data position 4-aligned only, and the verifier's 8-byte
// check on the values once refused names of 4 mod 8 bytes ("autellix"), so
// an engine told such a policy lost its connection at every Welcome.
TEST(Messages, PolicyConfigWithoutParametersVerifiesForEveryNameLength) {
  for (std::size_t len = 1; len <= 24; ++len) {
    const std::string name(len, 'p');
    Bytes bytes = build_policy_config(1, name, {}, {});
    ReceivedMessage m = round_trip(bytes);
    ASSERT_NE(m.message(), nullptr) << "name of " << len << " bytes";
    const wire::PolicyConfig* p = m.message()->payload_as_PolicyConfig();
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->name()->string_view(), name);
    EXPECT_EQ(p->values()->size(), 0u);
  }
}

TEST(Messages, ToolMessagesRoundTripWithEightFds) {
  ReceivedMessage prep =
      round_trip(build_tool_prepare(7, 0x1234, 0x80000001u, 42, ToolLimitsInfo{20000, 0, 64 << 20, 0, 512, true}));
  const wire::ToolPrepare* tp = prep.message()->payload_as_ToolPrepare();
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->request(), 7u);
  EXPECT_EQ(tp->call(), 0x80000001u);
  ASSERT_NE(tp->limits(), nullptr);
  EXPECT_EQ(tp->limits()->memory_high(), 64u << 20);
  EXPECT_TRUE(tp->limits()->low_priority());

  // A hybrid host's placement: the v2 directory and up to seven v1 ones.
  ToolPlacementInfo info;
  info.request = 7;
  info.cgroup_id = 99;
  info.has_v2 = true;
  info.v1_count = 7;
  info.memory_fd = 2;
  info.bwrap_args = {"--ro-bind", "/", "/"};
  std::vector<base::UniqueFd> pipes;
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    pipes.emplace_back(p[0]);
    pipes.emplace_back(p[1]);
    fds.push_back(p[0]);
    fds.push_back(p[1]);
  }
  ReceivedMessage placed = round_trip(build_tool_placement(info), fds);
  const wire::ToolPlacement* pl = placed.message()->payload_as_ToolPlacement();
  ASSERT_NE(pl, nullptr);
  EXPECT_EQ(placed.fds.size(), kMaxMessageFds);
  EXPECT_EQ(pl->v1_count(), 7);
  EXPECT_EQ(pl->memory_fd(), 2);
  EXPECT_EQ(pl->cpuacct_fd(), -1);  // the default: none
  EXPECT_EQ(pl->bwrap_args()->size(), 3u);
  // parse_tool_placement() gives back every field the builder took.
  const ToolPlacementInfo back = parse_tool_placement(*pl);
  EXPECT_EQ(back.request, 7u);
  EXPECT_EQ(back.cgroup_id, 99u);
  EXPECT_TRUE(back.has_v2);
  EXPECT_EQ(back.v1_count, 7);
  EXPECT_EQ(back.cpuacct_fd, -1);
  EXPECT_EQ(back.memory_fd, 2);
  EXPECT_EQ(back.cpu_fd, -1);
  EXPECT_EQ(back.bwrap_args, info.bwrap_args);
  info.code = ENOSPC;
  info.message = "full";
  info.bwrap = "/usr/bin/bwrap";
  info.cpu_fd = 1;
  ReceivedMessage refused = round_trip(build_tool_placement(info));
  const ToolPlacementInfo r = parse_tool_placement(*refused.message()->payload_as_ToolPlacement());
  EXPECT_EQ(r.code, ENOSPC);
  EXPECT_EQ(r.message, "full");
  EXPECT_EQ(r.bwrap, "/usr/bin/bwrap");
  EXPECT_EQ(r.cpu_fd, 1);

  ReceivedMessage killed = round_trip(build_tool_killed(0x1234, 3, 3, "stalled"));
  const wire::ToolKilled* k = killed.message()->payload_as_ToolKilled();
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->reason(), 3);
  EXPECT_EQ(k->message()->string_view(), "stalled");
}

TEST(Messages, CtlRequestRoundTrips) {
  const std::vector<std::string> args = {"--session", "abc", ""};
  ReceivedMessage m = round_trip(build_ctl_request("sessions", args, true));
  ASSERT_NE(m.message(), nullptr);
  const wire::CtlRequest* req = m.message()->payload_as_CtlRequest();
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(req->command()->string_view(), "sessions");
  EXPECT_TRUE(req->json());
  ASSERT_NE(req->args(), nullptr);
  ASSERT_EQ(req->args()->size(), 3u);
  EXPECT_EQ(req->args()->Get(0)->string_view(), "--session");
  EXPECT_EQ(req->args()->Get(1)->string_view(), "abc");
  EXPECT_EQ(req->args()->Get(2)->string_view(), "");
}

TEST(Messages, CtlRequestWithoutArgs) {
  ReceivedMessage m = round_trip(build_ctl_request("status", {}, false));
  ASSERT_NE(m.message(), nullptr);
  const wire::CtlRequest* req = m.message()->payload_as_CtlRequest();
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(req->command()->string_view(), "status");
  EXPECT_FALSE(req->json());
  ASSERT_NE(req->args(), nullptr);
  EXPECT_EQ(req->args()->size(), 0u);
}

TEST(Messages, CtlResponseRoundTrips) {
  // A body with an embedded NUL and a non-ASCII byte travels unchanged.
  using namespace std::string_literals;
  const std::string body = "line one\nline \0two \xc3\xa9"s;
  ASSERT_EQ(body.size(), 21u);
  ReceivedMessage m = round_trip(build_ctl_response(ENOENT, body));
  ASSERT_NE(m.message(), nullptr);
  const wire::CtlResponse* resp = m.message()->payload_as_CtlResponse();
  ASSERT_NE(resp, nullptr);
  EXPECT_EQ(resp->status(), ENOENT);
  EXPECT_EQ(resp->body()->string_view(), body);
}

TEST(Messages, LargestLegalMessageRoundTrips) {
  Bytes probe = build_ctl_response(0, "");
  // Grow the body until the message is exactly kMaxMessageSize.
  std::string body(kMaxMessageSize - probe.size(), 'x');
  Bytes bytes = build_ctl_response(0, body);
  while (bytes.size() > kMaxMessageSize) {
    body.pop_back();
    bytes = build_ctl_response(0, body);
  }
  ASSERT_GE(bytes.size(), kMaxMessageSize - 8);
  ReceivedMessage m = round_trip(bytes);
  ASSERT_NE(m.message(), nullptr);
  EXPECT_EQ(m.message()->payload_as_CtlResponse()->body()->size(), body.size());
}

// --- fds ---------------------------------------------------------------------

TEST(Messages, FdsArriveAsTheSameFilesAndCloexec) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  base::UniqueFd read_end(pipe_fds[0]);
  base::UniqueFd write_end(pipe_fds[1]);
  base::UniqueFd memfd(::memfd_create("messages-test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd);

  const int fds[] = {memfd.get(), write_end.get()};
  ReceivedMessage m = round_trip(build_welcome({.client_id = 1}), fds);
  ASSERT_EQ(m.fds.size(), 2u);
  for (const base::UniqueFd& fd : m.fds) {
    ASSERT_TRUE(fd);
    EXPECT_NE(fd.get(), memfd.get());
    EXPECT_NE(fd.get(), write_end.get());
    int flags = ::fcntl(fd.get(), F_GETFD);
    ASSERT_GE(flags, 0);
    EXPECT_TRUE(flags & FD_CLOEXEC) << "received fd " << fd.get() << " is not O_CLOEXEC";
  }

  // Order is kept: [0] is the memfd (same inode), [1] the pipe's write end.
  struct stat original {
  }, received{};
  ASSERT_EQ(::fstat(memfd.get(), &original), 0);
  ASSERT_EQ(::fstat(m.fds[0].get(), &received), 0);
  EXPECT_EQ(original.st_dev, received.st_dev);
  EXPECT_EQ(original.st_ino, received.st_ino);

  ASSERT_EQ(::write(m.fds[1].get(), "ping", 4), 4);
  char buf[8] = {};
  ASSERT_EQ(::read(read_end.get(), buf, sizeof buf), 4);
  EXPECT_STREQ(buf, "ping");
}

TEST(Messages, TooManyFdsIsAnErrorAndLeaksNone) {
  SocketPair p = make_pair();
  base::UniqueFd memfd(::memfd_create("messages-test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd);
  const std::size_t before = count_open_fds();

  // One more than allowed: the receive buffer has room for it, so this is
  // caught by the count check.
  send_raw_with_fds(p.a.get(), build_error(EIO, "x"), memfd.get(), kMaxMessageFds + 1);
  expect_error(recv_message(p.b.get()), EBADMSG, "fds attached");
  EXPECT_EQ(count_open_fds(), before);

  // Many more: the kernel truncates the ancillary data (MSG_CTRUNC).
  send_raw_with_fds(p.a.get(), build_error(EIO, "x"), memfd.get(), 12);
  expect_error(recv_message(p.b.get()), EBADMSG, "ancillary data truncated");
  EXPECT_EQ(count_open_fds(), before);

  expect_still_usable(p);
}

TEST(Messages, FdsWithAnInvalidMessageAreClosed) {
  SocketPair p = make_pair();
  base::UniqueFd memfd(::memfd_create("messages-test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd);
  const std::size_t before = count_open_fds();

  const int fds[] = {memfd.get(), memfd.get(), memfd.get()};
  const Bytes garbage(64, 0xab);
  ASSERT_TRUE(send_message(p.a.get(), garbage, fds));
  expect_error(recv_message(p.b.get()), EBADMSG, "verify message");
  EXPECT_EQ(count_open_fds(), before);
}

TEST(Messages, SendRefusesMoreThanMaxFds) {
  SocketPair p = make_pair();
  const int fds[kMaxMessageFds + 1] = {0, 0, 0, 0, 0};
  expect_error(send_message(p.a.get(), build_error(EIO, "x"), fds), EINVAL, "at most");
}

// --- Transport errors --------------------------------------------------------

TEST(Messages, PeerCloseIsConnReset) {
  SocketPair p = make_pair();
  p.a.reset();
  expect_error(recv_message(p.b.get()), ECONNRESET, "peer closed the connection");
}

TEST(Messages, SendToClosedPeerIsEpipe) {
  SocketPair p = make_pair();
  p.b.reset();
  expect_error(send_message(p.a.get(), build_error(EIO, "x")), EPIPE, "sendmsg");
}

TEST(Messages, SendNeverRaisesSigpipe) {
  // Linux raises no SIGPIPE for a SOCK_SEQPACKET send to a closed peer, but a
  // stream socket does, so a stream pair is what shows MSG_NOSIGNAL is set.
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  base::UniqueFd a(sv[0]);
  ::close(sv[1]);
  // SIGPIPE may be inherited as ignored, which would hide one; make it
  // deliverable but blocked, so a raised SIGPIPE stays pending where we can
  // see it instead of killing the test.
  struct sigaction dfl {
  }, old_action{};
  dfl.sa_handler = SIG_DFL;
  ASSERT_EQ(::sigaction(SIGPIPE, &dfl, &old_action), 0);
  sigset_t pipe_set, old_mask;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask), 0);

  auto sent = send_message(a.get(), build_error(EIO, "x"));
  sigset_t pending;
  sigemptyset(&pending);
  ::sigpending(&pending);
  const bool raised = sigismember(&pending, SIGPIPE) == 1;
  if (raised) {
    const timespec zero{};
    ::sigtimedwait(&pipe_set, nullptr, &zero);
  }
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGPIPE, &old_action, nullptr);

  EXPECT_FALSE(raised) << "send_message raised SIGPIPE";
  expect_error(sent, EPIPE, "sendmsg");
}

TEST(Messages, NonBlockingEmptySocketIsEagain) {
  SocketPair p = make_pair(SOCK_NONBLOCK);
  auto r = recv_message(p.b.get());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EAGAIN) << r.error().message();
}

TEST(Messages, SendRefusesEmptyAndOversizedMessages) {
  SocketPair p = make_pair();
  expect_error(send_message(p.a.get(), Bytes{}), EINVAL, "empty");
  expect_error(send_message(p.a.get(), Bytes(kMaxMessageSize + 1, 0)), EMSGSIZE, "exceeds the limit");
}

TEST(Messages, OversizedDatagramIsEmsgsizeAndSocketStaysUsable) {
  SocketPair p = make_pair();
  // One byte over arrives whole (the buffer has that byte) and fails on size.
  Bytes just_over(kMaxMessageSize + 1, 0);
  ASSERT_EQ(::send(p.a.get(), just_over.data(), just_over.size(), MSG_NOSIGNAL), static_cast<ssize_t>(just_over.size()))
      << std::strerror(errno);
  expect_error(recv_message(p.b.get()), EMSGSIZE, "exceeds the limit");
  expect_still_usable(p);

  // Far over: the kernel truncates it (MSG_TRUNC) and drops the rest.
  Bytes far_over(100 * 1024, 0);
  ASSERT_EQ(::send(p.a.get(), far_over.data(), far_over.size(), MSG_NOSIGNAL), static_cast<ssize_t>(far_over.size()))
      << std::strerror(errno);
  expect_error(recv_message(p.b.get()), EMSGSIZE, "datagram exceeds the limit");
  expect_still_usable(p);
}

// --- Malformed content -------------------------------------------------------

TEST(Messages, GarbageIsBadMessage) {
  SocketPair p = make_pair();
  const Bytes garbage = {0xde, 0xad, 0xbe, 0xef, 'T', 'N', 'D', 'M', 0xff, 0xff, 0xff, 0x7f};
  ASSERT_TRUE(send_message(p.a.get(), garbage));
  expect_error(recv_message(p.b.get()), EBADMSG, "verification failed");
  // At the limit but not over it: malformed, not oversized.
  ASSERT_TRUE(send_message(p.a.get(), Bytes(kMaxMessageSize, 0x41)));
  expect_error(recv_message(p.b.get()), EBADMSG, "verify message");
  // Shorter than root offset + identifier.
  ASSERT_TRUE(send_message(p.a.get(), Bytes{1, 2, 3}));
  expect_error(recv_message(p.b.get()), EBADMSG, "shorter than");
  expect_still_usable(p);
}

TEST(Messages, WrongIdentifierIsBadMessage) {
  Bytes bytes = build_error(EIO, "x");
  ASSERT_TRUE(verify_message(bytes));
  bytes[4] = 'X';  // "XNDM"
  expect_error(verify_message(bytes), EBADMSG, "file identifier");

  SocketPair p = make_pair();
  ASSERT_TRUE(send_message(p.a.get(), bytes));
  expect_error(recv_message(p.b.get()), EBADMSG, "file identifier");
}

TEST(Messages, UnknownOrMissingPayloadIsRejected) {
  // The same buffer with a known type verifies, so the rejections below are
  // about the type alone.
  ASSERT_TRUE(verify_message(raw_message(wire::Payload::Error, true)));

  const auto next = static_cast<wire::Payload>(static_cast<unsigned>(wire::Payload::MAX) + 1);
  expect_error(verify_message(raw_message(next, true)), EBADMSG, "unknown payload type");
  expect_error(verify_message(raw_message(static_cast<wire::Payload>(255), true)), EBADMSG, "unknown payload type");
  expect_error(verify_message(raw_message(wire::Payload::NONE, false)), EBADMSG, "no payload");
  expect_error(verify_message(raw_message(wire::Payload::NONE, true)), EBADMSG, "no payload");
  expect_error(verify_message(raw_message(wire::Payload::Hello, false)), EBADMSG, "without a payload table");

  SocketPair p = make_pair();
  ASSERT_TRUE(send_message(p.a.get(), raw_message(next, true)));
  expect_error(recv_message(p.b.get()), EBADMSG, "unknown payload type");
}

TEST(Messages, EveryTruncationIsBadMessage) {
  // These messages end in a field or a string terminator, not alignment
  // padding, so every strict prefix cuts into data the message references.
  // (A builder may append up to 3 pad bytes after a string, and cutting only
  // those would leave a valid message.)
  const Bytes messages[] = {
      build_welcome({.client_id = 3, .segment_size = 1 << 20, .event_slots = 64, .directive_slots = 64}),
      build_ctl_response(0, "abc"),
      build_session_name(99, "1234567"),
      build_hello(wire::Role::Engine, "eng", 1, EngineInfo{.block_size = 16}),
  };
  for (const Bytes& full : messages) {
    ASSERT_TRUE(verify_message(full));
    for (std::size_t len = 0; len < full.size(); ++len) {
      const Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
      auto r = verify_message(prefix);
      ASSERT_FALSE(r) << "prefix of " << len << " of " << full.size() << " bytes verified";
      EXPECT_EQ(r.error().code(), EBADMSG) << r.error().message();
    }
  }
}

TEST(Messages, VerifyEnforcesSizeAlignmentAndTableCount) {
  expect_error(verify_message(Bytes(kMaxMessageSize + 1, 0)), EMSGSIZE, "exceeds the limit");

  // Same bytes one byte off an 8-byte boundary.
  const Bytes good = build_error(EIO, "x");
  alignas(8) std::uint8_t storage[256] = {};
  ASSERT_LT(good.size() + 1, sizeof storage);
  std::memcpy(storage + 1, good.data(), good.size());
  expect_error(verify_message(std::span<const std::uint8_t>(storage + 1, good.size())), EINVAL, "aligned");
  std::memcpy(storage, good.data(), good.size());
  EXPECT_TRUE(verify_message(std::span<const std::uint8_t>(storage, good.size())));

  // Message + Resync + 4000 snapshots fits the table limit; 5000 does not.
  const Bytes ok = resync_with(4000);
  ASSERT_LE(ok.size(), kMaxMessageSize);
  auto verified = verify_message(ok);
  ASSERT_TRUE(verified) << verified.error().message();
  EXPECT_EQ((*verified)->payload_as_Resync()->sessions()->size(), 4000u);
  const Bytes too_many = resync_with(5000);
  ASSERT_LE(too_many.size(), kMaxMessageSize);
  expect_error(verify_message(too_many), EBADMSG, "table count");
}

TEST(Messages, VerifyReturnsTheRootInsideTheBuffer) {
  const Bytes bytes = build_session_name(5, "s");
  auto m = verify_message(bytes);
  ASSERT_TRUE(m);
  auto* p = reinterpret_cast<const std::uint8_t*>(*m);
  EXPECT_GE(p, bytes.data());
  EXPECT_LT(p, bytes.data() + bytes.size());
  EXPECT_EQ((*m)->payload_as_SessionName()->session(), 5u);
}

TEST(Messages, MissingRequiredFieldIsBadMessage) {
  // Built field by field, as a hostile client would: a Hello without a name
  // (the generated builder would refuse to finish it).
  flatbuffers::FlatBufferBuilder fbb;
  auto start = fbb.StartTable();
  fbb.AddElement<std::uint32_t>(wire::Hello::VT_PROTOCOL_VERSION, kProtocolVersion, 0);
  fbb.AddElement<std::uint8_t>(wire::Hello::VT_ROLE, static_cast<std::uint8_t>(wire::Role::Runner), 0);
  flatbuffers::Offset<wire::Hello> hello(fbb.EndTable(start));
  wire::FinishMessageBuffer(fbb, wire::CreateMessage(fbb, wire::Payload::Hello, hello.Union()));
  Bytes bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  expect_error(verify_message(bytes), EBADMSG, "verification failed");
  // With a name, as build_hello() always writes it, it verifies.
  EXPECT_TRUE(verify_message(build_hello(wire::Role::Runner, "runner", 1)));
}

}  // namespace
}  // namespace tandem::ipc
