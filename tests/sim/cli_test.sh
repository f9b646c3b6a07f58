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
expect_error "is not tandem, all or none" --synthetic mars-short --preset h100-llama3-8b --rate 1 --host-rules some

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
assert len(runs) == 7 + 18, len(runs)
for run in runs:
    assert {"policy", "rate", "sessions", "metrics"} <= run.keys(), run.keys()
    missing = need - run["metrics"].keys()
    assert not missing, missing
    assert run["sessions"] == 12 and run["metrics"]["completed"] == 12, run
    assert run["metrics"]["e2e_mean_s"] > 0 and run["metrics"]["slowdown_mean"] >= 0.999, run
PY
[ "$(wc -l <"$dir/r.csv")" -eq 26 ] || fail "CSV should have a header and 25 rows"
# Host memory: the memory family turns it on and its metrics appear in the JSON, the CSV and the table.
"$sim" --synthetic agentic-mem --preset h100-llama3-8b --rate 0.05 --sessions 6 --policies fcfs,tandem \
  --host-mem-gib 8 --quiet --json "$dir/m.json" --csv "$dir/m.csv" >"$dir/mem" || fail "memory run failed: $(cat "$dir/mem")"
grep -q "^Host memory" "$dir/mem" || fail "no host memory table: $(cat "$dir/mem")"
head -1 "$dir/m.csv" | grep -q "oom_kills" || fail "the CSV lacks oom_kills"
python3 - "$dir/m.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for key in ("oom_kills", "memory_kills", "rerun_tool_s", "frozen_s", "throttled_s", "stranded_block_s",
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
