#!/usr/bin/env python3
"""Builds a man page from a hand-written troff template and a program's
--help, so the page's synopsis, commands and options cannot drift from the
binary (tandemctl(8), tandemd(8); docs/man.md).

    gen_help_page.py --binary BIN --template PAGE.in --output PAGE
                     [--version V] [--date D] [--default-section NAME]
                     [--commands-heading NAME] [--skip HEADING]...

It runs `BIN --help` and reads the text as blocks separated by blank lines:

  usage: prog ARGS            @USAGE@: the SYNOPSIS, one .SY per form (a
         prog OTHER ARGS      line not starting with prog continues a form)

  header (note)               a section HEADER (.SH) opening with the note,
    term    description       one .TP entry per term; a term alone on its
    term                      line takes the deeper-indented lines below it
            description       as its description; lines indented between
                              the term and the description column are
                              sub-entries (.RS/.TP)
  header                      a section whose lines have no term/description
    text text                 gap is a paragraph; "0 ok; 1 failed; ..." is
                              a list of codes
    term    description       a block without a header: section
                              --default-section (OPTIONS)
  Heading: text ...           a section HEADING with that text
  text ...                    a paragraph of the section above it (NOTES
                              when it comes first)

With --commands-heading COMMANDS, the entry sections other than OPTIONS
become subsections (.SS) of one COMMANDS section ("looking", "steering"),
or its body if the help calls the section that. The sections replace @HELP@
in the template, in --help's order; @VERSION@ and @DATE@ are filled too.

A template section right after the line `.\\" FALLBACK` is used only if
--help has no section of that name; --skip drops a --help section the
template writes by hand. Anything else — a block of another shape, a
section both have, an unknown placeholder — is an error: the generator
exits 1 and says what it could not place.
"""

import argparse
import re
import subprocess

from manlib import GenError, bold, die, escape, fill, italic, safe_line, sentence, text_lines

_GAP = re.compile(r"\S(\s{2,})\S")


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


class Entry:
    def __init__(self, term, desc_col):
        self.term = term
        self.desc = []  # description lines, stripped
        self.desc_col = desc_col  # column the description starts at, or None
        self.sub = []  # sub-entry lines, raw; then sub-entries


class Section:
    def __init__(self, heading, note=None):
        self.heading = heading  # upper-cased
        self.title = heading  # as --help writes it, for a subsection
        self.note = note  # the header's parenthetical
        self.entries = []
        self.paragraphs = []  # free text: a paragraph, or the section's text


def is_entry_list(lines):
    """Term/description lines, as opposed to an indented paragraph."""
    base = indent_of(lines[0])
    return any(indent_of(l) > base for l in lines) or any(_GAP.search(l[base:]) for l in lines)


def parse_entries(lines, where):
    """Indented `term  description` lines into Entries."""
    base = indent_of(lines[0])
    entries = []
    for line in lines:
        ind = indent_of(line)
        if ind < base:
            raise GenError(f"{where}: {line.strip()!r} is indented less than the entries above it")
        if ind == base:
            text = line[base:]
            m = _GAP.search(text)
            if m:
                e = Entry(text[: m.start(1)], base + m.end(1))
                e.desc.append(text[m.end(1):].strip())
            else:
                e = Entry(text.rstrip(), None)
            entries.append(e)
            continue
        e = entries[-1]
        if e.desc_col is None:
            e.desc_col = ind
        if ind >= e.desc_col and not e.sub:
            e.desc.append(line.strip())
        else:
            # Indented between the term and its description: a sub-entry
            # (and everything after it is the sub-entries' text).
            e.sub.append(line)
    for e in entries:
        if e.sub:
            e.sub = parse_entries(e.sub, f"{where}: {e.term}")
    return entries


# A word in a term or a usage line: METAVARIABLEs and the conventional
# placeholders ("[options]") in italics, the rest (commands, options) bold;
# brackets, bars, commas, equals signs and ellipses in roman.
_TERM_TOKEN = re.compile(r"(\s+|[\[\]|,=(){}]|\.\.\.)")
_PLACEHOLDERS = {"options", "option", "command", "commands", "args", "arguments"}


