"""argparse's Namespace stops at the command line's edge: in index/, a ``cmd_*`` function reads the flags it needs
(``args.x``) and hands its helpers plain values and the typed options (``BuildOptions``, ``EmbedOptions``,
``RayOptions``, ``Sampling``, the CLI's ``ModelChoice``/``Sources``/``BankChoice``); no function below it takes
the Namespace, and no command changes it."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def namespace_uses(source: str, name: str = "<source>") -> list[str]:
    """Where ``source`` lets the Namespace travel: a function other than a ``cmd_*`` one with a parameter named
    ``args`` or annotated ``Namespace``, or a ``cmd_*`` function that uses ``args`` other than by reading one of its
    attributes (passing it on, ``getattr(args, ...)``, ``vars(args)``, an assignment to ``args.x``)."""
    found = []
    for func in ast.walk(ast.parse(source, name)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        label = f"{name}:{func.lineno} {getattr(func, 'name', 'lambda')}"
        params = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs,
                  *filter(None, (func.args.vararg, func.args.kwarg))]
        if not getattr(func, "name", "").startswith("cmd_"):
            found += [f"{label} takes {p.arg}" for p in params
                      if p.arg == "args" or (p.annotation is not None and "Namespace" in ast.unparse(p.annotation))]
            continue
        attributes = {id(node.value) for node in ast.walk(func) if isinstance(node, ast.Attribute)}
        for node in ast.walk(func):
            if isinstance(node, ast.Name) and node.id == "args" and id(node) not in attributes:
                found.append(f"{label} hands on args (line {node.lineno})")
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args"
                  and not isinstance(node.ctx, ast.Load)):
                found.append(f"{label} changes args.{node.attr} (line {node.lineno})")
    return sorted(found)


def test_no_helper_of_the_index_commands_takes_the_namespace():
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "index").rglob("*.py"))}
    commands = [f.name for text in sources.values() for f in ast.walk(ast.parse(text))
                if isinstance(f, ast.FunctionDef) and f.name.startswith("cmd_")]
    assert len(commands) >= 9, commands             # build, add, sync, remove, compact, search, duplicates, ...
    assert [use for name, text in sources.items() for use in namespace_uses(text, name)] == []


def test_the_check_finds_a_travelling_namespace():
    assert namespace_uses("def cmd_a(args):\n    return args.k + 1\n") == []
    found = namespace_uses("import argparse\n"
                           "def cmd_a(args):\n    helper(args)\n    args.k = 2\n    return getattr(args, 'x')\n"
                           "def helper(args):\n    pass\n"
                           "def typed(ns: argparse.Namespace):\n    pass\n")
    assert found == ["<source>:2 cmd_a changes args.k (line 4)", "<source>:2 cmd_a hands on args (line 3)",
                     "<source>:2 cmd_a hands on args (line 5)", "<source>:6 helper takes args",
                     "<source>:8 typed takes ns"], found
