"""Generated blocks of the docs: the text between two marker comments in README.md and docs/*.md,

    <!-- table:NAME -->
    ...generated text...
    <!-- /table:NAME -->

rewritten from a mapping of NAME to the function that renders it. Two scripts own blocks: benchmarks/tables.py
(the tables of measured results) and benchmarks/config_reference.py (the config reference); markers inside fenced
code blocks are examples, left alone."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Collection, Mapping

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- table:([\w.-]+) -->(.*?)<!-- /table:\1 -->", re.S)
OPEN_MARKER = re.compile(r"<!-- (/?)table:([\w.-]+) -->")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)

Blocks = Mapping[str, Callable[[], str]]


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(blocks: Blocks, name: str) -> str:
    return "\n" + blocks[name]().rstrip("\n") + "\n"


def fences(text: str) -> list[tuple[int, int]]:
    """spans of the fenced code blocks: markers inside them are examples, not tables"""
    return [m.span() for m in FENCE.finditer(text)]


def markers(pattern: re.Pattern, text: str) -> list[re.Match]:
    spans = fences(text)
    return [m for m in pattern.finditer(text) if not any(a <= m.start() < b for a, b in spans)]


def process(blocks: Blocks, text: str, path: str, errors: list[str],
            elsewhere: Collection[str] | None = None) -> tuple[str, list[str]]:
    """(the text with every block of ``blocks`` regenerated, the names of the blocks that differed). Blocks of
    other names are left as they are; with ``elsewhere`` (the names other scripts own), one of a name in neither is
    an error."""
    opened = [m.group(2) for m in markers(OPEN_MARKER, text) if not m.group(1)]
    closed = [m.group(2) for m in markers(OPEN_MARKER, text) if m.group(1)]
    paired = [m.group(1) for m in markers(MARKER, text)]
    spans = fences(text)
    for name in sorted(set(opened + closed)):
        if opened.count(name) != closed.count(name) or opened.count(name) != paired.count(name):
            errors.append(f"{path}: unmatched or nested markers for table {name}")
    differ: list[str] = []

    def replace(m: re.Match) -> str:
        name = m.group(1)
        if any(a <= m.start() < b for a, b in spans):
            return m.group(0)
        if name not in blocks:
            if elsewhere is not None and name not in elsewhere:
                errors.append(f"{path}: unknown table {name} (known: {', '.join([*blocks, *elsewhere])})")
            return m.group(0)
        try:
            new = render(blocks, name)
        except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError) as e:
            errors.append(f"{path}: table {name}: its data could not be rendered: {type(e).__name__}: {e}")
            return m.group(0)
        if new != m.group(2):
            differ.append(name)
        return f"<!-- table:{name} -->{new}<!-- /table:{name} -->"

    return MARKER.sub(replace, text), differ


def rewrite(blocks: Blocks, check: bool, root: Path, script: str, elsewhere: Collection[str] | None = None) -> int:
    """Regenerates every block of ``blocks`` in the docs under ``root`` (``check``: changes nothing, names every
    block that differs); errors (to stderr) when one is in no document or cannot be rendered, and with
    ``elsewhere`` when a marker names a block nobody owns. ``script`` is named in the message of one that differs.
    The exit status: 1 on any error."""
    errors: list[str] = []
    used: set[str] = set()
    for path in doc_files(root):
        if not path.exists():
            continue
        text = path.read_text()
        used |= {m.group(1) for m in markers(MARKER, text)}
        new, differ = process(blocks, text, str(path.relative_to(root)), errors, elsewhere)
        for name in differ:
            if check:
                errors.append(f"{path.relative_to(root)}: table {name} differs from its data "
                              f"(python {script} rewrites it)")
        if not check and new != text:
            path.write_text(new)
            print(f"{path.relative_to(root)}: rewrote {', '.join(differ)}")
    for name in blocks:
        if name not in used:
            errors.append(f"table {name} is in no document (README.md, docs/*.md)")
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0
