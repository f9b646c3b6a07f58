// libFuzzer target for verify_message(): the daemon runs it on every datagram
// a client sends, so it must reject anything it cannot read safely.
//
// Rejection alone proves little; the point is what happens after acceptance.
// For every buffer that verifies, this reads every field of every table the
// payload can reach (strings byte by byte, vectors element by element), so a
// gap in the verifier becomes an out-of-bounds read that ASan reports.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ipc/messages.h"

namespace {

namespace wire = tandem::wire;

// Folds everything read into one value the optimiser cannot drop.
struct Sink {
  std::uint64_t acc = 0;

  void add(std::uint64_t v) { acc = acc * 1099511628211ull ^ v; }

  void add_string(const flatbuffers::String* s) {
    if (s == nullptr) return add(0);
    add(s->size());
    for (std::uint8_t c : std::span(reinterpret_cast<const std::uint8_t*>(s->data()), s->size())) add(c);
    add(static_cast<std::uint8_t>(s->c_str()[s->size()]));  // the terminator the verifier checked
  }
};

void walk(Sink& sink, const wire::EngineParams* e) {
  if (e == nullptr) return sink.add(0);
  sink.add(static_cast<std::uint32_t>(e->gpu_index()));
  sink.add(e->block_size());
  sink.add(e->total_blocks());
  sink.add(e->max_seqs());
  sink.add(e->token_budget());
  sink.add(e->saturating_tokens());
  sink.add(e->max_model_len());
}

void walk(Sink& sink, const wire::Hello* m) {
  sink.add(m->protocol_version());
  sink.add(static_cast<std::uint8_t>(m->role()));
  sink.add(wire::EnumNameRole(m->role())[0]);  // must not index out of the names table
  sink.add_string(m->name());
  sink.add(static_cast<std::uint32_t>(m->pid()));
  walk(sink, m->engine());
}

void walk(Sink& sink, const wire::Welcome* m) {
  sink.add(m->protocol_version());
  sink.add(m->client_id());
  sink.add(m->segment_size());
  sink.add(m->event_slots());
  sink.add(m->directive_slots());
}

void walk(Sink& sink, const wire::Error* m) {
  sink.add(static_cast<std::uint32_t>(m->code()));
  sink.add_string(m->message());
}

void walk(Sink& sink, const wire::SessionName* m) {
  sink.add(m->session());
  sink.add_string(m->name());
}

void walk(Sink& sink, const wire::ResyncRequest* m) { sink.add_string(m->reason()); }

void walk(Sink& sink, const wire::SessionSnapshot* s) {
  if (s == nullptr) return sink.add(0);
  sink.add(s->session());
  sink.add_string(s->name());
  sink.add(s->state());
  sink.add(s->residency());
  sink.add(s->round());
  sink.add(s->blocks_held());
  sink.add(s->in_tool());
  sink.add(s->tool_kind());
}

void walk(Sink& sink, const wire::Resync* m) {
  const auto* sessions = m->sessions();
  if (sessions == nullptr) return sink.add(0);
  sink.add(sessions->size());
  for (flatbuffers::uoffset_t i = 0; i < sessions->size(); ++i) walk(sink, sessions->Get(i));
}

void walk(Sink& sink, const wire::CtlRequest* m) {
  sink.add_string(m->command());
  sink.add(m->json());
  const auto* args = m->args();
  if (args == nullptr) return sink.add(0);
  sink.add(args->size());
  for (flatbuffers::uoffset_t i = 0; i < args->size(); ++i) sink.add_string(args->Get(i));
}

void walk(Sink& sink, const wire::CtlResponse* m) {
  sink.add(static_cast<std::uint32_t>(m->status()));
  sink.add_string(m->body());
}

void walk(Sink& sink, const wire::PolicyConfig* m) {
  sink.add(m->epoch());
  sink.add_string(m->name());
  if (const auto* keys = m->keys(); keys != nullptr) {
    sink.add(keys->size());
    for (flatbuffers::uoffset_t i = 0; i < keys->size(); ++i) sink.add_string(keys->Get(i));
  }
  if (const auto* values = m->values(); values != nullptr) {
    sink.add(values->size());
    for (flatbuffers::uoffset_t i = 0; i < values->size(); ++i)
      sink.add(std::bit_cast<std::uint64_t>(values->Get(i)));  // any bits, NaN included
  }
}

void walk(Sink& sink, const wire::ToolPrepare* m) {
  sink.add(m->request());
  sink.add(m->session());
  sink.add(m->call());
  sink.add(m->tool_kind());
  if (const wire::ToolLimits* l = m->limits(); l != nullptr) {
    sink.add(l->cpu_quota_us());
    sink.add(l->cpu_period_us());
    sink.add(l->memory_high());
    sink.add(l->memory_max());
    sink.add(l->pids_max());
    sink.add(l->low_priority());
  }
}

void walk(Sink& sink, const wire::ToolPlacement* m) {
  sink.add(m->request());
  sink.add(static_cast<std::uint32_t>(m->code()));
  sink.add_string(m->message());
  sink.add(m->cgroup_id());
  sink.add(m->has_v2());
  sink.add(m->v1_count());
  sink.add(static_cast<std::uint8_t>(m->cpuacct_fd()));
  sink.add(static_cast<std::uint8_t>(m->memory_fd()));
  sink.add(static_cast<std::uint8_t>(m->cpu_fd()));
  sink.add_string(m->bwrap());
  if (const auto* args = m->bwrap_args(); args != nullptr) {
    sink.add(args->size());
    for (flatbuffers::uoffset_t i = 0; i < args->size(); ++i) sink.add_string(args->Get(i));
  }
}

void walk(Sink& sink, const wire::ToolKilled* m) {
  sink.add(m->session());
  sink.add(m->call());
  sink.add(m->reason());
  sink.add_string(m->message());
}

// verify_message() promises a known type with a table; trap if it lied.
template <class T>
void walk_payload(Sink& sink, const T* payload) {
  if (payload == nullptr) __builtin_trap();
  walk(sink, payload);
}

void walk(Sink& sink, const wire::Message* m) {
  sink.add(static_cast<std::uint8_t>(m->payload_type()));
  switch (m->payload_type()) {
    case wire::Payload::Hello:
      return walk_payload(sink, m->payload_as_Hello());
    case wire::Payload::Welcome:
      return walk_payload(sink, m->payload_as_Welcome());
    case wire::Payload::Error:
      return walk_payload(sink, m->payload_as_Error());
    case wire::Payload::SessionName:
      return walk_payload(sink, m->payload_as_SessionName());
    case wire::Payload::ResyncRequest:
      return walk_payload(sink, m->payload_as_ResyncRequest());
    case wire::Payload::Resync:
      return walk_payload(sink, m->payload_as_Resync());
    case wire::Payload::CtlRequest:
      return walk_payload(sink, m->payload_as_CtlRequest());
    case wire::Payload::CtlResponse:
      return walk_payload(sink, m->payload_as_CtlResponse());
    case wire::Payload::PolicyConfig:
      return walk_payload(sink, m->payload_as_PolicyConfig());
    case wire::Payload::ToolPrepare:
      return walk_payload(sink, m->payload_as_ToolPrepare());
    case wire::Payload::ToolPlacement:
      return walk_payload(sink, m->payload_as_ToolPlacement());
    case wire::Payload::ToolKilled:
      return walk_payload(sink, m->payload_as_ToolKilled());
    case wire::Payload::NONE:
      break;
  }
  __builtin_trap();  // NONE or an unknown type got through verify_message()
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Copy into a buffer of exactly `size` bytes (so ASan sees any overread at
  // its end) that starts on a heap allocation's alignment, as a received
  // message does.
  std::vector<std::uint8_t> bytes(data, data + size);
  auto message = tandem::ipc::verify_message(bytes);
  if (!message) {
    const int code = message.error().code();
    if (code != EBADMSG && code != EMSGSIZE) __builtin_trap();  // only these for an aligned buffer
    return 0;
  }
  Sink sink;
  walk(sink, *message);
  // Keep the reads observable.
  volatile std::uint64_t out = sink.acc;
  (void)out;
  return 0;
}