def term_markup(term):
    out = []
    for tok in _TERM_TOKEN.split(term):
        if not tok:
            continue
        if tok.isspace():
            out.append(" ")
        elif _TERM_TOKEN.fullmatch(tok):
            out.append(r"\&.\|.\|." if tok == "..." else escape(tok))
        elif re.fullmatch(r"[A-Z][A-Z0-9_]*", tok) or tok in _PLACEHOLDERS:
            out.append(italic(tok))
        else:
            out.append(bold(tok))
    return safe_line("".join(out))


def text_troff(text):
    return text_lines(sentence(text))


def render_entries(entries):
    out = []
    for e in entries:
        out.append(".TP")
        out.append(term_markup(e.term))
        desc = " ".join(e.desc)
        if re.fullmatch(r"(show |print )?this (text|help|message)\.?", desc, re.IGNORECASE):
            desc = "print this help and exit"  # reads wrong outside --help
        if desc:
            out.append(text_troff(desc))
        if e.sub:
            out.append(".RS")
            out.extend(render_entries(e.sub))
            out.append(".RE")
    return out


def render_text(text):
    """A paragraph; "0 success; 1 failed; 2 usage error" as a list of codes."""
    items = [i.strip() for i in text.rstrip(".").split(";")]
    if len(items) > 1 and all(re.match(r"\d+\s+\S", i) for i in items):
        out = []
        for item in items:
            code, desc = item.split(None, 1)
            out += [".TP", bold(code), text_troff(desc)]
        return out
    return [text_troff(text)]


def parse_help(text, prog, default_section):
    """--help text into (usage lines, [Section])."""
    if "\t" in text:
        raise GenError(f"{prog} --help has a tab; it must indent with spaces")
    blocks, cur = [], []
    for line in text.rstrip("\n").split("\n"):
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)

    usage, sections = [], []
    for n, block in enumerate(blocks, 1):
        where = f"{prog} --help, block {n} ({block[0].strip()!r})"
        head_indented = indent_of(block[0]) > 0
        if block[0].lower().startswith("usage:"):
            for line in block:
                line = re.sub(r"^usage:\s*", "", line.strip(), flags=re.IGNORECASE)
                # Each form starts with the program's name; other lines
                # continue the form above.
                if usage and line.split()[0] != usage[0].split()[0]:
                    usage[-1] += " " + line
                else:
                    usage.append(line)
        elif head_indented:
            if not all(indent_of(l) > 0 for l in block):
                raise GenError(f"{where}: an indented list with an unindented line in it")
            s = Section(default_section.upper())
            s.entries = parse_entries(block, where)
            sections.append(s)
        elif len(block) > 1 and all(indent_of(l) > 0 for l in block[1:]) and not _GAP.search(block[0]):
            m = re.fullmatch(r"([^(]*?)\s*(?:\((.*)\))?:?", block[0].strip())
            if not m or not m.group(1):
                raise GenError(f"{where}: cannot read the header {block[0]!r}")
            s = Section(m.group(1).upper(), m.group(2))
            s.title = m.group(1)
            if is_entry_list(block[1:]):
                s.entries = parse_entries(block[1:], where)
            else:
                s.paragraphs.append(" ".join(l.strip() for l in block[1:]))
            sections.append(s)
        elif all(indent_of(l) == 0 for l in block):
            para = " ".join(l.strip() for l in block)
            m = re.match(r"([A-Z][A-Za-z ]{0,30}):\s+(.*)", para)
            if m:
                s = Section(m.group(1).upper())
                s.paragraphs.append(m.group(2))
                sections.append(s)
            elif sections:
                sections[-1].paragraphs.append(para)  # about the list above it
            else:
                s = Section("NOTES")
                s.paragraphs.append(para)
                sections.append(s)
        else:
            raise GenError(f"{where}: neither a usage line, a list of entries nor a paragraph")
    if not usage:
        raise GenError(f"{prog} --help has no 'usage:' line")
    return usage, sections


