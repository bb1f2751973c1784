"""No hook that a protocol declares is looked up by name: what the code asks of a model, an ensemble's member, a
sentence encoder or a loss is declared on its protocol (``training.models.protocol.EmbeddingModel``,
``training.models.ensemble.Member``, ``training.models.text_protocol.TextEncoder``) or on the base class that
gives its default (``TextEncoderBase``, ``losses.Loss``, ``ensemble.CommonSpace``), and read as an attribute, which
mypy checks, never as ``getattr(model, "concepts", None)`` or ``hasattr(encoder, "tokenizer_json")``, which hides
a missing or misspelt hook behind its default.

The check reads the source of training/, index/ and service/: every ``getattr``/``hasattr`` whose attribute is a
string literal naming a declared member fails it (an attribute named by a variable, e.g. a config's list of module
names, is not a hook)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "index", "service")
# classes whose class-level declarations are hooks with defaults (what a protocol's implementations subclass)
HOOK_BASES = {"TextEncoderBase", "Loss", "CommonSpace"}


def _sources(root: Path) -> list[Path]:
    return sorted(p for package in PACKAGES if (root / package).is_dir() for p in (root / package).rglob("*.py"))


def _is_typing_protocol(base: ast.expr) -> bool:
    """``Protocol`` or ``typing.Protocol`` (not ``asyncio.Protocol``, a transport's callbacks)."""
    if isinstance(base, ast.Name):
        return base.id == "Protocol"
    return isinstance(base, ast.Attribute) and base.attr == "Protocol" and isinstance(base.value, ast.Name) \
        and base.value.id in ("typing", "typing_extensions")


def declared_hooks(root: Path) -> dict[str, list[str]]:
    """Member name → the protocols (or hook base classes) that declare it: their annotated attributes, properties
    and methods (dunder methods left out)."""
    out: dict[str, list[str]] = {}
    for path in _sources(root):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            if not (any(_is_typing_protocol(b) for b in node.bases) or node.name in HOOK_BASES):
                continue
            for item in node.body:
                names: list[str] = []
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names = [item.target.id]
                elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [item.name]
                elif isinstance(item, ast.Assign):
                    names = [t.id for t in item.targets if isinstance(t, ast.Name)]
                for name in names:
                    if not name.startswith("__") and node.name not in out.setdefault(name, []):
                        out[name].append(node.name)
    return {name: sorted(owners) for name, owners in out.items()}


def hook_lookups(root: Path, hooks: dict[str, list[str]]) -> list[str]:
    """``module:line getattr(…, "name")`` for every lookup by name of a declared hook."""
    found = []
    for path in _sources(root):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in hooks):
                name = node.args[1].value
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.func.id}(…, {name!r}): "
                             f"declared by {', '.join(hooks[name])}")
    return found


def test_the_declared_hooks_are_found():
    hooks = declared_hooks(ROOT)
    assert hooks["fingerprint"] == hooks["extra"] == ["CommonSpace", "EmbeddingModel"]
    assert hooks["backbone_pretrained"] == hooks["image_split"] == ["EmbeddingModel", "Member"]
    assert hooks["concepts"] == ["EmbeddingModel"]
    assert hooks["tokenizes"] == ["TextEncoder", "TextEncoderBase"] and "regularizer" in hooks
    assert hooks["on_pairs"] == hooks["takes_memory"] == ["Loss"]
    assert "header_timeout_s" not in hooks          # service/connection.py's asyncio.Protocol: no typing protocol


def test_no_hook_is_looked_up_by_name():
    assert hook_lookups(ROOT, declared_hooks(ROOT)) == []


def test_the_check_catches_a_lookup_by_name(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "protocol.py").write_text(
        "from typing import Protocol\n"
        "class Model(Protocol):\n    fingerprint: str\n    def concepts(self): ...\n"
        "class Loss:\n    on_pairs = False\n")
    (tmp_path / "training" / "use.py").write_text(
        "def f(model, loss, args, name):\n"
        "    a = getattr(model, 'fingerprint', None)\n"
        "    b = hasattr(model, 'concepts')\n"
        "    c = getattr(loss, 'on_pairs', False)\n"
        "    d = getattr(args, 'batch_size', 0), getattr(model, name)\n"     # not hooks: left alone
        "    return model.fingerprint, a, b, c, d\n")
    hooks = declared_hooks(tmp_path)
    assert hooks == {"fingerprint": ["Model"], "concepts": ["Model"], "on_pairs": ["Loss"]}
    assert hook_lookups(tmp_path, hooks) == [
        "training/use.py:2 getattr(…, 'fingerprint'): declared by Model",
        "training/use.py:3 hasattr(…, 'concepts'): declared by Model",
        "training/use.py:4 getattr(…, 'on_pairs'): declared by Loss"]
