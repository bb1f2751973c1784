"""The package layout: imports run one way (the training application → training.inference → training.models →
training.data, and training → index → service), index and service use the model library and never the training
application, no module imports itself back through a cycle, a package's ``__init__.py`` imports nothing, and a
``model.pt`` pickles no class of this project (so moving a module cannot break loading one). Every import counts:
lazy ones inside functions and ``if TYPE_CHECKING:`` ones too."""
import ast
import pickle
import re
import subprocess
import sys
import tomllib
from importlib.util import resolve_name
from pathlib import Path
from typing import Iterator

import pytest
import torch

from conftest import tiny_config
from training.data.vocab import Vocabulary
from training.models.model import build_model
from training.models.checkpoint import save_model

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "index", "service")
# lowest first: a module may import its own layer and the layers below it, never one above
LAYERS = ("training.data", "training.models", "training.inference", "training", "index", "service")
# the model library: all that index and service may import of training; the modules of training/ itself are the
# training application (trainer, stages, evaluation, zoo, the training commands)
LIBRARY = ("training.data", "training.models", "training.inference")
# some of the application, by name: what index and service must not reach (and what the rule is checked to cover)
APPLICATION = ("training.train", "training.trainer", "training.batches", "training.stt", "training.scst",
               "training.distributed", "training.evaluate", "training.caption_eval", "training.cider",
               "training.ranking", "training.zoo", "training.config", "training.cli")
# the `jointspace` console script assembles every package's subcommands (train, evaluate, ... beside index and
# serve), and torchrun starts training processes through it (`-m service.cli train`, training/distributed.py): the
# one module outside training/ that may import the application, and only its commands module
ENTRY_POINT, ENTRY_IMPORTS = "service.cli", {"training.cli"}


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


def in_library(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in LIBRARY)


def application(graph: dict[str, set[str]]) -> set[str]:
    """The training application: the modules of ``training`` outside the library (the package file aside)."""
    return {m for m in graph if m.startswith("training.") and not in_library(m)}


def application_imports(graph: dict[str, set[str]]) -> list[str]:
    """index and service modules that import the training application (the entry point: only ENTRY_IMPORTS)."""
    app = application(graph)
    return sorted(f"{m} imports {t}" for m, targets in graph.items() if m.split(".")[0] in ("index", "service")
                  for t in targets & app if not (m == ENTRY_POINT and t in ENTRY_IMPORTS))


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


# a path of the repository named in a doc: from a top-level folder on, as in `training/models/factory.py`
DOC_PATH = re.compile(r"(?<![\w./-])((?:training|index|service|tests|docs|benchmarks|configs|deploy)/(?:[\w./-]*\w/?)?)")


def doc_paths(text: str) -> set[str]:
    return set(DOC_PATH.findall(text))


def doc_layers(text: str) -> tuple[str, ...]:
    """The first column of the table under ``## The layers`` (backquoted dotted names), in order."""
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    return tuple(re.findall(r"^\| `([\w.]+)` \|", section, re.M))


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


def test_index_and_service_use_the_library_not_the_training_application(graph):
    assert application_imports(graph) == []
    assert set(APPLICATION) <= application(graph)            # the application is where the rule expects it
    # the library is used (the rule is not vacuous): device resolution, embedding, shapes, generation, shipped models
    used = {t for m in graph for t in graph[m] if m.startswith(("index.", "service."))}
    assert {"training.inference.device", "training.inference.embedding", "training.inference.shapes",
            "training.inference.generate", "training.inference.pretrained"} <= used
    # the entry point is the console script, and nothing imports it: the exception cannot reach the server
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"jointspace": f"{ENTRY_POINT}:main"}
    assert [m for m, targets in graph.items() if ENTRY_POINT in targets] == []
    # and what it imports of the application imports nothing of ours until a training command runs
    for name in ENTRY_IMPORTS:
        body = ast.parse((ROOT / (name.replace(".", "/") + ".py")).read_text()).body
        top = [a.name for n in body if isinstance(n, ast.Import) for a in n.names] + [
            n.module or "." for n in body if isinstance(n, ast.ImportFrom)]
        assert [t for t in top if t.startswith(".") or t.split(".")[0] in PACKAGES] == [], name


def test_serving_loads_no_training_application():
    """What ``jointspace serve`` and ``index build`` run imports nothing of the application, by any route."""
    code = ("import sys, service.app, service.serve, service.state, index.cli, index.gallery\n"
            "print(*(m for m in sys.modules if m.startswith('training.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "training.inference.embedding" in loaded and [m for m in loaded if not in_library(m)] == []


def test_no_import_cycle(graph):
    assert cycles(graph) == []


def test_package_inits_import_nothing_of_ours():
    """``training``'s package files import nothing at all (no import for its side effects); ``index``'s and
    ``service``'s none of the project's modules."""
    inits = {p.relative_to(ROOT).as_posix(): p for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")}
    assert {"training/__init__.py", "training/models/__init__.py", "training/data/__init__.py",
            "training/inference/__init__.py"} <= set(inits)
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


def test_the_check_catches_index_or_service_reaching_the_application(tmp_path):
    root = write(tmp_path, {
        "training/__init__.py": "", "training/models/__init__.py": "", "training/inference/__init__.py": "",
        "index/__init__.py": "", "service/__init__.py": "",
        "training/cli.py": "", "training/trainer.py": "", "training/inference/device.py": "",
        "training/models/model.py": "",
        # a lazy import of the application, and one of the library (allowed)
        "index/cli.py": "from training.models import model\ndef load():\n    from training.trainer import fit\n",
        "service/state.py": "from training.inference.device import resolve_device\n",
        # the entry point may import the training commands, and nothing else of the application
        "service/cli.py": "from training import cli\nimport training.trainer\n",
    })
    assert application_imports(import_graph(root)) == ["index.cli imports training.trainer",
                                                       "service.cli imports training.trainer"]


def test_the_architecture_doc_matches_the_code():
    """docs/architecture.md: every path it names exists, and its layers are LAYERS, lowest first."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = doc_paths(text)
    assert {"training/inference/embedding.py", "service/api/", "index/faiss_index.py", "training/models/factory.py"} <= paths
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []
    assert doc_layers(text) == LAYERS
    assert ENTRY_POINT.replace(".", "/") + ".py" in paths


def test_the_doc_checks_catch_a_missing_path_and_a_layer_out_of_order():
    text = "## The layers\n\n| layer |\n|---|\n| `index` | x |\n| `training` | y |\n\n## Next\n| `service` |\n"
    assert doc_layers(text) == ("index", "training")
    assert doc_paths("in `training/models/gone.py`, (index/), and service/api/search.py. Not docs.md or "
                     "a/training/x.py") == {"training/models/gone.py", "index/", "service/api/search.py"}


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
