// tandem.hpp: a thin, header-only C++ wrapper over the C ABI of tandem.h.
//
// tandem::Client owns one tandem_client* (closed in the destructor) and is
// move-only. Its methods mirror the C calls one for one and return what they
// return (0 or -errno, counts, 0/1); nothing throws. Open with
// Client::open_engine() / open_runner(), which leave `ret` untouched on
// failure, like the C calls.
//
// Thread-safety: that of the handle: one thread at a time per Client.
#ifndef TANDEM_TANDEM_HPP
#define TANDEM_TANDEM_HPP

#include <cstdint>
#include <span>
#include <utility>

#include "tandem/tandem.h"

namespace tandem {

class Client {
 public:
  Client() noexcept = default;
  // Adopts `handle` (may be nullptr).
  explicit Client(tandem_client* handle) noexcept : handle_(handle) {}
  ~Client() { tandem_close(handle_); }

  Client(Client&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Client& operator=(Client&& other) noexcept {
    if (this != &other) {
      tandem_close(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  static int open_engine(const tandem_options* options, const tandem_engine_params& params, Client& ret) noexcept {
    tandem_client* h = nullptr;
    int r = tandem_engine_open(options, &params, &h);
    if (r == 0) ret = Client(h);
    return r;
  }
  static int open_runner(const tandem_options* options, Client& ret) noexcept {
    tandem_client* h = nullptr;
    int r = tandem_runner_open(options, &h);
    if (r == 0) ret = Client(h);
    return r;
  }

  static std::uint64_t session_id(const char* name) noexcept { return tandem_session_id(name); }
  static std::uint64_t tool_kind(const char* name) noexcept { return tandem_tool_kind(name); }

  tandem_client* get() const noexcept { return handle_; }
  // Gives up ownership without closing.
  [[nodiscard]] tandem_client* release() noexcept { return std::exchange(handle_, nullptr); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  bool connected() const noexcept { return tandem_connected(handle_) == 1; }
  std::uint32_t client_id() const noexcept { return tandem_client_id(handle_); }
  const char* last_error() const noexcept { return tandem_last_error(handle_); }
  int stats(tandem_client_stats& ret) const noexcept {
    ret.sz = sizeof ret;
    return tandem_get_stats(handle_, &ret);
  }

  int session_name(std::uint64_t session, const char* name) noexcept {
    return tandem_session_name(handle_, session, name);
  }

  // runner
  int session_open(const char* name, const tandem_session_hints* hints, std::uint64_t& ret_session) noexcept {
    return tandem_session_open(handle_, name, hints, &ret_session);
  }
  int session_close(std::uint64_t session, int reason = TANDEM_CLOSE_NORMAL) noexcept {
    return tandem_session_close(handle_, session, reason);
  }
  int tool_begin(std::uint64_t session, const char* tool_name, std::uint32_t call, std::int32_t pid) noexcept {
    return tandem_tool_begin(handle_, session, tool_name, call, pid);
  }
  int tool_end(std::uint64_t session, const char* tool_name, std::uint32_t call, std::int32_t exit_code,
               const tandem_tool_usage* usage = nullptr) noexcept {
    return tandem_tool_end(handle_, session, tool_name, call, exit_code, usage);
  }

  // engine
  // Tool processes (options may be null; ALLOW_UNPLACED, uid and gid are in it).
  int tool_spawn(std::uint64_t session, const char* tool_name, const char* const* argv, const char* const* envp,
                 const char* cwd, const tandem_tool_options* options, std::int32_t& ret_pid) noexcept {
    return tandem_tool_spawn(handle_, session, tool_name, argv, envp, cwd, options, &ret_pid);
  }
  int tool_wait(std::int32_t pid, int timeout_ms, tandem_tool_result& ret) noexcept {
    if (ret.sz == 0) ret.sz = sizeof ret;
    return tandem_tool_wait(handle_, pid, timeout_ms, &ret);
  }
  int tool_kill(std::int32_t pid) noexcept { return tandem_tool_kill(handle_, pid); }
  int tool_info(std::int32_t pid, tandem_tool_info& ret) noexcept {
    if (ret.sz == 0) ret.sz = sizeof ret;
    return tandem_tool_info_get(handle_, pid, &ret);
  }

  int round_submit(std::uint64_t session, const tandem_round& round) noexcept {
    return tandem_round_submit(handle_, session, &round);
  }
  int round_first_token(std::uint64_t session, std::uint32_t round, std::uint64_t queue_delay_ns,
                        std::uint64_t prefill_ns) noexcept {
    return tandem_round_first_token(handle_, session, round, queue_delay_ns, prefill_ns);
  }
  int round_end(std::uint64_t session, std::uint32_t round, std::uint32_t output_tokens, std::uint32_t blocks_held,
                bool tool_follows) noexcept {
    return tandem_round_end(handle_, session, round, output_tokens, blocks_held, tool_follows ? 1 : 0);
  }
  int kv_stats(const tandem_kv_stats& stats) noexcept { return tandem_kv_stats_report(handle_, &stats); }
  int kv_event(std::uint64_t session, int kind, std::uint32_t blocks, std::uint32_t round) noexcept {
    return tandem_kv_event(handle_, session, kind, blocks, round);
  }
  int kv_blocks(std::uint64_t session, const tandem_kv_blocks& blocks) noexcept {
    return tandem_kv_blocks_report(handle_, session, &blocks);
  }

  // directives
  int poll(int timeout_ms, std::span<tandem_directive> out) noexcept {
    const int max = out.size() > 0x7fffffff ? 0x7fffffff : static_cast<int>(out.size());
    return tandem_poll(handle_, timeout_ms, max, out.empty() ? nullptr : out.data());
  }
  int runnable(std::uint64_t session) noexcept { return tandem_session_runnable(handle_, session); }
  int priority(std::uint64_t session) noexcept { return tandem_session_priority(handle_, session); }

  // in-process step scheduling
  int plan_step(const tandem_step_input& input, tandem_step_plan& ret_plan) noexcept {
    return tandem_engine_plan_step(handle_, &input, &ret_plan);
  }
  int keep_decision(const tandem_round_end_info& info, int& ret_decision, std::int64_t& ret_until_ns) noexcept {
    return tandem_engine_keep_decision(handle_, &info, &ret_decision, &ret_until_ns);
  }
  const char* policy() const noexcept { return tandem_engine_policy(handle_); }

 private:
  tandem_client* handle_ = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_TANDEM_HPP
