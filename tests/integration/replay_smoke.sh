#!/usr/bin/env bash
# The main job in small (issue 7): scripts/replay on a handful of synthetic
# sessions, strongly compressed, with the binaries of the build under test.
# Asserts that every session of both runs completed, that every tool call ran
# in its session's cgroup (as root: the tool itself read /proc/self/cgroup),
# that nothing was left behind (scripts/replay fails when it had to clean up;
# none of its own runtime dirs, cgroups or processes remains) and that the result
# files are complete.
#
#   replay_smoke.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
out=$(mktemp -d /tmp/replay-smoke.XXXXXX)
trap 'rm -rf "$out"' EXIT


"$src/scripts/replay" --build "$build" --out "$out" --synthetic agentic --sessions 3 --rate 0.05 --compress 50 \
  --quiet > "$out/replay.log" 2>&1 || {
  echo "scripts/replay failed:"
  cat "$out/replay.log"
  exit 1
}

# What this run made (scripts/replay lists its runtime dirs, which name its
# cgroup subtrees too): none of it may remain. Only this run's names are
# looked for, so a replay running beside it cannot fail it.
[ -s "$out/run-dirs.txt" ] || { echo "scripts/replay wrote no run-dirs.txt"; exit 1; }
while read -r name; do
  left=$( {
    find /sys/fs/cgroup -mindepth 1 -maxdepth 12 -type d -name "$name" 2>/dev/null
    [ -e "/tmp/$name" ] && echo "/tmp/$name"
  } || true)
  if [ -n "$left" ]; then
    echo "left behind:"
    echo "$left"
    exit 1
  fi
  # tandemd, the engine and the agents carry their run's runtime dir in their
  # command line; tool processes sit in the cgroups checked above.
  if procs=$(pgrep -a -f "/tmp/$name"); then
    echo "processes left behind:"
    echo "$procs"
    exit 1
  fi
done < "$out/run-dirs.txt"

python3 - "$out" "$(id -u)" <<'EOF'
import json, os, sys
out, uid = sys.argv[1], int(sys.argv[2])
keys = ["e2e_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "slowdown_mean", "goodput_a1", "goodput_a2",
        "goodput_a3", "throughput_sps", "rounds_per_min", "tokens_per_s", "ttft_mean_s", "ttft_p99_s",
        "kv_hit_rate", "recomputed_tokens", "preemptions", "pinned_block_seconds", "gpu_busy", "tool_cpu_util",
        "tool_stretch_mean", "makespan_s", "capped_rounds", "completed"]
failures = []
def check(cond, what):
    if not cond:
        failures.append(what)

for name in ("results.json", "sim.json", "replay.png", "run-fcfs.json", "run-tandem.json"):
    check(os.path.getsize(os.path.join(out, name)) > 0, name + " is empty")
results = json.load(open(os.path.join(out, "results.json")))
sims = json.load(open(os.path.join(out, "sim.json")))
check([r["policy"] for r in results["runs"]] == ["fcfs", "tandem"], "results.json has one run per policy")
check(len(sims["runs"]) == 2, "sim.json has both predictions")
for run in results["runs"] + sims["runs"]:
    missing = [k for k in keys if k not in run["metrics"]]
    check(not missing, "%s lacks %s" % (run["policy"], missing))
    check(run["metrics"].get("completed") == 3, "%s completed %s of 3" % (run["policy"], run["metrics"].get("completed")))
for policy, tb in results["testbed"].items():
    check(tb["sessions"]["completed"] == 3 and not tb["sessions"]["failed"], policy + ": a session failed")
    tools = tb["tools"]
    check(tools["calls"] > 0, policy + ": no tool ran")
    check(tools["nonzero_exit"] == 0, policy + ": a tool failed")
    check(len(tb["e2e_s"]) == 3 and len(tb["ttft_s"]) == tb["rounds"], policy + ": records incomplete")
    if uid == 0:
        check(tb["daemon"]["reachable"] and tb["daemon"]["cgroups"] != "off", policy + ": tandemd ran without cgroups")
        check(tools["placed"] == tools["calls"], "%s: %d of %d tools placed" % (policy, tools["placed"], tools["calls"]))
        check(tools["verified_in_session_cgroup"] == tools["calls"],
              "%s: %d of %d tools saw their session's cgroup" % (policy, tools["verified_in_session_cgroup"],
                                                                  tools["calls"]))
    check(tb["engine"]["violations"] == 0, policy + ": engine violations")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
EOF
echo "replay smoke: both runs complete, tools in their cgroups, nothing left behind"
