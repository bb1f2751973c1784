"""The ``jointspace`` console script: one parser, each package contributing its own subcommands.

This module sits at the top of the data flow (service may import index and training), so it is the one
place that assembles every stage's commands, and the one module of index and service that imports the training
application: its commands module, ``training/cli.py``, whose commands import the trainer only when they run
(``tests/test_layout.py`` checks both; torchrun starts training processes through it too).
"""
from __future__ import annotations

import argparse
import sys

from index import cli as index_cli
from training import cli as training_cli

from . import serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jointspace", description="image-text retrieval in a common vector space")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    training_cli.add_commands(sub)
    index_cli.add_commands(sub)
    serve.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:
        print(f"jointspace {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
