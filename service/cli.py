"""The ``jointspace`` console script: one parser, each package contributing its own subcommands.

This module sits at the top of the data flow (service may import index and training), so it is the one
place that assembles every stage's commands, and the one module of index and service that imports the training
application: its commands module, ``training/cli.py``, whose commands import the trainer only when they run
(``tests/test_layout.py`` checks both; torchrun starts training processes through it too).
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import NoReturn

from index import cli as index_cli
from training import cli as training_cli

from . import serve


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose error for an unknown command or choice adds the closest known one ("did you mean:
    search"); every subcommand's parser is one too (argparse makes subparsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            known = re.findall(r"'([^']*)'", found.group(2)) or [c.strip() for c in found.group(2).split(",")]
            close = difflib.get_close_matches(found.group(1), known, n=1, cutoff=0.6)
            if close:
                message = f"{message}; did you mean: {close[0]}?"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jointspace", description="image-text retrieval in a common vector space")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # what a user of the gallery runs first (index, serve), then training and research
    index_cli.add_commands(sub)
    serve.add_commands(sub)
    training_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = " ".join(["jointspace", args.command, *([args.index_command] if args.command == "index" else [])])
    try:
        code = args.func(args) or 0
        sys.stdout.flush()                  # a closed pipe is found here, not at exit
        return code
    except BrokenPipeError:
        # the reader went away (`jointspace index info | head`): stop quietly, and keep the interpreter from
        # failing again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        print(f"{command}: error: {_said(err)}", file=sys.stderr)
        return 2


def _said(err: BaseException) -> str:
    """An error as a sentence: an OS error as its path and reason (not "[Errno 2] No such file or directory: 'x'"),
    a KeyError without its quotes."""
    if isinstance(err, OSError) and err.strerror:            # raised by the system, not by a message of ours
        return f"{err.filename}: {err.strerror}" if err.filename is not None else err.strerror
    if isinstance(err, KeyError) and len(err.args) == 1:
        return str(err.args[0])
    return str(err)


if __name__ == "__main__":
    sys.exit(main())
