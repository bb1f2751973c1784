"""The config reference in docs/training.md, generated from the typed config models and the registry's options
models (training/models/config_schema.py ``reference_markdown``) between its markers (benchmarks/doc_blocks.py).

    python benchmarks/config_reference.py            # rewrite it in place
    python benchmarks/config_reference.py --check    # exit 1 when it differs from what the models give
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.doc_blocks import rewrite  # noqa: E402


def config_reference() -> str:
    from training.models.config_schema import reference_markdown

    return reference_markdown()


BLOCKS = {"config_reference": config_reference}


def run(check: bool, root: Path = ROOT) -> int:
    return rewrite(BLOCKS, check, root, "benchmarks/config_reference.py")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when the reference differs")
    return run(ap.parse_args(argv).check)


if __name__ == "__main__":
    sys.exit(main())
