"""Shared helpers of the man page generators (gen_help_page.py,
gen_config_page.py): troff escaping, inline markup and template filling.

Everything here turns plain text (a --help line, a TOML comment, a cell of a
Markdown table) into man(7) source that groff renders without warnings:
backslashes and hyphens escaped, a control character never at the start of a
line, characters outside ASCII written as groff special characters. Errors
are GenError, which the generators print and exit 1 on: a page that cannot be
generated faithfully is a build failure, never a silently thinner page.
"""

import re
import sys

# groff names for the characters our sources use; anything else outside
# ASCII becomes \[uXXXX], which groff also understands.
_SPECIAL = {
    "\u2192": r"\(->",  # →
    "\u2190": r"\(<-",  # ←
    "\u2264": r"\(<=",  # ≤
    "\u2265": r"\(>=",  # ≥
    "\u2260": r"\(!=",  # ≠
    "\u00d7": r"\(mu",  # ×
    "\u2013": r"\(en",  # –
    "\u2014": r"\(em",  # —
    "\u2018": r"\(oq",  # ‘
    "\u2019": r"\(cq",  # ’
    "\u201c": r"\(lq",  # “
    "\u201d": r"\(rq",  # ”
    "\u00b5": r"\(mc",  # µ
    "\u03b1": r"\(*a",  # α
    "\u2026": r".\|.\|.",  # …
    "\u00a0": r"\~",  # no-break space
}


class GenError(Exception):
    """Something in a source the generator cannot render faithfully."""


def die(prog, err):
    print(f"{prog}: error: {err}", file=sys.stderr)
    sys.exit(1)


def escape(text):
    """Plain text to troff text: every character means itself."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append(r"\e")
        elif ch == "-":
            # \- is the ASCII hyphen-minus: options and paths stay
            # copy-pastable and searchable.
            out.append(r"\-")
        elif ch in _SPECIAL:
            out.append(_SPECIAL[ch])
        elif ord(ch) > 126:
            out.append(rf"\[u{ord(ch):04X}]")
        elif ord(ch) < 32 and ch != "\t":
            raise GenError(f"control character {ch!r} in {text!r}")
        else:
            out.append(ch)
    # A range ("1 .. 65536") is never broken across lines.
    return "".join(out).replace(" .. ", r"\~..\~")


def bold(text):
    return rf"\fB{escape(text)}\fR"


def italic(text):
    return rf"\fI{escape(text)}\fR"


# An option as it appears in running text: -h, --json, --timeout-ms, --opt=.
_OPTION = re.compile(r"(?<![\w/.$-])(--?[A-Za-z][\w-]*)")


def prose(text):
    """Running text from --help or a comment: options in bold."""
    parts = _OPTION.split(text)
    return "".join(bold(p) if i % 2 else escape(p) for i, p in enumerate(parts))


# Markdown inline markup we meet in docs/*.md table cells.
_MD_TOKEN = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*|\[([^\]]+)\]\([^)]*\)")


def markdown(text):
    """A Markdown table cell or sentence: `code` and **strong** in bold,
    [links](target) as their text."""
    text = text.replace(r"\|", "|")
    out = []
    pos = 0
    for m in _MD_TOKEN.finditer(text):
        out.append(prose(text[pos:m.start()]))
        if m.group(1) is not None:
            out.append(bold(m.group(1)))
        elif m.group(2) is not None:
            out.append(bold(m.group(2)))
        else:
            out.append(markdown(m.group(3)))
        pos = m.end()
    out.append(prose(text[pos:]))
    return "".join(out)


def capitalize(text):
    """Upper-cases the first letter of an ordinary word; a name (tandemctl,
    cpu.weight, active_tools, h) or a value in a list ("trace, debug") is
    left as it is."""
    m = re.match(r"([a-z]+)(\S*)", text)
    if not m:
        return text
    word, tail = m.group(1), m.group(2)
    if word.startswith("tandem") or (len(word) == 1 and word != "a"):
        return text
    if not re.fullmatch(r"(-[A-Za-z0-9]+)*([:;!?)]|'s|')?", tail):
        return text
    return text[:1].upper() + text[1:]


def sentence(text):
    """Capitalised and ending in a full stop."""
    text = capitalize(text.strip())
    if text and text[-1] not in ".!?":
        text += "."
    return text


def text_lines(text, convert=None):
    """Running text as troff lines, one sentence a line, so that troff
    knows where sentences end (and spaces them as man pages do)."""
    convert = convert or markdown
    parts = []
    for piece in re.split(r"(?<=[.!?])\s+(?=[A-Z(\"`])", text.strip()):
        if parts and parts[-1].count("`") % 2:  # never inside a `code` span
            parts[-1] += " " + piece
        else:
            parts.append(piece)
    return "\n".join(safe_line(convert(p)) for p in parts if p)


def safe_line(line):
    """A text line that troff must not read as a request."""
    if line.startswith((".", "'")):
        return r"\&" + line
    return line


def fill(template, values, source):
    """Replaces every @NAME@ in template; a placeholder without a value, or a
    value the template never uses, is an error."""
    used = set()

    def sub(m):
        name = m.group(1)
        if name not in values:
            raise GenError(f"{source}: unknown placeholder @{name}@")
        used.add(name)
        return values[name]

    out = re.sub(r"@([A-Z_]+)@", sub, template)
    unused = set(values) - used
    if unused:
        raise GenError(f"{source}: never uses @{'@, @'.join(sorted(unused))}@")
    return out
