#!/usr/bin/env python3
"""ctest check that tandemd.toml(5) documents every configuration key and
policy parameter the code takes, at its default (docs/man.md).

    check_config_page.py --page tandemd.toml.5 --example examples/tandemd.toml
                         --config-md docs/config.md --policies-bin tandem-man-policies

It reads the sources its own way, not the generator's: the example file with
tomllib, the registry from the tandem-man-policies binary, and the page as
man(1) renders it. Fails (exit 1, listing each) when:
  - a key of examples/tandemd.toml (which tests/daemon/config_test.cc holds
    to the code's defaults) is not shown as `key = default` under its table's
    heading;
  - a policy has no subsection under POLICY PARAMETERS, or one of its
    parameters is not shown at its default there (or under the policy whose
    parameters it says it takes);
  - docs/config.md documents a key the example file, and so the code, does
    not have.
Exits 77 (ctest: skipped) when man-db is not installed.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib


def rendered(page):
    env = dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="160", MANPAGER="cat", PAGER="cat", MAN_DISABLE_SECCOMP="1")
    env.pop("MAN_KEEP_FORMATTING", None)
    run = subprocess.run(["man", "-E", "UTF-8", "-l", page], capture_output=True, text=True, env=env, timeout=60)
    if run.returncode != 0:
        sys.exit(f"man -l {page} exited {run.returncode}: {run.stderr.strip()}")
    return run.stdout.replace("\u2010", "-").replace("\u2212", "-")


def entries(text):
    """{(section, subsection): {key: value text}} of the rendered `key = value` tags."""
    out = {}
    section = subsection = None
    for line in text.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            section, subsection = line.strip(), None
        elif indent == 3:
            subsection = line.strip()
        elif indent == 7:
            m = re.fullmatch(r"([A-Za-z0-9_-]+) = (.+)", line.strip())
            if m:
                out.setdefault((section, subsection), {})[m.group(1)] = m.group(2)
    return out


def same_value(text, value):
    try:
        return tomllib.loads(f"v = {text}\n")["v"] == value
    except tomllib.TOMLDecodeError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--config-md", required=True)
    ap.add_argument("--policies-bin", required=True)
    args = ap.parse_args()
    if shutil.which("man") is None:
        print("SKIP: man is not installed (Debian package man-db; scripts/install-deps adds it)")
        sys.exit(77)

    page = entries(rendered(args.page))
    problems = []
    checked = 0

    # Every key of the example, under its table's heading, at its default.
    with open(args.example, "rb") as f:
        config = tomllib.load(f)
    keys = {}

    def walk(table, node):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(f"{table}.{k}" if table else k, v)
            else:
                keys[(table, k)] = v

    walk("", config)
    for (table, key), value in keys.items():
        if not table:
            where = ("TOP-LEVEL KEYS", None)
        elif "." not in table:
            where = (f"[{table}]", None)
        else:
            top = table.split(".")[0]
            where = next(((s, f"[{table}]") for s, _ in page if s in (f"[{top}]", f"[{top}.*]")),
                         (f"[{top}]", f"[{table}]"))
        shown = page.get(where, {}).get(key)
        heading = " / ".join(w for w in where if w)
        if shown is None:
            problems.append(f"{table + '.' if table else ''}{key}: not listed under {heading}")
        elif not same_value(shown, value):
            problems.append(f"{table + '.' if table else ''}{key}: shown as {shown!r}, the example has {value!r}")
        checked += 1

    # Every policy and parameter of the registry.
    run = subprocess.run([args.policies_bin], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        sys.exit(f"{args.policies_bin} exited {run.returncode}: {run.stderr.strip()}")
    policies = {}
    for line in run.stdout.splitlines():
        f = line.split("\t")
        if f[0] == "policy":
            policies[f[1]] = []
        elif f[0] == "param":
            policies[f[1]].append((f[2], float(f[3])))
    text = rendered(args.page)
    for name, params in policies.items():
        shown = page.get(("POLICY PARAMETERS", name))
        sub = re.search(rf"^   {re.escape(name)}\n(.*?)(?=^\S|^   \S)", text, re.MULTILINE | re.DOTALL)
        if sub is None:
            problems.append(f"policy {name}: no subsection under POLICY PARAMETERS")
            continue
        base = re.search(r"every parameter of (\S+?),", sub.group(1).replace("\n", " "))
        base_shown = page.get(("POLICY PARAMETERS", base.group(1)), {}) if base else {}
        for pname, default in params:
            v = (shown or {}).get(pname, base_shown.get(pname))
            if v is None:
                problems.append(f"policy {name}: parameter {pname} not listed")
            elif float(v) != default:
                problems.append(f"policy {name}: {pname} shown as {v}, the registry's default is {default:g}")
            checked += 1
        if not params and "takes no parameters" not in sub.group(1):
            problems.append(f"policy {name}: takes no parameters, and the page does not say so")

    # docs/config.md documents only keys that exist.
    heading = None
    with open(args.config_md, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("#"):
                heading = None
                m = re.match(r"### .*?`\[([^\]`]+)\]`", line)
                if m:
                    heading = "^" + re.sub(r"<[^>]+>", "[^.]+", m.group(1).replace(".", r"\.")) + "$"
                elif line.strip().lower() == "### top level":
                    heading = "^$"
                continue
            if heading is None or not line.startswith("|") or re.match(r"\|\s*(key|:?-+)", line):
                continue
            for key in re.findall(r"`([^`]+)`", line.split("|")[1]):
                if not any(k == key and re.match(heading, t) for t, k in keys):
                    problems.append(f"{args.config_md}:{lineno}: documents {key}, which {args.example} "
                                    f"(and so the code) does not have there")

    if problems:
        print(f"{args.page}: {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        sys.exit(1)
    print(f"{args.page}: all {checked} keys and policy parameters listed at their defaults")


if __name__ == "__main__":
    main()
