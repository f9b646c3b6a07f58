#!/usr/bin/env bash
# tandem-sim's command line: bad input is refused with a message naming the
# problem (exit 2), and a small run over every policy writes a complete JSON
# report with exactly the issue's metric keys.
#   cli_test.sh TANDEM_SIM TRACE
set -euo pipefail
sim=$1
trace=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "cli_test: $*" >&2; exit 1; }

# expect_error EXPECTED_SUBSTRING ARGS...: exit 2 and the substring on stderr.
expect_error() {
  local want=$1; shift
  local rc=0
  "$sim" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  [ "$rc" -eq 2 ] || fail "'$*' exited $rc, not 2"
  grep -qF -- "$want" "$dir/err" || fail "'$*' did not say '$want': $(cat "$dir/err")"
}

expect_error "unknown policy 'lottery'" --synthetic mars-short --preset h100-llama3-8b --rate 1 --policies fcfs,lottery
expect_error "unknown preset 'a100'" --synthetic mars-short --preset a100 --rate 1
expect_error "exactly one of --trace" --preset h100-llama3-8b --rate 1
expect_error "--rate R or --sweep" --synthetic mars-short --preset h100-llama3-8b
expect_error "not a positive rate" --synthetic mars-short --preset h100-llama3-8b --sweep 0.1,-2
expect_error "window_max" --synthetic mars-short --preset h100-llama3-8b --rate 1 --policies mars --param mars.window_max=-1
expect_error "unknown synthetic" --synthetic nope --preset h100-llama3-8b --rate 1
expect_error "unknown argument '--bogus'" --bogus
printf '{"id":"a","rounds":[{"input_tokens":10,"output_tokens":5,"tool":null}]}\n{"id":"b","rounds":[{"input_tokens":"many"}]}\n' >"$dir/bad.jsonl"
expect_error "bad.jsonl:2" --trace "$dir/bad.jsonl" --preset h100-llama3-8b --rate 1
expect_error "$dir/missing.jsonl" --trace "$dir/missing.jsonl" --preset h100-llama3-8b --rate 1
expect_error "leave no session" --trace "$trace" --preset h100-llama3-8b --rate 1 --exclude-source "tandem tests"
expect_error "apply to --trace only" --synthetic mars-short --preset h100-llama3-8b --rate 1 --source x
expect_error "tool memory entry 'pytest=x'" --synthetic mars-short --preset h100-llama3-8b --rate 1 --tool-mem pytest=x
expect_error "need --tool-mem" --synthetic mars-short --preset h100-llama3-8b --rate 1 --host-mem-gib 4
expect_error "need --tool-mem" --synthetic mars-short --preset h100-llama3-8b --rate 1 --tool-mem-cap-mib 4096
expect_error "--tool-mem-cap-mib: '-1' is not a number >= 0" --synthetic agentic-mem --preset h100-llama3-8b --rate 1 --tool-mem-cap-mib -1
expect_error "is not tandem, all or none" --synthetic mars-short --preset h100-llama3-8b --rate 1 --host-rules some
expect_error "--tool-start-ms: '-5' is not a number of ms" --synthetic mars-short --preset h100-llama3-8b --rate 1 --tool-start-ms -5
expect_error "--tool-start-ms: 'x' is not a number of ms" --synthetic mars-short --preset h100-llama3-8b --rate 1 --tool-start-ms x
expect_error "--tool-start-extra needs --tool-start-ms" --synthetic mars-short --preset h100-llama3-8b --rate 1 --tool-start-extra
expect_error "need --tool-mem" --synthetic mars-short --preset h100-llama3-8b --rate 1 --host-period 4
expect_error "need --tool-mem" --synthetic mars-short --preset h100-llama3-8b --rate 1 --stall-kill-after 160
expect_error "--host-period: '-1' is not a number >= 0" --synthetic agentic-mem --preset h100-llama3-8b --rate 1 --host-period -1
expect_error "--psi-window: '0' is not a number > 0" --synthetic agentic-mem --preset h100-llama3-8b --rate 1 --psi-window 0
expect_error "--stall-kill-after: '0' is not a number > 0" --synthetic agentic-mem --preset h100-llama3-8b --rate 1 --stall-kill-after 0
# The cluster's flags (docs/sim.md "Multi-node").
expect_error "unknown router 'random' (valid: round-robin, least-queue, epp, epp+tandem)" \
  --synthetic mars-short --preset h100-llama3-8b --rate 1 --nodes 2 --router random
expect_error "unknown router 'bogus'" --synthetic mars-short --preset h100-llama3-8b --rate 1 --nodes 2 --router epp,bogus
expect_error "--nodes: 0 nodes; a cluster needs at least 1" --synthetic mars-short --preset h100-llama3-8b --rate 1 --nodes 0 --router epp
expect_error "a cluster has at most 64" --synthetic mars-short --preset h100-llama3-8b --rate 1 --nodes 65 --router epp
expect_error "--nodes: 'two' is not a number of nodes" --synthetic mars-short --preset h100-llama3-8b --rate 1 --nodes two --router epp
expect_error "--router needs --nodes" --synthetic mars-short --preset h100-llama3-8b --rate 1 --router epp
expect_error "needs --router" --synthetic mars-short --preset h100-llama3-8b --rate 1 --nodes 4
expect_error "--router needs a value" --synthetic mars-short --preset h100-llama3-8b --rate 1 --nodes 4 --router

# --nodes 1 alone is the node alone: the same JSON metrics as without it.
"$sim" --trace "$trace" --preset h100-llama3-8b --rate 0.2 --sessions 8 --policies fcfs,tandem --quiet \
  --json "$dir/n0.json" >/dev/null || fail "plain run failed"
