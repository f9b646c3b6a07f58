#!/usr/bin/env python3
"""Renders tandem-sim JSON reports as the Markdown tables of docs/results.md.

    python3 scripts/sim-tables.py DIR            every DIR/*.json, a verdict summary first
    python3 scripts/sim-tables.py REPORT.json... those reports

Each REPORT.json may have a REPORT.txt beside it (tandem-sim's printed
output): its verdict block is copied under the tables, and the verdict
summary is read from it. Values are means over the report's seeds; with more
than one seed, mean ± the half-width of the 95 % interval.
"""
import glob
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


def pm(mean, half, digits=4):
    if not half:
        return fmt(mean, digits)
    return f"{fmt(mean, digits)} ± {fmt(half, 2)}"


def load(path):
    with open(path) as f:
        doc = json.load(f)
    text = ""
    txt = os.path.splitext(path)[0] + ".txt"
    if os.path.exists(txt):
        with open(txt) as f:
            text = f.read()
    return doc, text


def labels_and_rates(doc):
    labels, variants, rates = [], [], set()
    for s in doc.get("summary", []):
        label = s["policy"] + s["variant"]
        target = variants if s["variant"] else labels
        if label not in target:
            target.append(label)
        rates.add(s["rate"])
    return labels, variants, sorted(rates)


