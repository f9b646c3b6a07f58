// Socket messages: verification, one-datagram send/receive with SCM_RIGHTS,
// and the builders.
//
// Receive order matters for not leaking fds: recvmsg() installs every passed
// fd in our table before we can look at anything, so each one is put into a
// UniqueFd straight away and every later check may simply return.
#include "ipc/messages.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstring>

#include <fmt/format.h>

namespace tandem::ipc {
namespace {

// Verifier bounds. The schema nests Message → Resync → [SessionSnapshot], so
// real messages are 3–4 deep; 16 only stops a forged buffer from recursing.
// 4096 tables is more than a 64 KiB Resync can hold with names attached.
constexpr flatbuffers::uoffset_t kMaxDepth = 16;
constexpr flatbuffers::uoffset_t kMaxTables = 4096;
// Root offset + file identifier.
constexpr std::size_t kHeaderSize = sizeof(flatbuffers::uoffset_t) + flatbuffers::kFileIdentifierLength;
// flatbuffers reads scalars in place; its alignment check is relative to the
// buffer start, so the start itself must be aligned to the widest scalar.
constexpr std::size_t kBufferAlign = alignof(std::uint64_t);

// Receive-side control buffer: room for more fds than a message may carry, so
// a sender that attaches a few too many is reported as such. Beyond that the
// kernel sets MSG_CTRUNC and drops the excess fds itself (never installs them).
constexpr std::size_t kRecvFdRoom = kMaxMessageFds + 1;

std::vector<std::uint8_t> finish(flatbuffers::FlatBufferBuilder& fbb, wire::Payload type,
                                 flatbuffers::Offset<void> payload) {
  wire::FinishMessageBuffer(fbb, wire::CreateMessage(fbb, type, payload));
  const std::uint8_t* data = fbb.GetBufferPointer();
  return std::vector<std::uint8_t>(data, data + fbb.GetSize());
}

flatbuffers::Offset<flatbuffers::String> make_string(flatbuffers::FlatBufferBuilder& fbb, std::string_view s) {
  return fbb.CreateString(s.data(), s.size());
}

}  // namespace

base::Result<const wire::Message*> verify_message(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > kMaxMessageSize) {
    return base::make_error(
        EMSGSIZE, fmt::format("verify message: {} bytes exceeds the limit of {}", bytes.size(), kMaxMessageSize));
  }
  if (bytes.size() < kHeaderSize) {
    return base::make_error(
        EBADMSG, fmt::format("verify message: {} bytes is shorter than the {}-byte header", bytes.size(), kHeaderSize));
  }
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % kBufferAlign != 0) {
    return base::make_error(EINVAL, fmt::format("verify message: buffer is not {}-byte aligned", kBufferAlign));
  }
  if (!wire::MessageBufferHasIdentifier(bytes.data())) {
    return base::make_error(EBADMSG,
                            fmt::format("verify message: file identifier is not \"{}\"", wire::MessageIdentifier()));
  }
  flatbuffers::Verifier::Options options;
  options.max_depth = kMaxDepth;
  options.max_tables = kMaxTables;
  options.check_alignment = true;
  flatbuffers::Verifier verifier(bytes.data(), bytes.size(), options);
  if (!wire::VerifyMessageBuffer(verifier)) {
    return base::make_error(EBADMSG,
                            "verify message: flatbuffers verification failed (bad offsets, bounds, "
                            "depth or table count)");
  }
  const wire::Message* message = wire::GetMessage(bytes.data());
  // The generated verifier accepts NONE and types it does not know (it cannot
  // tell a newer peer from garbage); this build acts on neither.
  const wire::Payload type = message->payload_type();
  if (type == wire::Payload::NONE) return base::make_error(EBADMSG, "verify message: no payload");
  if (type > wire::Payload::MAX) {
    return base::make_error(EBADMSG,
                            fmt::format("verify message: unknown payload type {} (this build knows 1..{})",
                                        static_cast<unsigned>(type), static_cast<unsigned>(wire::Payload::MAX)));
  }
  // A type with no table verifies too (absent fields are legal), but every
  // reader would then have to expect payload_as_X() == nullptr.
  if (message->payload() == nullptr) {
    return base::make_error(
        EBADMSG, fmt::format("verify message: payload type {} without a payload table", wire::EnumNamePayload(type)));
  }
  // The verifier checks a vector's length word for 4-byte alignment only; the
  // elements of a vector of 8-byte scalars must be 8-aligned as well, or
  // reading one is a misaligned load (found by fuzz_messages). The builder
  // always aligns them. An empty vector has no element to misread, and the
  // builder leaves its (unused) data position 4-aligned only: a policy with
  // no parameters and an 8-byte name failed here.
  if (type == wire::Payload::PolicyConfig) {
    const auto* values = message->payload_as_PolicyConfig()->values();
    if (values != nullptr && values->size() != 0 &&
        reinterpret_cast<std::uintptr_t>(values->data()) % alignof(double) != 0) {
      return base::make_error(EBADMSG, "verify message: PolicyConfig.values is not 8-byte aligned");
    }
  }
  return message;
}

