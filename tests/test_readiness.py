"""The wait for the service's readiness is written once, in tests/server_process.py: its helpers answer as they
say, and no other file of tests/ or benchmarks/ polls ``/readyz`` in a loop of its own (nor in the code it runs
in a subprocess)."""
import ast
import asyncio
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from server_process import free_port, poll_readyz, poll_readyz_async, wait_ready, wait_ready_async, wait_serving

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "server_process.py"
LOOPS = (ast.While, ast.For, ast.AsyncFor, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
WHILE_READYZ = re.compile(r"\bwhile\b[^\n]*/readyz")        # a loop in code built line by line in a string


def _names_readyz(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "/readyz" in n.value
               for n in ast.walk(node))


def _polled(loop: ast.AST) -> list[ast.AST]:
    """What a loop runs each time round: its condition and body (not the iterable of a ``for``: looping over a
    list of routes that holds /readyz polls nothing)."""
    if isinstance(loop, ast.While):
        return [loop.test, *loop.body]
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        return list(loop.body)
    return [loop.elt if not isinstance(loop, ast.DictComp) else loop.value]


def _sleeps(call: ast.Call) -> bool:
    return (isinstance(call.func, ast.Attribute) and call.func.attr == "sleep"
            or isinstance(call.func, ast.Name) and call.func.id == "sleep")


def readiness_loops(source: str) -> list[int]:
    """The lines of ``source`` where a loop polls ``/readyz``: a ``while`` loop, or a loop that sleeps, requesting
    it (a call whose positional argument names it) each time round; the code in its string constants included, and
    a line matching ``while … /readyz`` (code built line by line in a string)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, LOOPS):
            calls = [n for part in _polled(node) for n in ast.walk(part) if isinstance(n, ast.Call)]
            if (any(_names_readyz(arg) for call in calls for arg in call.args)
                    and (isinstance(node, ast.While) or any(map(_sleeps, calls)))):
                found.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "/readyz" in node.value:
            try:
                inner = readiness_loops(textwrap.dedent(node.value))
            except SyntaxError:
                continue                                   # not code
            found += [node.lineno] * bool(inner)
    found += [i for i, line in enumerate(source.splitlines(), 1) if WHILE_READYZ.search(line)]
    return sorted(set(found))


def test_no_file_but_server_process_polls_readyz():
    files = sorted({*REPO.glob("tests/**/*.py"), *REPO.glob("benchmarks/**/*.py")} - {HELPERS, Path(__file__)})
    assert len(files) > 50
    copies = {str(f.relative_to(REPO)): lines for f in files if (lines := readiness_loops(f.read_text()))}
    assert copies == {}, "wait with tests/server_process.py's poll_readyz / wait_ready / wait_serving instead"
    assert readiness_loops(HELPERS.read_text())                  # the check sees the helpers' own loops


@pytest.mark.parametrize("source", [
    'while c.get("/readyz").status_code != 200:\n    time.sleep(0.05)\n',
    'for _ in range(1200):\n    if c.get("/readyz").status_code == 200:\n        break\n    time.sleep(0.05)\n',
    'async def f(c):\n    for _ in range(9):\n        r = await c.get("/readyz")\n        await asyncio.sleep(0.05)\n',
    'while True:\n    try:\n        if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:\n'
    '            break\n    except httpx.TransportError:\n        pass\n',
    'ok = any(c.get("/readyz").status_code == 200 or time.sleep(0.1) for _ in range(9))\n',
    'CODE = """\nfor _ in range(9):\n    r = c.get("/readyz")\n    time.sleep(1)\n"""\n',
    'code = (f"with TestClient(app) as c:\\n"\n        f"    while c.get(\'/readyz\').status_code != 200:\\n")\n',
])
def test_the_check_catches_a_readiness_loop(source):
    assert readiness_loops(source)


@pytest.mark.parametrize("source", [
    'for route in ("/healthz", "/readyz", "/metrics"):\n    assert c.get(route).status_code == 200\n',
    'for _ in range(4):\n    n = metric(httpx.get(f"{base}/metrics").text, route="/readyz")\n',
    'ready = wait_ready(c).get("/readyz").json()\n',
    'for root in roots:\n    with TestClient(app(root)) as c:\n        hub = wait_ready(c).get("/readyz").json()\n',
])
def test_the_check_leaves_single_requests_alone(source):
    assert readiness_loops(source) == []


def _app(ready_after: int) -> FastAPI:
    """An app whose /readyz answers 503 ``ready_after`` times, then 200 (each answer counts the requests)."""
    app, calls = FastAPI(), []

    @app.get("/readyz")
    def readyz():
        calls.append(1)
        return JSONResponse({"n": len(calls)}, status_code=200 if len(calls) > ready_after else 503)

    return app


def test_the_waits_in_process_return_once_ready_and_fail_with_the_answer():
    with TestClient(_app(ready_after=3)) as c:
        assert wait_ready(c, poll=0.001) is c
        assert c.get("/readyz").json() == {"n": 5}
    with TestClient(_app(ready_after=3)) as c:
        assert poll_readyz(c, until=lambda r: r.json()["n"] == 2, poll=0.001).json() == {"n": 2}
    with TestClient(_app(ready_after=10 ** 9)) as c:
        last = poll_readyz(c, timeout=0.05, poll=0.01)               # the last answer, for the caller to judge
        assert last.status_code == 503 and last.json()["n"] >= 2
        with pytest.raises(AssertionError, match=r"not ready after 0.05 s: 503 \{\"n\":"):
            wait_ready(c, timeout=0.05, poll=0.01)


def test_the_async_waits_answer_as_the_sync_ones():
    async def run(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as c:
            assert await wait_ready_async(c, poll=0.001) is c
            n = (await c.get("/readyz")).json()["n"]
            late = await poll_readyz_async(c, until=lambda r: r.json()["n"] == n + 2, poll=0.001)
            return n, late.json()["n"]

    assert asyncio.run(run(_app(ready_after=3))) == (5, 7)

    async def never():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(10 ** 9)), base_url="http://t") as c:
            await wait_ready_async(c, timeout=0.05, poll=0.01)

    with pytest.raises(AssertionError, match="not ready after 0.05 s: 503"):
        asyncio.run(never())


def test_the_wait_for_a_server_process_reports_an_exit_with_its_output_and_kills_one_never_ready():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"],
                            stdout=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="exited with 3 during start-up: no model here"):
        wait_serving(proc, port, timeout=30, poll=0.01)
    # a server that answers, but never 200 on /readyz (http.server: 404)
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(RuntimeError, match="did not become ready within 1 s"):
            wait_serving(proc, port, timeout=1, poll=0.05)
        assert proc.wait(timeout=10) != 0                              # killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
