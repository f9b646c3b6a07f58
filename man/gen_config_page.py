#!/usr/bin/env python3
"""Builds tandemd.toml(5) from examples/tandemd.toml, docs/config.md and the
policy registry, so the page lists exactly the keys and parameters the code
takes (docs/man.md).

    gen_config_page.py --example examples/tandemd.toml --config-md docs/config.md
                       --policies POLICIES.tsv --template tandemd.toml.5.in
                       --output tandemd.toml.5 [--version V] [--date D]

The example file lists every key at its default (tests/daemon/config_test.cc
checks it against the code). It is read line by line:

  # comment lines             describe what follows them
  [table]   # comment         a table; the comment introduces it
  key = value   # comment     a key and its default, as written

Tables become sections: one .SH per top-level name ([policy], [roles.*],
...), one .SS per sub-table ([policy.params], [roles.engine]). A comment
block right before a table header introduces the table (or the group of
tables it opens); a block followed by a blank line is a note of the table it
is in. A block right before a key is about it and the keys on the lines
after it. What each key means comes from docs/config.md's key tables where
they have a row for it, as those say more (what it does, what is allowed):

  - a key with a row: that row describes it; keys sharing a row (engine_cpus,
    tool_cpus) share an entry;
  - keys sharing a comment whose rows differ: the comment stands as a
    paragraph before them;
  - a key without a row: the comment above it describes it; a key with
    neither is an error.

The file is also parsed with tomllib and the two readings must agree. The
POLICY PARAMETERS section comes from POLICIES.tsv, which tandem-man-policies
(man/policy_params.cc) prints from the registry. Anything the generator
cannot place — a line of another shape, a key neither commented nor in
docs/config.md, a placeholder the template lacks — is an error: it exits 1
and says where.
"""

import argparse
import re
import tomllib

from manlib import GenError, bold, die, escape, fill, markdown, prose, safe_line, sentence, text_lines

# ---- examples/tandemd.toml ------------------------------------------------


class Key:
    def __init__(self, table, name, literal, lineno):
        self.table, self.name, self.literal, self.lineno = table, name, literal, lineno

    @property
    def dotted(self):
        return f"{self.table}.{self.name}" if self.table else self.name


class Group:
    """Keys on consecutive lines under one comment (or none)."""

    def __init__(self, comment):
        self.comment = comment
        self.keys = []


class Table:
    def __init__(self, name, intro, header_comment):
        self.name = name
        self.intro = intro  # comment lines right before the header
        self.header_comment = header_comment  # comment on the header line
        self.items = []  # Group, or a list of comment lines (a note)


_TABLE = re.compile(r"^\[\s*([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)\s*\]\s*(?:#\s?(.*))?$")
_KEY = re.compile(r"^([A-Za-z0-9_-]+)\s*=\s*(.*)$")
_TOML_LINE = re.compile(r"^[A-Za-z0-9_.-]+\s*=\s*\S")


def split_value(rest, where):
    """`value  # comment` into the value as written and the comment (or
    None). tomllib decides where the value ends, so a '#' inside a string
    is not taken for a comment."""
    candidates = [len(rest)] + [m.start() for m in re.finditer("#", rest)]
    for end in sorted(candidates):
        text = rest[:end].strip()
        if not text:
            continue
        try:
            tomllib.loads(f"v = {text}\n")
        except tomllib.TOMLDecodeError:
            continue
        tail = rest[end:].strip()
        if tail and not tail.startswith("#"):
            continue
        return text, (tail[1:].strip() or None) if tail else None
    raise GenError(f"{where}: cannot read the value {rest!r} (one key = value per line, values on one line)")