base::Result<void> send_message(int sock, std::span<const std::uint8_t> bytes, std::span<const int> fds) {
  // A 0-byte datagram is what the peer reads when we close: never send one.
  if (bytes.empty()) return base::make_error(EINVAL, "send message: empty message");
  if (bytes.size() > kMaxMessageSize) {
    return base::make_error(
        EMSGSIZE, fmt::format("send message: {} bytes exceeds the limit of {}", bytes.size(), kMaxMessageSize));
  }
  if (fds.size() > kMaxMessageFds) {
    return base::make_error(
        EINVAL, fmt::format("send message: {} fds, at most {} may be attached", fds.size(), kMaxMessageFds));
  }
  iovec iov{};
  // sendmsg() takes a non-const iovec but does not write through it.
  iov.iov_base = const_cast<std::uint8_t*>(bytes.data());
  iov.iov_len = bytes.size();
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  union {
    cmsghdr align;
    unsigned char buf[CMSG_SPACE(sizeof(int) * kMaxMessageFds)];
  } control;
  std::memset(&control, 0, sizeof control);
  if (!fds.empty()) {
    msg.msg_control = control.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return base::errno_error("send message: sendmsg");
  // SOCK_SEQPACKET sends a datagram whole or not at all; anything else means
  // the socket is not one.
  if (static_cast<std::size_t>(n) != bytes.size()) {
    return base::make_error(EIO, fmt::format("send message: short send ({} of {} bytes)", n, bytes.size()));
  }
  return {};
}

const wire::Message* ReceivedMessage::message() const {
  return bytes.empty() ? nullptr : wire::GetMessage(bytes.data());
}

base::Result<ReceivedMessage> recv_message(int sock) {
  ReceivedMessage out;
  // One byte more than the limit: a datagram of exactly kMaxMessageSize + 1
  // bytes then arrives whole and verify_message() reports its size.
  out.bytes.resize(kMaxMessageSize + 1);
  // Reserve before recvmsg() so taking ownership of the fds cannot allocate.
  out.fds.reserve(CMSG_SPACE(sizeof(int) * kRecvFdRoom) / sizeof(int));
  iovec iov{};
  iov.iov_base = out.bytes.data();
  iov.iov_len = out.bytes.size();
  union {
    cmsghdr align;
    unsigned char buf[CMSG_SPACE(sizeof(int) * kRecvFdRoom)];
  } control;
  std::memset(&control, 0, sizeof control);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.buf;
  msg.msg_controllen = sizeof control.buf;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return base::errno_error("receive message: recvmsg");

  // Own every fd that arrived before any check can return early.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0)) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof fd);
      out.fds.emplace_back(fd);
    }
  }

  if (n == 0) return base::make_error(ECONNRESET, "receive message: peer closed the connection");
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    return base::make_error(EMSGSIZE,
                            fmt::format("receive message: datagram exceeds the limit of {} bytes", kMaxMessageSize));
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return base::make_error(
        EBADMSG, fmt::format("receive message: ancillary data truncated (more than {} fds?)", kMaxMessageFds));
  }
  if (out.fds.size() > kMaxMessageFds) {
    return base::make_error(
        EBADMSG, fmt::format("receive message: {} fds attached, at most {} allowed", out.fds.size(), kMaxMessageFds));
  }
  out.bytes.resize(static_cast<std::size_t>(n));
  // Messages are usually far below the limit and may be queued by the caller.
  out.bytes.shrink_to_fit();
  auto verified = verify_message(out.bytes);
  if (!verified) return base::propagate(std::move(verified.error()), "receive message");
  return out;
}

