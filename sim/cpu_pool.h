// The host's tool cores: weighted processor sharing (docs/sim.md "Tools").
//
// A tool call has a nominal wall time W and a CPU demand d (cores it uses
// while it runs uncontended). It progresses at rate r/d, where r ≤ d is the
// CPU it gets, and ends when its progress reaches W: uncontended it takes
// exactly W; when runnable demand exceeds the cores it stretches by d/r.
// Cores are shared by weighted max-min fairness (water-filling), as CFS
// shares them among cgroups by cpu.weight, each tool capped at its demand
// and at its session's CPU quota.
//
// Start phase: a process that starts (fork, exec, the runtime's loading)
// wants a whole core whatever its average demand, so a call may first run
// `start_cpu_s` CPU-seconds at one core before its body. Uncontended that
// adds start_cpu_s to its wall; on a busy core the start waits behind the
// others as a full-demand task does (docs/sim.md "Tools", the start phase;
// bench/contention_bench.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/clock.h"

namespace tandem::sim {

// Thread-safety: one thread.
class CpuPool {
 public:
  using Time = base::Time;
  explicit CpuPool(double cores) : cores_(cores) {}

  // Starts a tool call. demand ≥ 0 (clamped to at least 0.001 core). With
  // start_cpu_s > 0 the call first runs that much CPU at one core, then its
  // nominal_s at its demand.
  void start(std::uint64_t tool, std::uint64_t group, double demand_cores, double nominal_s, Time now,
             double start_cpu_s = 0);
  // Ends a tool call early (killed); returns false if it is not running.
  bool stop(std::uint64_t tool, Time now);
  // Weight (cpu.weight semantics, default 100) and quota (cores, 0 = none)
  // of every tool of `group`, now and for tools it starts later.
  void set_weight(std::uint64_t group, double weight, Time now);
  void set_quota(std::uint64_t group, double cores, Time now);
  void forget_group(std::uint64_t group);
  // Host memory (sim/host_memory.h): a tool stalled on memory runs at most
  // `speed` × its demand (it sleeps in reclaim or a memory.high penalty the
  // rest of the time); 0 stops it (frozen). Default 1.
  void set_speed(std::uint64_t tool, double speed, Time now);
  // Nominal seconds of progress the tool has made by `now` (0 if unknown,
  // and during its start phase).
  double progress(std::uint64_t tool, Time now);

  // When the next tool call ends (none when idle).
  std::optional<Time> next_completion() const { return next_; }
  // Advances to `now` and returns the tool calls that ended by then. With
  // `start_walls`, also each one's wall seconds in its start phase (0
  // without one), in the same order.
  std::vector<std::uint64_t> complete(Time now, std::vector<double>* start_walls = nullptr);

  double cores() const { return cores_; }
  std::size_t running() const { return tools_.size(); }
  double core_seconds() const { return core_seconds_; }
  // Share of recent time (10 s exponential window, in %) during which some
  // runnable tool wanted more CPU than it got: PSI's cpu "some avg10".
  double pressure_avg10() const { return psi_; }

 private:
  struct Tool {
    std::uint64_t group;
    double demand;
    double remaining_s;       // nominal seconds of progress left
    double start_left = 0;    // CPU-seconds of its start phase left (at one core)
    double start_wall_s = 0;  // wall seconds spent in its start phase so far
    double nominal_s = 0;
    double speed = 1;  // share of its demand it may run (memory stalls, freezing)
    double rate = 0;   // cores it gets now
  };
  struct Group {
    double weight = 100;
    double quota = 0;
  };
  void advance(Time now);
  void reshare(Time now);

  double cores_;
  std::unordered_map<std::uint64_t, Tool> tools_;
  std::unordered_map<std::uint64_t, Group> groups_;
  Time last_{};
  std::optional<Time> next_;
  double core_seconds_ = 0;
  double psi_ = 0;
  bool contended_ = false;
};

}  // namespace tandem::sim