def parse_example(text, path):
    tables = [Table("", [], None)]
    pending = []  # the comment block being read
    group = None  # the group a key on the next line joins
    seen_content = False  # past the file's opening comment
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = f"{path}:{lineno}"
        line = raw.strip()
        if not line:
            if pending:
                if seen_content:
                    tables[-1].items.append(pending)
                # else: the file's opening comment; the template says it.
            pending, group = [], None
            continue
        if line.startswith("#"):
            pending.append(re.sub(r"^# ?", "", line))
            continue
        seen_content = True
        if line.startswith("["):
            m = _TABLE.match(line)
            if not m or line.startswith("[["):
                raise GenError(f"{where}: not a [table] header this generator reads: {line!r}")
            if any(t.name == m.group(1) for t in tables):
                raise GenError(f"{where}: table [{m.group(1)}] appears twice")
            tables.append(Table(m.group(1), pending, m.group(2)))
            pending, group = [], None
            continue
        m = _KEY.match(line)
        if not m:
            raise GenError(f"{where}: neither a comment, a [table] nor key = value: {line!r}")
        literal, trailing = split_value(m.group(2), where)
        key = Key(tables[-1].name, m.group(1), literal, lineno)
        if trailing:  # `key = value  # about this key alone`
            group = Group(pending + [trailing])
            tables[-1].items.append(group)
            group.keys.append(key)
            group = None
        else:
            if pending or group is None:
                group = Group(pending)
                tables[-1].items.append(group)
            group.keys.append(key)
        pending = []
    if pending:
        tables[-1].items.append(pending)

    # The same file through a real TOML parser: the same keys, the same values.
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GenError(f"{path}: {e}") from e
    flat = {}

    def walk(prefix, node):
        for k, v in node.items():
            dotted = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict):
                walk(dotted, v)
            else:
                flat[dotted] = v

    walk("", data)
    mine = {k.dotted: k for t in tables for g in t.items if isinstance(g, Group) for k in g.keys}
    if set(mine) != set(flat):
        raise GenError(f"{path}: read line by line it has keys {sorted(set(mine) ^ set(flat))} "
                       f"that tomllib does not agree on")
    for dotted, k in mine.items():
        if tomllib.loads(f"v = {k.literal}\n")["v"] != flat[dotted]:
            raise GenError(f"{path}:{k.lineno}: {dotted}: value {k.literal!r} read wrongly")
    return tables


# ---- docs/config.md -------------------------------------------------------

DOCS = "docs/config.md"


class Row:
    def __init__(self, keys, what, allowed, lineno):
        self.keys, self.what, self.allowed, self.lineno = keys, what, allowed, lineno


def split_cells(line):
    cells = re.split(r"(?<!\\)\|", line.strip())
    return [c.strip() for c in cells[1:-1]]


def parse_config_md(text, path):
    """{(table pattern, key): Row} from the key tables under '### ...'
    headings that name a table (`[limits]`) or say 'Top level'."""
    rows = {}
    pattern = None
    columns = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            pattern, columns = None, None
            if line.startswith("### "):
                m = re.search(r"`\[([^\]`]+)\]`", line)
                if m:
                    pattern = "^" + re.sub(r"\\<[^>]+\\>|<[^>]+>", "[^.]+", re.escape(m.group(1))) + "$"
                elif line[4:].strip().lower() == "top level":
                    pattern = "^$"
            continue
        if pattern is None or not line.startswith("|"):
            continue
        cells = split_cells(line)
        if columns is None:
            columns = [c.lower() for c in cells]
            if "key" not in columns or "what it does" not in columns:
                raise GenError(f"{path}:{lineno}: a key table needs 'key' and 'what it does' columns")
            continue
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue
        if len(cells) != len(columns):
            raise GenError(f"{path}:{lineno}: {len(cells)} cells, the header has {len(columns)}")
        cell = dict(zip(columns, cells))
        keys = re.findall(r"`([^`]+)`", cell["key"])
        if not keys:
            raise GenError(f"{path}:{lineno}: no `key` in the first cell")
        row = Row(keys, cell["what it does"], cell.get("allowed"), lineno)
        for k in keys:
            rows[(pattern, k)] = row
    return rows


def find_row(rows, key):
    for (pattern, name), row in rows.items():
        if name == key.name and re.match(pattern, key.table):
            return row
    return None


# ---- troff ----------------------------------------------------------------


def comment_troff(lines, para):
    """Comment lines as running text; `key = value` lines as an example."""
    out, text = [], []

    def flush():
        if text:
            out.append(text_lines(" ".join(text)))
            text.clear()

    example = []
    for line in lines + [None]:
        if line is not None and _TOML_LINE.match(line):
            flush()
            example.append(line)
            continue
        if example:
            out += [".RS 4", ".nf"] + [safe_line(escape(e)) for e in example] + [".fi", ".RE"]
            example = []
        if line is None:
            break
        if not line.strip():
            flush()
            out.append(para)
        else:
            text.append(line.strip())
    flush()
    return out


def key_tag(key):
    return safe_line(rf"{bold(key.name)} = {escape(key.literal)}")


def row_troff(row):
    out = [text_lines(sentence(row.what))]
    if row.allowed:
        out.append(safe_line(r"\fIAllowed:\fR " + markdown(row.allowed.strip())))
    return out