"$sim" --trace "$trace" --preset h100-llama3-8b --rate 0.2 --sessions 8 --policies fcfs,tandem --quiet --nodes 1 \
  --json "$dir/n1.json" >/dev/null || fail "--nodes 1 run failed"
python3 - "$dir/n0.json" "$dir/n1.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert [r["metrics"] for r in a["runs"]] == [r["metrics"] for r in b["runs"]], "--nodes 1 changed the metrics"
PY
# A cluster: every router at 1 and 2 nodes, load per node (8 sessions per node at 0.2/s each).
"$sim" --trace "$trace" --preset h100-llama3-8b --rate 0.2 --sessions 8 --policies tandem --nodes 1,2 --router all \
  --quiet --json "$dir/c.json" >"$dir/cluster" || fail "cluster run failed: $(cat "$dir/cluster")"
grep -q "^Cluster" "$dir/cluster" || fail "no cluster table: $(cat "$dir/cluster")"
grep -q "tandem@epp+tandem/2" "$dir/cluster" || fail "no epp+tandem row at 2 nodes: $(cat "$dir/cluster")"
python3 - "$dir/c.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["runs"]) == 8, len(r["runs"])
for run in r["runs"]:
    assert run["router"] in ("round-robin", "least-queue", "epp", "epp+tandem"), run
    m = run["metrics"]
    assert run["sessions"] == 8 * run["nodes"] and m["completed"] == run["sessions"], run
    assert m["nodes"] == run["nodes"] and "moved_sessions" in m and "session_moves" in m, m
    if run["router"] in ("round-robin", "least-queue") or run["nodes"] == 1:
        assert m["moved_sessions"] == 0, run
one = {run["router"]: run["metrics"]["e2e_mean_s"] for run in r["runs"] if run["nodes"] == 1}
assert len(set(one.values())) == 1, one  # one node: the router has no choice
PY

# A small run of every policy on the trace, with the ablation.
"$sim" --trace "$trace" --preset h100-llama3-8b --rate 0.2 --sessions 12 --policies all --ablate --quiet \
  --json "$dir/r.json" --csv "$dir/r.csv" >"$dir/table" || fail "small run failed: $(cat "$dir/table")"
grep -q "tandem-growth_check" "$dir/table" || fail "the table lacks the ablation rows"
python3 - "$dir/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["preset"] == "h100-llama3-8b", r["preset"]
need = {"e2e_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "slowdown_mean", "goodput_a1", "goodput_a2",
        "goodput_a3", "throughput_sps", "ttft_mean_s", "ttft_p99_s", "kv_hit_rate", "recomputed_tokens",
        "preemptions", "pinned_block_seconds", "gpu_busy", "tool_stretch_mean"}
runs = r["runs"]
assert len(runs) == 7 + 21, len(runs)
for run in runs:
    assert {"policy", "rate", "sessions", "metrics"} <= run.keys(), run.keys()
    missing = need - run["metrics"].keys()
    assert not missing, missing
    assert run["sessions"] == 12 and run["metrics"]["completed"] == 12, run
    assert run["metrics"]["e2e_mean_s"] > 0 and run["metrics"]["slowdown_mean"] >= 0.999, run
PY
[ "$(wc -l <"$dir/r.csv")" -eq 29 ] || fail "CSV should have a header and 28 rows"
# Host memory: the memory family turns it on and its metrics appear in the JSON, the CSV and the table.
"$sim" --synthetic agentic-mem --preset h100-llama3-8b --rate 0.05 --sessions 6 --policies fcfs,tandem \
  --host-mem-gib 8 --quiet --json "$dir/m.json" --csv "$dir/m.csv" >"$dir/mem" || fail "memory run failed: $(cat "$dir/mem")"
grep -q "^Host memory" "$dir/mem" || fail "no host memory table: $(cat "$dir/mem")"
head -1 "$dir/m.csv" | grep -q "oom_kills" || fail "the CSV lacks oom_kills"
python3 - "$dir/m.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for key in ("oom_kills", "oom_kills_over_host", "oom_kills_over_room", "memory_kills", "rerun_tool_s", "frozen_s", "throttled_s", "stranded_block_s",
            "host_mem_peak_gib", "mem_psi_some_pct", "mem_psi_full_pct"):
    assert all(key in run["metrics"] for run in r["runs"]), key
    assert all(key in s["mean"] for s in r["summary"]), key
assert all(0 < run["metrics"]["host_mem_peak_gib"] <= 16 for run in r["runs"]), r["runs"]
PY
! grep -q "oom_kills" "$dir/r.json" || fail "a run without host memory reports its metrics"
# Several seeds: one run per seed, a summary per policy and rate, the verdict over the means.
"$sim" --trace "$trace" --source "tandem tests" --preset h100-llama3-8b --rate 0.2 --sessions 6 --seeds 3 \
  --policies fcfs,tandem --quiet --json "$dir/s.json" >"$dir/seeds" || fail "seeded run failed: $(cat "$dir/seeds")"
grep -q "Mean over 3 seeds" "$dir/seeds" || fail "no summary table: $(cat "$dir/seeds")"
grep -q "means over 3 seeds" "$dir/seeds" || fail "no verdict over seeds: $(cat "$dir/seeds")"
python3 - "$dir/s.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert sorted({run["seed"] for run in r["runs"]}) == [1, 2, 3], r["runs"]
assert len(r["runs"]) == 6 and len(r["summary"]) == 2, (len(r["runs"]), len(r["summary"]))
for s in r["summary"]:
    assert s["seeds"] == 3 and s["failed"] == 0, s
    assert set(s["mean"]) == set(s["ci95"]) and "e2e_mean_s" in s["mean"], s
PY
echo "cli_test: ok"
