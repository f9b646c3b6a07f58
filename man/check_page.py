#!/usr/bin/env python3
"""ctest check of one man page (docs/man.md): it renders with man(1) and
groff without a single warning and reads well at 80 columns.

    check_page.py --page FILE [--width 80] [--help-of BIN] [--require SECTION]...

Fails (exit 1, saying why) when:
  - `man --warnings=w -l FILE` (all groff warnings, UTF-8, MANWIDTH columns)
    or the same in the C locale (ASCII output) writes anything to stderr or
    exits non-zero;
  - a rendered line is wider than the width (a .nf block that overflows);
  - the source still holds an @PLACEHOLDER@, or lacks .TH;
  - lexgrog(1) cannot read the NAME section (whatis/apropos need it);
  - a section is missing: NAME, SYNOPSIS, DESCRIPTION, SEE ALSO and each
    --require (a generated one that --help stopped providing);
  - with --help-of: a command or option that `BIN --help` lists does not
    appear in the rendered page (a term the generator dropped).
Exits 77 (ctest: skipped) when man-db or groff is not installed.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys


def render(page, width, locale):
    env = dict(os.environ)
    env.update({
        "LC_ALL": locale,
        "MANWIDTH": str(width),
        "MANROFFSEQ": "",
        "MANPAGER": "cat",
        "PAGER": "cat",
        # man-db's seccomp sandbox fails in some containers; nothing here
        # needs it (the page is ours).
        "MAN_DISABLE_SECCOMP": "1",
    })
    env.pop("MAN_KEEP_FORMATTING", None)
    enc = ["-E", "UTF-8"] if "UTF-8" in locale else ["-E", "ascii"]
    run = subprocess.run(["man", "--warnings=w", *enc, "-l", page], capture_output=True, text=True, env=env,
                         timeout=60)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page", required=True)
    ap.add_argument("--width", type=int, default=80)
    ap.add_argument("--help-of")
    ap.add_argument("--require", action="append", default=[])
    args = ap.parse_args()

    for tool, pkg in (("man", "man-db"), ("groff", "groff-base"), ("lexgrog", "man-db")):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} is not installed (Debian package {pkg}; scripts/install-deps adds it)")
            sys.exit(77)

    problems = []
    with open(args.page, encoding="utf-8") as f:
        source = f.read()
    if not re.search(r"^\.TH ", source, re.MULTILINE):
        problems.append("no .TH line")
    for m in re.finditer(r"@[A-Z_]+@", source):
        problems.append(f"unfilled placeholder {m.group(0)}")

    text = ""
    for locale in ("C.UTF-8", "C"):
        run = render(args.page, args.width, locale)
        if run.returncode != 0:
            problems.append(f"man -l exited {run.returncode} in LC_ALL={locale}")
        if run.stderr.strip():
            problems.append(f"man -l (LC_ALL={locale}) warned:\n" + run.stderr.rstrip())
        if not run.stdout.strip():
            problems.append(f"man -l (LC_ALL={locale}) rendered nothing")
        for n, line in enumerate(run.stdout.splitlines(), 1):
            if len(line) > args.width:
                problems.append(f"LC_ALL={locale}: rendered line {n} is {len(line)} columns wide "
                                f"(> {args.width}): {line.strip()!r}")
        if locale == "C.UTF-8":
            text = run.stdout

    headings = {line.strip() for line in text.splitlines() if line and not line[0].isspace()}
    for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"] + args.require:
        if section not in headings:
            problems.append(f"no section {section}")

    lex = subprocess.run(["lexgrog", args.page], capture_output=True, text=True, timeout=60)
    if lex.returncode != 0 or " - " not in lex.stdout:
        problems.append(f"lexgrog cannot read the NAME section: {(lex.stdout + lex.stderr).strip()}")

    if args.help_of:
        run = subprocess.run([args.help_of, "--help"], capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            problems.append(f"{args.help_of} --help exited {run.returncode}")
        words = set(re.findall(r"[\w-]+", text.replace("\u2010", "-")))
        for line in run.stdout.splitlines():
            m = re.match(r"^ {2,}(\S.*?)(?:\s{2,}|$)", line)
            if not m or line.startswith(" " * 8):
                continue  # a description line
            term = m.group(1)
            wanted = [t for t in re.findall(r"-{0,2}[A-Za-z][\w-]*", term)
                      if t.startswith("-") or t == re.findall(r"[\w-]+", term)[0]]
            for w in wanted:
                if w not in words:
                    problems.append(f"{w!r} ({args.help_of} --help: {line.strip()!r}) is not in the page")

    if problems:
        print(f"{args.page}:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        sys.exit(1)
    print(f"{args.page}: renders cleanly at {args.width} columns")


if __name__ == "__main__":
    main()
