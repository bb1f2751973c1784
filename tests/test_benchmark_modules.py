"""Every benchmark script imports: a name it takes from the project that was renamed or moved fails here, in the
suite, not months later when the benchmark is run again."""
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_imports(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__file__ and Path(module.__file__).stem == name