def render_tables(tables, rows, example_path):
    out = []
    last_group = None
    for t in tables:
        if not t.name and not t.items:
            continue
        group = t.name.split(".")[0]
        own = ([sentence(t.header_comment)] if t.header_comment else [])
        if not t.name:
            out.append('.SH "TOP\\-LEVEL KEYS"')
            intro = t.intro
        elif group != last_group and t.name == group:
            out.append(f'.SH "{escape("[" + group + "]")}"')
            intro = t.intro + own
        else:
            if group != last_group:
                # A group of sub-tables only ([roles.engine], ...): the
                # comment before the first one introduces them all.
                out.append(f'.SH "{escape("[" + group + ".*]")}"')
                out += comment_troff(t.intro, ".PP") if t.intro else []
                intro = own
            else:
                intro = t.intro + own
            out.append(f'.SS "{escape("[" + t.name + "]")}"')
        last_group = group
        out += comment_troff(intro, ".PP") if intro else []
        for item in t.items:
            if isinstance(item, Group):
                out += render_group(item, rows, example_path)
            else:
                out.append(".PP")
                out += comment_troff(item, ".PP")
        if t.name == "policy.params":
            out.append(".PP")
            out.append("The parameters each policy takes, with their defaults and ranges, are listed under")
            out.append(".B POLICY PARAMETERS")
            out.append("below.")
    return out


def render_group(g, rows, example_path):
    """A group's keys: each with its docs/config.md row where it has one
    (keys sharing a row share an entry), else with the group's comment."""
    found = [find_row(rows, k) for k in g.keys]
    if g.comment and len(g.keys) > 1 and any(found) and not all(r is found[0] for r in found):
        out = [".PP"] + comment_troff(g.comment, ".PP")  # about them all
    else:
        out = []
    i = 0
    while i < len(g.keys):
        k, row = g.keys[i], found[i]
        j = i + 1
        while j < len(g.keys) and found[j] is row:
            j += 1
        if row is None and not g.comment:
            raise GenError(f"{example_path}:{k.lineno}: {k.dotted} has no comment there and no row in "
                           f"{DOCS}: describe it in one of them")
        for n, key in enumerate(g.keys[i:j]):
            out += [".TP" if n == 0 else ".TQ", key_tag(key)]
        out += row_troff(row) if row else comment_troff(g.comment, '.IP ""')
        i = j
    return out


def number_range(lo, hi):
    return rf"{escape(lo)} .. {escape(hi)}"


def parse_policies(text, path):
    policies = []  # (name, summary, [(param, default, min, max, doc)])
    for lineno, line in enumerate(text.splitlines(), 1):
        f = line.split("\t")
        if f[0] == "policy" and len(f) == 3:
            policies.append((f[1], f[2], []))
        elif f[0] == "param" and len(f) == 7 and policies and policies[-1][0] == f[1]:
            policies[-1][2].append(tuple(f[2:]))
        else:
            raise GenError(f"{path}:{lineno}: not a policy or param record: {line!r}")
    if not policies:
        raise GenError(f"{path}: no policies")
    return policies


def render_policies(policies):
    out = []
    done = []
    for name, summary, params in policies:
        out.append(f".SS {escape(name)}")
        out.append(text_lines(sentence(summary), prose))
        # A policy that takes another's parameters first (tandem: all of
        # mars's, then its own) says so instead of repeating them.
        base, rest = None, params
        for other, other_params in done:
            n = len(other_params)
            if n and params[:n] == other_params and n > len(params) - len(rest):
                base, rest = other, params[n:]
        out.append(".PP")
        if not params:
            out.append("It takes no parameters.")
        elif base:
            out.append(f"It takes every parameter of {bold(base)}, with the same defaults and ranges"
                       + (", and these:" if rest else "."))
        else:
            out.append("Parameters:")
        for pname, default, lo, hi, doc in rest:
            out += [".TP", safe_line(rf"{bold(pname)} = {escape(default)}"),
                    text_lines(sentence(doc), prose),
                    safe_line(r"\fIRange:\fR " + number_range(lo, hi))]
        done.append((name, params))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", required=True)
    ap.add_argument("--config-md", required=True)
    ap.add_argument("--policies", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--version", default="")
    ap.add_argument("--date", default="")
    args = ap.parse_args()
    try:
        with open(args.example, encoding="utf-8") as f:
            tables = parse_example(f.read(), args.example)
        with open(args.config_md, encoding="utf-8") as f:
            rows = parse_config_md(f.read(), args.config_md)
        with open(args.policies, encoding="utf-8") as f:
            policies = parse_policies(f.read(), args.policies)
        with open(args.template, encoding="utf-8") as f:
            template = f.read()
        page = fill(template, {
            "KEYS": "\n".join(render_tables(tables, rows, args.example)),
            "POLICY_PARAMS": "\n".join(render_policies(policies)),
            "VERSION": escape(args.version),
            "DATE": escape(args.date),
        }, args.template)
    except (GenError, OSError) as e:
        die("gen_config_page.py", e)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(page)


if __name__ == "__main__":
    main()
