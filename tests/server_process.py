"""``jointspace serve`` in a subprocess on a free localhost port, for the tests (and the benchmarks) that talk to
a real server process."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


def wait_ready(client, timeout: float = 60.0, poll: float = 0.05):
    """Polls ``/readyz`` through ``client`` (an in-process TestClient, or any client with ``get``) until it
    answers 200, and returns the client: the one wait for readiness of the tests that run the app in process.
    AssertionError with ``/readyz``'s answer when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while (r := client.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, f"not ready after {timeout:g} s: {r.status_code} {r.text}"
        time.sleep(poll)
    return client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120.0,
          capture: bool = False, repo: Path = REPO) -> tuple[subprocess.Popen, int]:
    """Runs ``jointspace serve ARGS`` on a free port of 127.0.0.1 in a subprocess (the code of the checkout
    ``repo``, by default this one, first on its PYTHONPATH, ``env`` on top of this process's environment) and waits
    until ``/readyz`` answers 200: ``(the process, its port)``. ``capture``: the server's output goes to a pipe, read
    into the error when it exits during start-up. RuntimeError when it exits or is not ready within ``timeout``
    seconds (it is killed)."""
    import httpx

    port = free_port()
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)   # keep the caller's
    out = subprocess.PIPE if capture else None
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", *args, "--port", str(port)], cwd=repo,
                            env={**os.environ, **(env or {}), "PYTHONPATH": path}, stdout=out,
                            stderr=subprocess.STDOUT if capture else None, text=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc, port
        except httpx.TransportError:
            if proc.poll() is not None:
                output = proc.stdout.read() if proc.stdout is not None else ""
                raise RuntimeError(f"the server exited during start-up{': ' + output if output else ''}")
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready")