_FALLBACK = re.compile(r'(?m)^\.\\" FALLBACK\n\Z')


def split_template(template):
    """The template as (preamble, [(heading, text, fallback)]): its .SH
    sections, each marked whether the line before it says FALLBACK."""
    parts = re.split(r"(?m)^(?=\.SH )", template)
    fallback = bool(_FALLBACK.search(parts[0]))
    preamble = _FALLBACK.sub("", parts[0])
    chunks = []
    for part in parts[1:]:
        heading = part.split("\n", 1)[0][4:].strip().strip('"').upper()
        next_fallback = bool(_FALLBACK.search(part))
        chunks.append((heading, _FALLBACK.sub("", part), fallback))
        fallback = next_fallback
    return preamble, chunks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--version", default="")
    ap.add_argument("--date", default="")
    ap.add_argument("--default-section", default="OPTIONS")
    ap.add_argument("--commands-heading", help="group the entry sections other than OPTIONS under this .SH")
    ap.add_argument("--skip", action="append", default=[],
                    help="a --help section (or 'Heading:' paragraph) the template writes by hand")
    args = ap.parse_args()
    prog = args.binary.rsplit("/", 1)[-1]
    try:
        run = subprocess.run([args.binary, "--help"], capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            raise GenError(f"{args.binary} --help exited {run.returncode}: {run.stderr.strip()}")
        if run.stderr.strip():
            raise GenError(f"{args.binary} --help wrote to stderr: {run.stderr.strip()}")
        usage, sections = parse_help(run.stdout, prog, args.default_section)

        skips = {s.upper().rstrip(":") for s in args.skip}
        unused = skips - {s.heading for s in sections}
        if unused:
            raise GenError(f"--skip {', '.join(sorted(unused))}: no such section in {prog} --help")
        sections = [s for s in sections if s.heading not in skips]

        with open(args.template, encoding="utf-8") as f:
            preamble, chunks = split_template(f.read())
        generated = set()
        out = []
        group = args.commands_heading.upper() if args.commands_heading else None
        in_group = False
        for s in sections:
            grouped = group and s.entries and s.heading not in (args.default_section.upper(), "OPTIONS")
            if grouped:
                if not in_group:
                    if group in generated:
                        raise GenError(f"{prog} --help: the {group} are not one run of sections")
                    out.append(f'.SH "{escape(group)}"')
                    generated.add(group)
                    in_group = True
                if s.heading != group:
                    out.append(f'.SS "{escape(s.title[:1].upper() + s.title[1:])}"')
            else:
                in_group = False
                if s.heading in generated:
                    raise GenError(f"{prog} --help has two sections {s.heading}")
                generated.add(s.heading)
                out.append(f'.SH "{escape(s.heading)}"')
            if s.note:
                out.append(text_troff(s.note))
            out.extend(render_entries(s.entries))
            for i, para in enumerate(s.paragraphs):
                if s.entries or i:
                    out.append(".PP")
                out.extend(render_text(para))

        page = preamble
        for heading, text, fallback in chunks:
            if heading in generated:
                if not fallback:
                    raise GenError(f"{prog} --help has a section {heading} and so has {args.template}: "
                                   f"mark the template's FALLBACK, or --skip the help's")
                continue  # --help's own section replaces the template's
            page += text
        synopsis = []
        for line in usage:  # .SY/.YS: a form's wrapped lines hang under its name
            name, _, rest = line.partition(" ")
            synopsis.append(f".SY {escape(name)}")
            if rest.strip():
                synopsis.append(term_markup(rest.strip()))
            synopsis.append(".YS")
        page = fill(page, {
            "USAGE": "\n".join(synopsis),
            "HELP": "\n".join(out),
            "VERSION": escape(args.version),
            "DATE": escape(args.date),
        }, args.template)
    except (GenError, OSError, subprocess.SubprocessError) as e:
        die("gen_help_page.py", e)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(page)


if __name__ == "__main__":
    main()
