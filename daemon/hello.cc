// The handshake's verdict on a Hello (daemon/hello.h).
#include "daemon/hello.h"

#include <cerrno>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "base/text.h"
#include "daemon/server_parts.h"
#include "ipc/messages.h"

namespace tandem::daemon {
namespace {

HelloVerdict refused(int code, std::string why) {
  HelloVerdict v;
  v.code = code;
  v.why = std::move(why);
  return v;
}

}  // namespace

HelloVerdict judge_hello(const wire::Hello& hello, const CompiledConfig& config, uid_t uid, gid_t gid,
                         uid_t daemon_euid, const Clients& clients) {
  const Config& cfg = config.config();
  if (hello.protocol_version() != ipc::kProtocolVersion) {
    return refused(EPROTONOSUPPORT, fmt::format("protocol version {} is not supported: tandemd speaks version {}",
                                                hello.protocol_version(), ipc::kProtocolVersion));
  }
  const std::optional<Role> role = role_from_wire(hello.role());
  if (!role) return refused(EINVAL, fmt::format("unknown role {}", static_cast<unsigned>(hello.role())));
  const std::string_view name = hello.name()->string_view();
  if (auto ok = base::check_name(name, "client name"); !ok) {
    HelloVerdict v = refused(ok.error().code(), ok.error().context());
    v.bad_name = true;
    return v;
  }
  if (!config.allowed(*role, uid, gid, daemon_euid)) {
    return refused(EACCES, fmt::format("uid {} (gid {}) may not connect as {}: see [roles.{}] in {}", uid, gid,
                                       to_string(*role), to_string(*role), cfg.source));
  }
  if (*role == Role::kCtlRead || *role == Role::kCtlAdmin) {
    // Readers never take the slots kept for engines and runners, whoever
    // they are.
    if (std::string refusal = clients.ctl_refusal(cfg.limits); !refusal.empty()) {
      HelloVerdict v = refused(EAGAIN, std::move(refusal));
      v.over_limit = true;
      return v;
    }
  }
  HelloVerdict v;
  v.identified = true;
  HelloTerms& terms = v.terms;
  terms.role = *role;
  terms.name = std::string(name);
  terms.instance = hello.instance();
  auto refuse = [&v](int code, std::string why) {
    v.code = code;
    v.why = std::move(why);
    return std::move(v);
  };
  const wire::EngineParams* p = hello.engine();
  if (*role == Role::kEngine) {
    if (p == nullptr) return refuse(EINVAL, "an engine's Hello must carry its engine parameters");
    const char* bad = p->block_size() == 0     ? "block_size"
                      : p->total_blocks() == 0 ? "total_blocks"
                      : p->max_seqs() == 0     ? "max_seqs"
                      : p->token_budget() == 0 ? "token_budget"
                                               : nullptr;
    if (bad != nullptr) return refuse(EINVAL, fmt::format("engine parameter {} must be > 0", bad));
    terms.engine.block_size = p->block_size();
    terms.engine.total_blocks = p->total_blocks();
    terms.engine.max_seqs = p->max_seqs();
    terms.engine.token_budget = p->token_budget();
    if (p->max_model_len() > 0) terms.engine.max_model_len = p->max_model_len();
    terms.gpu_index = p->gpu_index();
    terms.saturating_tokens = p->saturating_tokens();
  } else if (p != nullptr) {
    return refuse(EINVAL,
                  fmt::format("only an engine's Hello carries engine parameters, not a {}'s", to_string(*role)));
  }
  v.taken = true;
  return v;
}

}  // namespace tandem::daemon