std::vector<std::uint8_t> build_hello(wire::Role role, std::string_view name, std::int32_t pid,
                                      const std::optional<EngineInfo>& engine, std::uint64_t instance) {
  flatbuffers::FlatBufferBuilder fbb;
  auto name_offset = make_string(fbb, name);
  flatbuffers::Offset<wire::EngineParams> engine_offset;
  if (engine) {
    engine_offset =
        wire::CreateEngineParams(fbb, engine->gpu_index, engine->block_size, engine->total_blocks, engine->max_seqs,
                                 engine->token_budget, engine->saturating_tokens, engine->max_model_len);
  }
  auto hello = wire::CreateHello(fbb, kProtocolVersion, role, name_offset, pid, engine_offset, instance);
  return finish(fbb, wire::Payload::Hello, hello.Union());
}

std::vector<std::uint8_t> build_welcome(const WelcomeInfo& info) {
  flatbuffers::FlatBufferBuilder fbb;
  auto welcome = wire::CreateWelcome(fbb, kProtocolVersion, info.client_id, info.segment_size, info.event_slots,
                                     info.directive_slots, info.max_name, info.sessions_per_client,
                                     info.tools_per_session, info.tool_ahead);
  return finish(fbb, wire::Payload::Welcome, welcome.Union());
}

std::vector<std::uint8_t> build_error(std::int32_t code, std::string_view message, std::uint64_t session, bool fatal) {
  flatbuffers::FlatBufferBuilder fbb;
  auto text = make_string(fbb, message);
  auto error = wire::CreateError(fbb, code, text, session, fatal);
  return finish(fbb, wire::Payload::Error, error.Union());
}

std::vector<std::uint8_t> build_session_name(std::uint64_t session, std::string_view name) {
  flatbuffers::FlatBufferBuilder fbb;
  auto text = make_string(fbb, name);
  auto session_name = wire::CreateSessionName(fbb, session, text);
  return finish(fbb, wire::Payload::SessionName, session_name.Union());
}

std::vector<std::uint8_t> build_resync_request(std::string_view reason) {
  flatbuffers::FlatBufferBuilder fbb;
  auto text = make_string(fbb, reason);
  auto request = wire::CreateResyncRequest(fbb, text);
  return finish(fbb, wire::Payload::ResyncRequest, request.Union());
}

std::vector<std::uint8_t> build_resync(std::span<const SessionSnapshotInfo> sessions, bool more,
                                       std::uint64_t ring_position) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::SessionSnapshot>> items;
  items.reserve(sessions.size());
  for (const SessionSnapshotInfo& s : sessions) {
    auto name = make_string(fbb, s.name);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::ToolSnapshot>>> tools;
    if (!s.tools.empty()) {
      std::vector<flatbuffers::Offset<wire::ToolSnapshot>> t;
      t.reserve(s.tools.size());
      for (const ToolSnapshotInfo& tool : s.tools) {
        t.push_back(wire::CreateToolSnapshot(fbb, tool.call, tool.pid, tool.cgroup_id));
      }
      tools = fbb.CreateVector(t);
    }
    items.push_back(wire::CreateSessionSnapshot(fbb, s.session, name, s.state, s.residency, s.round, s.blocks_held,
                                                s.in_tool, s.tool_kind, tools));
  }
  auto vec = fbb.CreateVector(items);
  auto resync = wire::CreateResync(fbb, vec, more, ring_position);
  return finish(fbb, wire::Payload::Resync, resync.Union());
}

std::vector<std::uint8_t> build_policy_config(std::uint64_t epoch, std::string_view name,
                                              std::span<const std::string> keys, std::span<const double> values) {
  flatbuffers::FlatBufferBuilder fbb;
  auto name_offset = make_string(fbb, name);
  std::vector<flatbuffers::Offset<flatbuffers::String>> key_offsets;
  key_offsets.reserve(keys.size());
  for (const std::string& k : keys) key_offsets.push_back(make_string(fbb, k));
  auto keys_offset = fbb.CreateVector(key_offsets);
  auto values_offset = fbb.CreateVector(values.data(), values.size());
  auto config = wire::CreatePolicyConfig(fbb, epoch, name_offset, keys_offset, values_offset);
  return finish(fbb, wire::Payload::PolicyConfig, config.Union());
}

