// Prints the C layout of every struct in tandem.h and tandem_gpu.h, and the
// ids of a few names, for tests/python/test_tandem.py: the ctypes mirrors in
// libclient/python/tandem/_ffi.py are compared with what the C compiler
// does, so the two cannot drift apart unnoticed.
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

void print_layouts() {
  SIZE(tandem_options);
  FIELD(tandem_options, sz);
  FIELD(tandem_options, runtime_dir);
  FIELD(tandem_options, name);
  FIELD(tandem_options, fallback_cap);
  FIELD(tandem_options, reconnect_min_ms);
  FIELD(tandem_options, reconnect_max_ms);

  SIZE(tandem_engine_params);
  FIELD(tandem_engine_params, sz);
  FIELD(tandem_engine_params, gpu_index);
  FIELD(tandem_engine_params, block_size);
  FIELD(tandem_engine_params, total_blocks);
  FIELD(tandem_engine_params, max_seqs);
  FIELD(tandem_engine_params, token_budget);
  FIELD(tandem_engine_params, saturating_tokens);
  FIELD(tandem_engine_params, max_model_len);

  SIZE(tandem_client_stats);
  FIELD(tandem_client_stats, sz);
  FIELD(tandem_client_stats, connects);
  FIELD(tandem_client_stats, disconnects);
  FIELD(tandem_client_stats, records_sent);
  FIELD(tandem_client_stats, records_dropped);
  FIELD(tandem_client_stats, directives);
  FIELD(tandem_client_stats, resyncs);
  FIELD(tandem_client_stats, tools_spawned);
  FIELD(tandem_client_stats, tools_unplaced);
  FIELD(tandem_client_stats, daemon_errors);
  FIELD(tandem_client_stats, sessions_refused);

  SIZE(tandem_session_hints);
  FIELD(tandem_session_hints, sz);
  FIELD(tandem_session_hints, priority_class);
  FIELD(tandem_session_hints, expected_rounds);

  SIZE(tandem_tool_usage);
  FIELD(tandem_tool_usage, sz);
  FIELD(tandem_tool_usage, wall_ns);
  FIELD(tandem_tool_usage, cpu_ns);
  FIELD(tandem_tool_usage, peak_memory_bytes);

  SIZE(tandem_tool_options);
  FIELD(tandem_tool_options, sz);
  FIELD(tandem_tool_options, cpu_quota_us);
  FIELD(tandem_tool_options, cpu_period_us);
  FIELD(tandem_tool_options, memory_high);
  FIELD(tandem_tool_options, memory_max);
  FIELD(tandem_tool_options, pids_max);
  FIELD(tandem_tool_options, low_priority);
  FIELD(tandem_tool_options, stdin_fd);
  FIELD(tandem_tool_options, stdout_fd);
  FIELD(tandem_tool_options, stderr_fd);
  FIELD(tandem_tool_options, flags);
  FIELD(tandem_tool_options, uid);
  FIELD(tandem_tool_options, gid);

  SIZE(tandem_tool_result);
  FIELD(tandem_tool_result, sz);
  FIELD(tandem_tool_result, exit_code);
  FIELD(tandem_tool_result, reason);
  FIELD(tandem_tool_result, wall_ns);
  FIELD(tandem_tool_result, cpu_ns);
  FIELD(tandem_tool_result, peak_memory_bytes);
  FIELD(tandem_tool_result, cgroup_id);
  FIELD(tandem_tool_result, message);
  FIELD(tandem_tool_result, flags);

  SIZE(tandem_tool_info);
  FIELD(tandem_tool_info, sz);
  FIELD(tandem_tool_info, session);
  FIELD(tandem_tool_info, cgroup_id);
  FIELD(tandem_tool_info, flags);
  FIELD(tandem_tool_info, uid);
  FIELD(tandem_tool_info, gid);

  SIZE(tandem_round);
  FIELD(tandem_round, sz);
  FIELD(tandem_round, round);
  FIELD(tandem_round, prompt_tokens);
  FIELD(tandem_round, cached_tokens);
  FIELD(tandem_round, projected_blocks);
  FIELD(tandem_round, max_output_tokens);

  SIZE(tandem_kv_stats);
  FIELD(tandem_kv_stats, sz);
  FIELD(tandem_kv_stats, blocks_total);
  FIELD(tandem_kv_stats, blocks_free);
  FIELD(tandem_kv_stats, blocks_pinned);
  FIELD(tandem_kv_stats, blocks_offloaded);
  FIELD(tandem_kv_stats, running_seqs);
  FIELD(tandem_kv_stats, waiting_seqs);
  FIELD(tandem_kv_stats, step_tokens);
  FIELD(tandem_kv_stats, step_time_us);
  FIELD(tandem_kv_stats, block_bytes);

  SIZE(tandem_directive);
  FIELD(tandem_directive, type);
  FIELD(tandem_directive, reserved);
  FIELD(tandem_directive, session);
  FIELD(tandem_directive, value);

  SIZE(tandem_step_request);
  FIELD(tandem_step_request, id);
  FIELD(tandem_step_request, session);
  FIELD(tandem_step_request, round);
  FIELD(tandem_step_request, phase);
  FIELD(tandem_step_request, prompt_tokens);
  FIELD(tandem_step_request, max_output_tokens);
  FIELD(tandem_step_request, computed_tokens);
  FIELD(tandem_step_request, output_tokens);
  FIELD(tandem_step_request, cached_tokens);
  FIELD(tandem_step_request, blocks_held);
  FIELD(tandem_step_request, arrival_ns);
  FIELD(tandem_step_request, last_scheduled_ns);
  FIELD(tandem_step_request, priority);
  FIELD(tandem_step_request, last_round);
  FIELD(tandem_step_request, reserved);

  SIZE(tandem_pinned_kv);
  FIELD(tandem_pinned_kv, session);
  FIELD(tandem_pinned_kv, blocks);
  FIELD(tandem_pinned_kv, reserved);
  FIELD(tandem_pinned_kv, pinned_at_ns);
  FIELD(tandem_pinned_kv, until_ns);

  SIZE(tandem_step_input);
  FIELD(tandem_step_input, sz);
  FIELD(tandem_step_input, token_budget);
  FIELD(tandem_step_input, max_seqs);
  FIELD(tandem_step_input, block_size);
  FIELD(tandem_step_input, free_blocks);
  FIELD(tandem_step_input, max_model_len);
  FIELD(tandem_step_input, saturating_tokens);
  FIELD(tandem_step_input, requests);
  FIELD(tandem_step_input, n_requests);
  FIELD(tandem_step_input, pinned);
  FIELD(tandem_step_input, n_pinned);
  FIELD(tandem_step_input, now_ns);

  SIZE(tandem_chunk);
  FIELD(tandem_chunk, request);
  FIELD(tandem_chunk, tokens);

  SIZE(tandem_step_plan);
  FIELD(tandem_step_plan, sz);
  FIELD(tandem_step_plan, run);
  FIELD(tandem_step_plan, n_run);
  FIELD(tandem_step_plan, preempt);
  FIELD(tandem_step_plan, n_preempt);
  FIELD(tandem_step_plan, unpin);
  FIELD(tandem_step_plan, n_unpin);
  FIELD(tandem_step_plan, swap);
  FIELD(tandem_step_plan, n_swap);

  SIZE(tandem_round_end_info);
  FIELD(tandem_round_end_info, sz);
  FIELD(tandem_round_end_info, session);
  FIELD(tandem_round_end_info, tool_follows);
  FIELD(tandem_round_end_info, tool_kind);
  FIELD(tandem_round_end_info, context_tokens);
  FIELD(tandem_round_end_info, blocks);
  FIELD(tandem_round_end_info, other_running_tokens);
  FIELD(tandem_round_end_info, now_ns);

  // tandem_gpu.h
  SIZE(tandem_gpu_partition);
  FIELD(tandem_gpu_partition, sms);

  SIZE(tandem_gpu_options);
  FIELD(tandem_gpu_options, sz);
  FIELD(tandem_gpu_options, backend);
  FIELD(tandem_gpu_options, ordinal);
  FIELD(tandem_gpu_options, stages);
  FIELD(tandem_gpu_options, n_stages);
  FIELD(tandem_gpu_options, partitions);
  FIELD(tandem_gpu_options, n_partitions);
  FIELD(tandem_gpu_options, decode_min_sms);
  FIELD(tandem_gpu_options, decode_max_sms);
  FIELD(tandem_gpu_options, decode_step_sms);
  FIELD(tandem_gpu_options, full_device);
  FIELD(tandem_gpu_options, stage_priorities);
  FIELD(tandem_gpu_options, sim_sms);

  SIZE(tandem_gpu_info);
  FIELD(tandem_gpu_info, sz);
  FIELD(tandem_gpu_info, device_name);
  FIELD(tandem_gpu_info, ordinal);
  FIELD(tandem_gpu_info, device_sms);
  FIELD(tandem_gpu_info, total_memory);
  FIELD(tandem_gpu_info, n_stages);
  FIELD(tandem_gpu_info, n_partitions);
  FIELD(tandem_gpu_info, active_partition);
  FIELD(tandem_gpu_info, reserved0);
  FIELD(tandem_gpu_info, switches);
  FIELD(tandem_gpu_info, bad_indices);
  FIELD(tandem_gpu_info, decode_sms);

  SIZE(tandem_profile_row);
  FIELD(tandem_profile_row, sm_count);
  FIELD(tandem_profile_row, reserved);
  FIELD(tandem_profile_row, latency_s);
  FIELD(tandem_profile_row, throughput);

  SIZE(tandem_weight_module_info);
  FIELD(tandem_weight_module_info, sz);
  FIELD(tandem_weight_module_info, index);
  FIELD(tandem_weight_module_info, slots);
  FIELD(tandem_weight_module_info, layers);
  FIELD(tandem_weight_module_info, layer_compute_us);
  FIELD(tandem_weight_module_info, bytes);
  FIELD(tandem_weight_module_info, name);

  SIZE(tandem_streamer_options);
  FIELD(tandem_streamer_options, sz);
  FIELD(tandem_streamer_options, layers);
  FIELD(tandem_streamer_options, slots);
  FIELD(tandem_streamer_options, layer_bytes);
  FIELD(tandem_streamer_options, layer_compute_us);
  FIELD(tandem_streamer_options, reserved);
  FIELD(tandem_streamer_options, link_bytes_per_s);

  SIZE(tandem_streamer_info);
  FIELD(tandem_streamer_info, sz);
  FIELD(tandem_streamer_info, layers);
  FIELD(tandem_streamer_info, slots);
  FIELD(tandem_streamer_info, layer_bytes);
  FIELD(tandem_streamer_info, device_bytes);
  FIELD(tandem_streamer_info, freed_bytes);
  FIELD(tandem_streamer_info, link_bytes_per_s);
  FIELD(tandem_streamer_info, required_bytes_per_s);
  FIELD(tandem_streamer_info, back_to_back_bytes_per_s);
  FIELD(tandem_streamer_info, slowdown_s_per_pass);
  FIELD(tandem_streamer_info, hidden);
  FIELD(tandem_streamer_info, next_layer);
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
