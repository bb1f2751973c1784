"""The package layout: imports run one way (the application → training.models → training.data, and
training → index → service), no module imports itself back through a cycle, a package's ``__init__.py``
imports nothing, and a ``model.pt`` pickles no class of this project (so moving a module cannot break
loading one). Every import counts: lazy ones inside functions and ``if TYPE_CHECKING:`` ones too."""
import ast
import pickle
from importlib.util import resolve_name
from pathlib import Path
from typing import Iterator

import pytest
import torch

from conftest import tiny_config
from training.data.vocab import Vocabulary
from training.models.model import build_model, save_model

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "index", "service")
# lowest first: a module may import its own layer and the layers below it, never one above
LAYERS = ("training.data", "training.models", "training.inference", "training", "index", "service")


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported(path: Path, package: str) -> Iterator[str]:
    """The dotted names that a module's import statements name, lazy ones included: ``import a.b`` → ``a.b``,
    ``from a import b`` → ``a.b`` (a module, or a name in ``a``), relative ones resolved against ``package``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the project modules it imports (the longest project module each imported name starts with)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        for target in imported(path, name if path.name == "__init__.py" else name.rpartition(".")[0]):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def layer(module: str) -> int:
    """The index in LAYERS of the most specific layer that holds ``module``."""
    holders = [prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")]
    return LAYERS.index(max(holders, key=len))


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets if layer(t) > layer(m))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_imports_run_down_the_layers(graph):
    assert upward_imports(graph) == []
    # the layers are there and used, so the check above is not vacuous
    assert "training.data.vocab" in graph["training.models.model"]
    assert "training.models.model" in graph["training.trainer"]
    assert any(t.startswith("training.") for t in graph["index.gallery"])


def test_no_import_cycle(graph):
    assert cycles(graph) == []


def test_package_inits_import_nothing_of_ours():
    """``training``'s package files import nothing at all (no import for its side effects); ``index``'s and
    ``service``'s none of the project's modules."""
    inits = {p.relative_to(ROOT).as_posix(): p for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")}
    assert {"training/__init__.py", "training/models/__init__.py", "training/data/__init__.py"} <= set(inits)
    for rel, path in inits.items():
        imports = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
        if rel.startswith("training/"):
            assert imports == [], rel
        else:
            names = [a.name for n in imports for a in n.names] + [n.module or "" for n in imports
                                                                   if isinstance(n, ast.ImportFrom)]
            assert not [n for n in names if n.split(".")[0] in PACKAGES] and not any(
                isinstance(n, ast.ImportFrom) and n.level for n in imports), rel


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    root = write(tmp_path, {
        "training/__init__.py": "", "training/models/__init__.py": "", "training/data/__init__.py": "",
        "index/__init__.py": "", "service/__init__.py": "",
        "training/trainer.py": "from training.models import net\n",
        # a lazy import of the application from the model library, and a relative one from data to models
        "training/models/net.py": "def f():\n    from .. import trainer\n",
        "training/data/vocab.py": "from ..models.net import f\n",
        "index/gallery.py": "import service.app\n",
        "service/app.py": "from training.data import vocab\n",
    })
    graph = import_graph(root)
    assert upward_imports(graph) == ["index.gallery imports service.app", "training.data.vocab imports training.models.net",
                                     "training.models.net imports training.trainer"]
    assert cycles(graph) == [["training.models.net", "training.trainer"]]


def test_the_shipped_model_pickles_no_class_of_ours():
    shipped = sorted((ROOT / "training" / "pretrained").glob("*.pt"))
    assert shipped
    for path in shipped:
        # weights_only refuses any global but tensors and plain containers: no module path is stored
        payload = torch.load(path, map_location="cpu", weights_only=True)
        assert payload["format"].startswith("jointspace")


def test_a_saved_model_pickles_no_class_of_ours(tmp_path):
    vocab = Vocabulary.build(["a red circle", "a blue square"])
    model = build_model(tiny_config(), vocab, load_weights=False)
    save_model(model, tmp_path / "model.pt")
    payload = torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=True)
    assert payload["vocab"] == vocab.to_dict() and payload["state_dict"]
    torch.save({"vocab": vocab}, tmp_path / "bad.pt")     # what a pickled class of ours would look like
    with pytest.raises(pickle.UnpicklingError, match="training.data.vocab"):
        torch.load(tmp_path / "bad.pt", map_location="cpu", weights_only=True)
