"""Every benchmark script imports, and every project name it imports inside its functions exists: a name that was
renamed or moved fails here, in the suite, not months later when the benchmark is run again."""
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))
PROJECT = ("training", "index", "service", "benchmarks")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_imports(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__file__ and Path(module.__file__).stem == name


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_project_name_it_imports_exists(name):
    """``from training.x import y`` anywhere in the script (inside functions too, where the benchmark imports late)."""
    tree = ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PROJECT:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"line {node.lineno}: {node.module}.{alias.name}")
    assert not missing, f"benchmarks/{name}.py imports names that do not exist: {missing}"