def table(doc, key, labels, rates, digits=4, interval=True):
    cells = {(s["policy"] + s["variant"], s["rate"]): s for s in doc.get("summary", [])}
    lines = ["| policy | " + " | ".join(fmt(r) for r in rates) + " |", "| --- |" + " ---: |" * len(rates)]
    for label in labels:
        row = []
        for rate in rates:
            s = cells.get((label, rate))
            if s is None:
                row.append("—")
            elif s["seeds"] == 0:
                row.append("livelock")
            else:
                v = pm(s["mean"][key], s["ci95"][key] if interval else 0, digits)
                if s["failed"]:
                    v += f" ({s['failed']} failed)"
                row.append(v)
        bold = "**" if label == "tandem" else ""
        lines.append(f"| {bold}{label}{bold} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def verdict_block(text):
    if "tandem against" not in text:
        return ""
    block = text[text.find("tandem against"):]
    return "\n".join(l for l in block.splitlines() if not l.startswith("wrote ")).strip()


def verdict_summary(name, doc, text):
    """One row: name, lowest everywhere, knee, ratio at the knee, goodput, throughput."""
    v = verdict_block(text)
    if not v:
        return None
    m = re.search(r"lowest mean E2E at every rate: (\w+); goodput \(a=3\) >= every other: (\w+); "
                  r"throughput >= 0.97x best: (\w+)", v)
    k = re.search(r"knee .* at rate ([0-9.e-]+): ([0-9.]+)x lower mean E2E( \(per-seed ratio ([0-9.]+)-([0-9.]+)\))?", v)
    knee = "not reached"
    ratio = "—"
    if k:
        knee = k.group(1)
        ratio = f"**{k.group(2)}×**" + (f" ({k.group(4)}–{k.group(5)})" if k.group(3) else "")
    short = [l.split()[0] for l in v.splitlines() if "short of the goal" in l or "FAILED" in l]
    return (f"| {name} | {m.group(1) if m else '?'} | {knee} | {ratio} | {m.group(2) if m else '?'} | "
            f"{m.group(3) if m else '?'} | {', '.join(short) if short else '—'} |")


def render(path):
    doc, text = load(path)
    name = os.path.splitext(os.path.basename(path))[0]
    labels, variants, rates = labels_and_rates(doc)
    sessions = doc["runs"][0]["sessions"] if doc["runs"] else "?"
    seeds = len({r["seed"] for r in doc["runs"]})
    out = [f"### {name}: preset `{doc['preset']}`, workload `{doc['workload']}`, {sessions} sessions per run, "
           f"{seeds} seeds\n"]
    for key, title, digits in [("e2e_mean_s", "Mean E2E latency (s)", 4),
                               ("slowdown_mean", "Mean slowdown (E2E / T_ideal)", 3),
                               ("goodput_a3", "Goodput, α = 3 (sessions/s)", 4),
                               ("throughput_sps", "Throughput (sessions/s)", 4),
                               ("kv_hit_rate", "KV hit rate", 3),
                               ("recomputed_tokens", "Recomputed tokens", 3),
                               ("resume_recomputed_tokens", "Recomputed when a session resumes (tokens)", 3),
                               ("kv_waste_block_s", "KV waste (block-seconds, InferCept's measure)", 3)]:
        if not doc.get("summary") or key not in doc["summary"][0]["mean"]:
            continue
        out.append(f"**{title}**\n")
        out.append(table(doc, key, labels, rates, digits) + "\n")
    if variants:
        out.append("**Ablation: mean E2E (s) of tandem with one addition switched off**\n")
        out.append(table(doc, "e2e_mean_s", ["tandem"] + variants, rates) + "\n")
    v = verdict_block(text)
    if v:
        out.append("```\n" + v + "\n```\n")
    return "\n".join(out)


def means(doc, key):
    """(label, rate) -> (mean, ci95, seeds) of `key`."""
    return {(x["policy"] + x["variant"], x["rate"]): (x["mean"][key], x["ci95"][key], x["seeds"])
            for x in doc.get("summary", [])}


def reproductions(directory):
    """Each baseline's paper headline, checked on the sweeps that exist."""
    def get(name):
        path = os.path.join(directory, name + ".json")
        return load(path)[0] if os.path.exists(path) else None

    out = ["## Baseline reproduction checks\n"]
    for v in ("125k", "263k"):
        doc = get(f"repro-mars-ilr-{v}")
        if not doc:
            continue
        e2e = means(doc, "e2e_mean_s")
        rows = []
        for rate in sorted({r for _, r in e2e}):
            others = {l: e2e[(l, rate)][0] for l in ("fcfs", "autellix", "infercept", "continuum")
                      if (l, rate) in e2e and e2e[(l, rate)][2] > 0}
            if ("mars", rate) not in e2e or not others:
                continue
            best = min(others, key=others.get)
            m = e2e[("mars", rate)][0]
            rows.append(f"| {fmt(rate)} | {fmt(m)} | {best} {fmt(others[best])} | {others[best] / m:.2f}× | "
                        f"{'yes' if m <= others[best] * 1.001 else 'NO'} |")
        out.append(f"**MARS, mars-ilr-{v} on its node: mars against fcfs, autellix, infercept, continuum**\n")
        out.append("| rate | mars E2E (s) | best of the others (s) | others / mars | mars lowest |")
        out.append("| ---: | ---: | --- | ---: | --- |")
        out += rows + [""]
    rows = []
    for p in sorted(glob.glob(os.path.join(directory, "val-*-all-c16.json"))):
        doc = load(p)[0]
        thr = means(doc, "throughput_sps")
        rate = max(r for _, r in thr)
        if ("thunderagent", rate) in thr and ("fcfs", rate) in thr and thr[("fcfs", rate)][0] > 0:
            rows.append(f"| {os.path.basename(p)[4:-13]} | {fmt(rate)} | {fmt(thr[('thunderagent', rate)][0])} | "
                        f"{fmt(thr[('fcfs', rate)][0])} | {thr[('thunderagent', rate)][0] / thr[('fcfs', rate)][0]:.2f}× |")
    if rows:
        out.append("**ThunderAgent: throughput against vLLM (fcfs) at the highest rate (validation, all sessions)**\n")
        out.append("| preset | rate | thunderagent (sessions/s) | fcfs | ratio (paper: 1.5–3.6×) |")
        out.append("| --- | ---: | ---: | ---: | ---: |")
        out += rows + [""]
    doc = get("syn-mars-short")
    if doc:
        rr = means(doc, "resume_recomputed_tokens")
        out.append("**Continuum: tokens recomputed when a session resumes after its tool (mars-short: tools of 0.5 s "
                   "median)**\n")
        out.append("| rate | continuum | fcfs | fewer |")
        out.append("| ---: | ---: | ---: | --- |")
        for rate in sorted({r for _, r in rr}):
            if ("continuum", rate) in rr and ("fcfs", rate) in rr:
                c, f = rr[("continuum", rate)][0], rr[("fcfs", rate)][0]
                out.append(f"| {fmt(rate)} | {fmt(c)} | {fmt(f)} | {'yes' if c < f else ('tie' if c == f else 'NO')} |")
        out.append("")
    for w in ("mars-short", "long-pause"):
        a, d = get(f"repro-infercept-{w}"), get(f"repro-infercept-discard-{w}")
        if not (a and d):
            continue
        wa, wd = means(a, "kv_waste_block_s"), means(d, "kv_waste_block_s")
        ea, ed = means(a, "e2e_mean_s"), means(d, "e2e_mean_s")
        out.append(f"**InferCept against discard-only ({w}): memory waste (block-seconds) and mean E2E**\n")
        out.append("| rate | infercept waste | discard-only waste | less waste | infercept E2E (s) | discard-only E2E |")
        out.append("| ---: | ---: | ---: | --- | ---: | ---: |")
        for rate in sorted({r for _, r in wa}):
            if ("infercept", rate) in wa and ("infercept", rate) in wd:
                x, y = wa[("infercept", rate)][0], wd[("infercept", rate)][0]
                out.append(f"| {fmt(rate)} | {fmt(x, 3)} | {fmt(y, 3)} | {'yes' if x < y else 'NO'} | "
                           f"{fmt(ea[('infercept', rate)][0])} | {fmt(ed[('infercept', rate)][0])} |")
        out.append("")
    return "\n".join(out)


def main(args):
    paths = []
    summary_dir = None
    for a in args:
        if os.path.isdir(a):
            summary_dir = a
            paths += sorted(glob.glob(os.path.join(a, "*.json")))
        else:
            paths.append(a)
    if summary_dir:
        print("## Verdicts\n")
        print("| sweep | lowest mean E2E everywhere | knee | ratio at the knee (per-seed 95 % interval) | "
              "goodput α=3 ≥ all | throughput ≥ 0.97× best | rates short of the goal |")
        print("| --- | --- | --- | ---: | --- | --- | --- |")
        for p in paths:
            doc, text = load(p)
            row = verdict_summary(os.path.splitext(os.path.basename(p))[0], doc, text)
            if row:
                print(row)
        print()
        print(reproductions(summary_dir))
    for p in paths:
        print(render(p))


if __name__ == "__main__":
    main(sys.argv[1:])
