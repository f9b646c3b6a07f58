#!/usr/bin/env python3
"""Renders tandem-sim JSON reports as the Markdown tables of docs/results.md.

    python3 scripts/sim-tables.py REPORT.json...

Each REPORT.json may have a REPORT.txt beside it (tandem-sim's printed
output): its verdict block is copied under the tables, and runs that did not
finish are read from it when the JSON has no "failed" list.
"""
import json
import os
import re
import sys


def fmt(v, digits=4):
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def load(path):
    with open(path) as f:
        doc = json.load(f)
    failed = {(f["policy"], f["variant"], f["rate"]) for f in doc.get("failed", [])}
    text = ""
    txt = os.path.splitext(path)[0] + ".txt"
    if os.path.exists(txt):
        with open(txt) as f:
            text = f.read()
        for m in re.finditer(r"tandem-sim: (\S+) at rate ([0-9.eE+-]+)(?: seed \d+)? failed", text):
            label, rate = m.group(1), float(m.group(2))
            policy, _, variant = label.partition("-")
            failed.add((policy, "-" + variant if variant else "", rate))
    return doc, failed, text


def table(doc, failed, key, labels, rates, digits=4):
    runs = {(r["policy"] + r["variant"], r["rate"]): r["metrics"] for r in doc["runs"]}
    failed_labels = {(p + v, rate) for p, v, rate in failed}
    lines = ["| policy | " + " | ".join(fmt(r) for r in rates) + " |",
             "| --- |" + " ---: |" * len(rates)]
    for label in labels:
        cells = []
        for rate in rates:
            if (label, rate) in runs:
                cells.append(fmt(runs[(label, rate)][key], digits))
            elif (label, rate) in failed_labels:
                cells.append("livelock")
            else:
                cells.append("—")
        bold = "**" if label == "tandem" else ""
        lines.append(f"| {bold}{label}{bold} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(paths):
    for path in paths:
        doc, failed, text = load(path)
        rates = sorted({r["rate"] for r in doc["runs"]} | {f[2] for f in failed})
        labels, variants = [], []
        for r in doc["runs"]:
            label = r["policy"] + r["variant"]
            target = variants if r["variant"] else labels
            if label not in target:
                target.append(label)
        for p, v, _ in sorted(failed):
            target = variants if v else labels
            if p + v not in target:
                target.append(p + v)
        name = os.path.splitext(os.path.basename(path))[0]
        sessions = doc["runs"][0]["sessions"] if doc["runs"] else "?"
        print(f"### {name}: preset `{doc['preset']}`, workload `{doc['workload']}`, {sessions} sessions per run\n")
        for key, title, digits in [("e2e_mean_s", "Mean E2E latency (s)", 4),
                                   ("slowdown_mean", "Mean slowdown (E2E / T_ideal)", 3),
                                   ("goodput_a3", "Goodput, α = 3 (sessions/s)", 4),
                                   ("throughput_sps", "Throughput (sessions/s)", 4),
                                   ("e2e_p99_s", "p99 E2E (s)", 4),
                                   ("kv_hit_rate", "KV hit rate", 3),
                                   ("preemptions", "Preemptions", 4),
                                   ("tokens_per_s", "Computed tokens per second (new + recomputed)", 4)]:
            if doc["runs"] and key not in doc["runs"][0]["metrics"]:
                continue
            print(f"**{title}**\n")
            print(table(doc, failed, key, labels, rates, digits) + "\n")
        if variants:
            print("**Ablation: mean E2E (s) of tandem with one addition switched off**\n")
            print(table(doc, failed, "e2e_mean_s", ["tandem"] + variants, rates) + "\n")
            print("**Ablation: goodput, α = 3**\n")
            print(table(doc, failed, "goodput_a3", ["tandem"] + variants, rates) + "\n")
        verdict = text[text.find("tandem against"):] if "tandem against" in text else ""
        verdict = "\n".join(l for l in verdict.splitlines() if not l.startswith("wrote "))
        if verdict:
            print("```\n" + verdict.strip() + "\n```\n")


if __name__ == "__main__":
    main(sys.argv[1:])
