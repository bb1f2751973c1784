"""Waiting for the service to be ready, the one place the tests and the benchmarks do it: the app in process
(a TestClient or an httpx AsyncClient on it: ``poll_readyz``, ``wait_ready`` and their async twins) and
``jointspace serve`` in a subprocess on a free localhost port (``spawn``, ``wait_serving``).
``tests/test_readiness.py`` fails when a loop polling ``/readyz`` appears anywhere else."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]


def is_ready(answer) -> bool:
    """``/readyz``'s answer says ready (200)."""
    return answer.status_code == 200


def poll_readyz(client, until: Callable[[Any], bool] = is_ready, timeout: float = 60.0, poll: float = 0.05):
    """GETs ``/readyz`` through ``client`` (a TestClient, or any client with ``get``) every ``poll`` seconds until
    ``until(answer)`` holds or ``timeout`` seconds pass: the last answer, for the caller to assert on (a new index
    generation, an error status, ready)."""
    deadline = time.monotonic() + timeout
    while not until(answer := client.get("/readyz")) and time.monotonic() < deadline:
        time.sleep(poll)
    return answer


def wait_ready(client, timeout: float = 60.0, poll: float = 0.05):
    """``client`` once ``/readyz`` answers 200. AssertionError with ``/readyz``'s answer when ``timeout`` seconds
    pass first."""
    answer = poll_readyz(client, timeout=timeout, poll=poll)
    assert is_ready(answer), f"not ready after {timeout:g} s: {answer.status_code} {answer.text}"
    return client


async def poll_readyz_async(client, until: Callable[[Any], bool] = is_ready, timeout: float = 60.0,
                            poll: float = 0.05):
    """``poll_readyz`` through an ``httpx.AsyncClient``."""
    deadline = time.monotonic() + timeout
    while not until(answer := await client.get("/readyz")) and time.monotonic() < deadline:
        await asyncio.sleep(poll)
    return answer


async def wait_ready_async(client, timeout: float = 60.0, poll: float = 0.05):
    """``wait_ready`` through an ``httpx.AsyncClient``."""
    answer = await poll_readyz_async(client, timeout=timeout, poll=poll)
    assert is_ready(answer), f"not ready after {timeout:g} s: {answer.status_code} {answer.text}"
    return client


def alive(pid: int) -> bool:
    """Whether the process ``pid`` still runs (a signal 0 reaches it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(proc: subprocess.Popen, port: int, timeout: float = 120.0, poll: float = 0.2) -> float:
    """Polls ``/readyz`` of the server process ``proc`` on ``port`` of 127.0.0.1 until it answers 200: the
    ``time.monotonic()`` it did. RuntimeError when ``proc`` exits first (with its output when it goes to a pipe) or
    when ``timeout`` seconds pass (``proc`` is killed)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return time.monotonic()
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout is not None else ""
            raise RuntimeError(f"the server exited with {proc.returncode} during start-up"
                               f"{': ' + output if output else ''}")
        time.sleep(poll)
    proc.kill()
    raise RuntimeError(f"the server did not become ready within {timeout:g} s")


def spawn(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120.0,
          capture: bool = False, repo: Path = REPO) -> tuple[subprocess.Popen, int]:
    """Runs ``jointspace serve ARGS`` on a free port of 127.0.0.1 in a subprocess (the code of the checkout
    ``repo``, by default this one, first on its PYTHONPATH, ``env`` on top of this process's environment) and waits
    until ``/readyz`` answers 200 (``wait_serving``): ``(the process, its port)``. ``capture``: the server's output
    goes to a pipe, read into the error when it exits during start-up."""
    port = free_port()
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)   # keep the caller's
    out = subprocess.PIPE if capture else None
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", *args, "--port", str(port)], cwd=repo,
                            env={**os.environ, **(env or {}), "PYTHONPATH": path}, stdout=out,
                            stderr=subprocess.STDOUT if capture else None, text=True)
    wait_serving(proc, port, timeout)
    return proc, port