std::vector<std::uint8_t> build_ctl_request(std::string_view command, std::span<const std::string> args, bool json,
                                            std::string_view cursor) {
  flatbuffers::FlatBufferBuilder fbb;
  auto command_offset = make_string(fbb, command);
  std::vector<flatbuffers::Offset<flatbuffers::String>> arg_offsets;
  arg_offsets.reserve(args.size());
  for (const std::string& arg : args) arg_offsets.push_back(make_string(fbb, arg));
  auto args_offset = fbb.CreateVector(arg_offsets);
  auto cursor_offset = cursor.empty() ? flatbuffers::Offset<flatbuffers::String>() : make_string(fbb, cursor);
  auto request = wire::CreateCtlRequest(fbb, command_offset, args_offset, json, cursor_offset);
  return finish(fbb, wire::Payload::CtlRequest, request.Union());
}

std::vector<std::uint8_t> build_ctl_response(std::int32_t status, std::string_view body, std::string_view next) {
  flatbuffers::FlatBufferBuilder fbb;
  auto text = make_string(fbb, body);
  auto next_offset = next.empty() ? flatbuffers::Offset<flatbuffers::String>() : make_string(fbb, next);
  auto response = wire::CreateCtlResponse(fbb, status, text, next_offset);
  return finish(fbb, wire::Payload::CtlResponse, response.Union());
}

std::vector<std::uint8_t> build_tool_prepare(std::uint32_t request, std::uint64_t session, std::uint32_t call,
                                             std::uint64_t tool_kind, const ToolLimitsInfo& l, bool ahead) {
  flatbuffers::FlatBufferBuilder fbb;
  auto limits = wire::CreateToolLimits(fbb, l.cpu_quota_us, l.cpu_period_us, l.memory_high, l.memory_max, l.pids_max,
                                       l.low_priority);
  auto prepare = wire::CreateToolPrepare(fbb, request, session, call, tool_kind, limits, ahead);
  return finish(fbb, wire::Payload::ToolPrepare, prepare.Union());
}

std::vector<std::uint8_t> build_tool_placement(const ToolPlacementInfo& info) {
  flatbuffers::FlatBufferBuilder fbb;
  auto message = make_string(fbb, info.message);
  auto bwrap = make_string(fbb, info.bwrap);
  std::vector<flatbuffers::Offset<flatbuffers::String>> args;
  args.reserve(info.bwrap_args.size());
  for (const auto& a : info.bwrap_args) args.push_back(make_string(fbb, a));
  auto arg_vec = fbb.CreateVector(args);
  auto placement =
      wire::CreateToolPlacement(fbb, info.request, info.code, message, info.cgroup_id, info.has_v2, info.v1_count,
                                info.cpuacct_fd, info.memory_fd, info.cpu_fd, bwrap, arg_vec);
  return finish(fbb, wire::Payload::ToolPlacement, placement.Union());
}

ToolPlacementInfo parse_tool_placement(const wire::ToolPlacement& p) {
  ToolPlacementInfo info;
  info.request = p.request();
  info.code = p.code();
  info.message = p.message() != nullptr ? p.message()->str() : "";
  info.cgroup_id = p.cgroup_id();
  info.has_v2 = p.has_v2();
  info.v1_count = p.v1_count();
  info.cpuacct_fd = p.cpuacct_fd();
  info.memory_fd = p.memory_fd();
  info.cpu_fd = p.cpu_fd();
  info.bwrap = p.bwrap() != nullptr ? p.bwrap()->str() : "";
  if (p.bwrap_args() != nullptr) {
    for (const auto* a : *p.bwrap_args()) info.bwrap_args.push_back(a->str());
  }
  return info;
}

std::vector<std::uint8_t> build_tool_killed(std::uint64_t session, std::uint32_t call, std::uint8_t reason,
                                            std::string_view message) {
  flatbuffers::FlatBufferBuilder fbb;
  auto text = make_string(fbb, message);
  auto killed = wire::CreateToolKilled(fbb, session, call, reason, text);
  return finish(fbb, wire::Payload::ToolKilled, killed.Union());
}

}  // namespace tandem::ipc
