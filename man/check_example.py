#!/usr/bin/env python3
"""ctest check that the C example of a man page compiles against the header
it documents (docs/man.md), so libtandem(3)'s example cannot drift from
tandem.h.

    check_example.py --page libtandem.3 --cc CC --include DIR

Takes every .EX/.EE block of the page that contains `#include`, turns the
troff back into C and compiles it with `CC -std=c11 -Wall -Wextra -Werror
-fsyntax-only -IDIR`. Fails (exit 1) if there is no such block or one does
not compile.
"""

import argparse
import re
import subprocess
import sys

# The troff escapes C code needs, and what they stand for.
_ESCAPES = {"-": "-", "e": "\\", "&": "", "|": "", "(dq": '"', "(aq": "'", "(ti": "~", "(ha": "^",
            "(rs": "\\", "[dq]": '"', "[aq]": "'", "[ti]": "~", "[ha]": "^", "[rs]": "\\"}
_ESCAPE = re.compile(r"\\(\(..|\[[^\]]*\]|.)")


def c_text(troff_lines):
    """The C an .EX block shows: its escapes replaced by what they print."""
    def sub(m):
        if m.group(1) not in _ESCAPES:
            sys.exit(f"cannot turn the troff escape {m.group(0)!r} back into C")
        return _ESCAPES[m.group(1)]

    return "".join(_ESCAPE.sub(sub, line) + "\n" for line in troff_lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page", required=True)
    ap.add_argument("--cc", required=True)
    ap.add_argument("--include", required=True)
    args = ap.parse_args()
    with open(args.page, encoding="utf-8") as f:
        source = f.read()
    blocks = [b for b in re.findall(r"^\.EX\n(.*?)^\.EE$", source, re.MULTILINE | re.DOTALL) if "#include" in b]
    if not blocks:
        sys.exit(f"{args.page}: no .EX block with #include")
    for n, block in enumerate(blocks, 1):
        code = c_text(block.splitlines())
        run = subprocess.run([args.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                              f"-I{args.include}", "-x", "c", "-"], input=code, capture_output=True, text=True,
                             timeout=120)
        if run.returncode != 0:
            print(f"{args.page}: example {n} does not compile:\n{code}\n{run.stderr}", file=sys.stderr)
            sys.exit(1)
    print(f"{args.page}: {len(blocks)} C example(s) compile against {args.include}")


if __name__ == "__main__":
    main()
