"""One module or class per name across training/, index/ and service/: a name a reader meets in an import or a
traceback means one thing.

- **Modules**: no two modules of the three packages share a file name, except
  ``__init__.py`` (every package has one) and ``cli.py`` (each package's own commands, assembled by the
  ``jointspace`` console script: ``training/cli.py``, ``index/cli.py``, ``service/cli.py``); and the route modules
  of ``service/api/``, each named after the resource whose HTTP routes it holds (``service/api/gallery.py``:
  ``/v1/folders`` and ``/v1/images/{id}``, ``service/api/duplicates.py``: ``/v1/duplicates``, as the
  full-stack-fastapi-template's ``api/routes/<resource>.py``), which may share that name with the module of the
  index or the model library they serve (``index/gallery.py``, ``index/duplicates.py``,
  ``training/inference/generate.py``). Route modules are unique among themselves (one folder).
- **Classes**: no two classes defined in the three packages share a name, nested and private ones included (a
  pydantic model of the HTTP contract and the index's record of the same thing have different names:
  ``service.schemas.ImageHit``, ``index.hits.GalleryHit``).
- **Functions**: no two public module-level functions share a name, except the entry points every module of a kind
  has (:data:`ROLE_FUNCTIONS`: ``main`` of a runnable module, ``add_commands`` of a CLI module, ``router`` of a
  route module): the index's ``embed_sentences`` is not called ``embed_texts`` like the model library's."""
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "index", "service")
PER_PACKAGE = {"__init__.py", "cli.py"}       # a package's own: every package may have one
ROUTES = Path("service", "api")               # route modules: named after the resource they serve
ROLE_FUNCTIONS = {"main", "add_commands", "router"}     # a module's entry point of its kind


def _modules(root: Path) -> list[Path]:
    """Every ``.py`` file of the three packages under ``root``, relative to it."""
    return sorted(p.relative_to(root) for package in PACKAGES if (root / package).is_dir()
                  for p in (root / package).rglob("*.py"))


def shared_module_names(root: Path) -> dict[str, list[str]]:
    """File names that more than one module carries (the exceptions of the module docstring left out) → the
    modules."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules(root):
        if path.name not in PER_PACKAGE:
            by_name[path.name].append(path.as_posix())
    out = {}
    for name, paths in by_name.items():
        others = [p for p in paths if Path(p).parent != ROUTES]
        if len(others) > 1:         # a route module may share its name with one module outside service/api
            out[name] = paths
    return out


def shared_class_names(root: Path) -> dict[str, list[str]]:
    """Class names defined more than once in the three packages → where (``module:line``)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules(root):
        tree = ast.parse((root / path).read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                by_name[node.name].append(f"{path.as_posix()}:{node.lineno}")
    return {name: where for name, where in by_name.items() if len(where) > 1}


def shared_function_names(root: Path) -> dict[str, list[str]]:
    """Public module-level function names defined in more than one module of the three packages (the
    :data:`ROLE_FUNCTIONS` left out) → where (``module:line``)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules(root):
        for node in ast.parse((root / path).read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_") \
                    and node.name not in ROLE_FUNCTIONS:
                by_name[node.name].append(f"{path.as_posix()}:{node.lineno}")
    return {name: where for name, where in by_name.items() if len(where) > 1}


def test_one_module_per_name():
    modules = {p.as_posix() for p in _modules(ROOT)}
    # the walk reaches every package and subpackage, the exceptions included
    assert {"training/inference/querybank.py", "index/qbnorm.py", "service/api/gallery.py", "index/gallery.py",
            "training/models/protocol.py", "service/connection.py", "training/cli.py", "index/cli.py"} <= modules
    assert shared_module_names(ROOT) == {}


def test_one_class_per_name():
    assert shared_class_names(ROOT) == {}


def test_one_public_function_per_name():
    assert shared_function_names(ROOT) == {}


def test_the_checks_catch_a_second_meaning(tmp_path):
    def write(relative: str, text: str = "") -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    for package in ("training/inference", "index", "service/api"):
        write(f"{package}/__init__.py")
        write(f"{package}/cli.py")
    write("training/inference/querybank.py", "class Bank:\n    pass\n")
    write("index/querybank.py", "class Hit:\n    class Bank:\n        pass\n")
    write("index/gallery.py", "class _Row:\n    pass\n")
    write("service/api/gallery.py", "class Hit:\n    pass\n")          # a route module: its name is free
    write("service/schemas.py", "class _Row:\n    pass\n")
    assert shared_module_names(tmp_path) == {"querybank.py": ["index/querybank.py",
                                                              "training/inference/querybank.py"]}
    assert shared_class_names(tmp_path) == {"Bank": ["index/querybank.py:2", "training/inference/querybank.py:1"],
                                            "Hit": ["index/querybank.py:1", "service/api/gallery.py:1"],
                                            "_Row": ["index/gallery.py:1", "service/schemas.py:1"]}
    write("index/embed.py", "def embed_texts():\n    pass\n\n\ndef main():\n    pass\n\n\ndef _read():\n    pass\n")
    write("training/inference/embedding.py", "def embed_texts():\n    pass\n\n\ndef main():\n    pass\n")
    write("service/api/videos.py", "def _read():\n    pass\n\n\nclass Reader:\n    def embed_texts(self):\n"
                                   "        pass\n")
    assert shared_function_names(tmp_path) == {"embed_texts": ["index/embed.py:1",
                                                               "training/inference/embedding.py:1"]}
    write("service/gallery.py")          # a second module outside service/api named as the route module
    assert shared_module_names(tmp_path)["gallery.py"] == ["index/gallery.py", "service/api/gallery.py",
                                                           "service/gallery.py"]
