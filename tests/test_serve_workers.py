"""``jointspace serve --workers N`` (service/workers.py) as a real process: several workers on one port answering as
one service — search by text and by upload, ``/metrics`` of the whole service, a new index generation taken by
every worker, a killed worker restarted, one admission limit, a busy port refused at once, a worker that cannot
load stopping the service, and SIGTERM leaving no process behind."""
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from index.gallery import EmbedOptions, add
from service.cli import main as cli_main
from service.workers import SharedAdmission, Worker, auto_workers, worker_settings
from service.settings import Settings
from server_process import REPO, alive, free_port, spawn
from training.data.datasets import load_dataset
from training.models.checkpoint import load_model


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}`` in a /metrics text (0 when absent)."""
    total = 0.0
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _index_vectors(text: str) -> dict[str, float]:
    """``jointspace_index_vectors{side="images"}`` per worker pid."""
    return {pid: float(v) for pid, v in
            re.findall(r'^jointspace_index_vectors\{pid="(\d+)",side="images"\} (\S+)$', text, re.M)}


def _readyz_fresh(base: str) -> dict:
    """/readyz on a connection of its own (so that either worker may accept it)."""
    with httpx.Client(base_url=base, timeout=10) as c:
        r = c.get("/readyz")
        assert r.status_code == 200, r.text
        return r.json()


def _until(condition, timeout: float = 60.0, poll: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    return condition()


def test_two_workers_serve_as_one_service(tiny_model_path, index_copy, synth_small):
    proc, port = spawn(["--model", str(tiny_model_path), "--index", str(index_copy), "--workers", "2",
                        "--log-level", "warning"], env={"JOINTSPACE_RELOAD_INTERVAL_S": "0.1"})
    base = f"http://127.0.0.1:{port}"
    pids: set[str] = set()
    try:
        pids = set(_until(lambda: len(_index_vectors(httpx.get(f"{base}/metrics").text)) == 2
                          and _index_vectors(httpx.get(f"{base}/metrics").text)))
        assert len(pids) == 2 and str(proc.pid) not in pids         # two workers, not the parent

        # text search and an uploaded image
        r = httpx.post(f"{base}/v1/search/images", json={"text": "a blue circle", "k": 3}, timeout=30)
        assert r.status_code == 200 and len(r.json()["results"]) == 3
        photo = Path(load_dataset(synth_small).split("test").images[0].path)
        r = httpx.post(f"{base}/v1/search/captions", files={"image": (photo.name, photo.read_bytes())},
                       data={"k": "2"}, timeout=30)
        assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text

        # requests answered by both workers are counted once each in every worker's /metrics
        before = _metric(httpx.get(f"{base}/metrics").text, "jointspace_requests_total", route="/readyz",
                         status="200")
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: _readyz_fresh(base), range(60)))
        workers = {a["worker"] for a in answers}
        assert workers == {0, 1}, workers                            # both took connections
        assert {a["workers"] for a in answers} == {2}
        for _ in range(4):                                           # whichever worker answers /metrics
            after = _metric(httpx.get(f"{base}/metrics").text, "jointspace_requests_total", route="/readyz",
                            status="200")
            assert after - before == len(answers)
        assert _metric(httpx.get(f"{base}/metrics").text, "jointspace_in_flight") == 0

        # a new generation is taken by every worker
        old = _readyz_fresh(base)
        model = load_model(tiny_model_path)
        report = add(index_copy, model, [load_dataset(synth_small).split("train").images[0].path],
                     embedding=EmbedOptions(progress=False, workers=0))
        assert _until(lambda: set(_index_vectors(httpx.get(f"{base}/metrics").text).values())
                      == {old["images"] + 1}), httpx.get(f"{base}/metrics").text
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: _readyz_fresh(base), range(40)))
        assert {a["index_generation"] for a in answers} == {report.generation}
        assert httpx.post(f"{base}/v1/search/captions", json={"image_id": report.image_ids[0], "k": 2},
                          timeout=30).status_code == 200

        # a worker that dies is replaced; the other keeps answering meanwhile
        victim = int(sorted(pids)[0])
        os.kill(victim, signal.SIGKILL)
        assert httpx.post(f"{base}/v1/search/images", json={"text": "a red square"}, timeout=30).status_code == 200
        now = _until(lambda: (lambda v: len(v) == 2 and str(victim) not in v and v)(
            _index_vectors(httpx.get(f"{base}/metrics").text)), timeout=90)
        assert now and set(now.values()) == {old["images"] + 1}, now          # the new worker serves the new one
        pids = set(now) | pids
        assert proc.poll() is None
    finally:
        proc.terminate()
        code = proc.wait(timeout=60)
    assert code == 0
    assert not [p for p in pids if alive(int(p))]                   # no worker left behind
    with socket.socket() as s:                                       # and the port is free again
        s.bind(("127.0.0.1", port))


def test_sigint_stops_every_worker(tiny_model_path, tiny_index_dir):
    proc, port = spawn(["--model", str(tiny_model_path), "--index", str(tiny_index_dir), "--workers", "2",
                        "--log-level", "warning"])
    try:
        pids = _until(lambda: (lambda v: len(v) == 2 and v)(
            _index_vectors(httpx.get(f"http://127.0.0.1:{port}/metrics").text)))
        assert pids
        proc.send_signal(signal.SIGINT)                              # Ctrl-C to the parent alone
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not [p for p in pids if alive(int(p))]


def test_a_busy_port_is_refused_at_once_with_workers(tiny_model_path, tiny_index_dir, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        assert cli_main(["serve", "--model", str(tiny_model_path), "--index", str(tiny_index_dir), "--workers", "2",
                         "--port", str(port)]) == 2
        assert time.monotonic() - start < 10                     # refused before any worker starts
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_worker_that_cannot_load_stops_the_service(tiny_index_dir, tmp_path):
    from training.data.vocab import Vocabulary
    from training.models.checkpoint import save_model
    from training.models.model import build_model

    from conftest import tiny_config

    save_model(build_model(tiny_config(), Vocabulary.build(["a b c"])), tmp_path / "other.pt")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--model", str(tmp_path / "other.pt"),
                           "--index", str(tiny_index_dir), "--workers", "2", "--port", str(free_port())],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "was built with model" in done.stderr and "worker" in done.stderr


def test_admission_is_counted_for_the_whole_service():
    slots = multiprocessing.get_context("spawn").RawArray("q", 2)
    a, b = SharedAdmission(slots, 0), SharedAdmission(slots, 1)
    assert a.enter(3) and a.enter(3) and b.enter(3)
    assert not b.enter(3) and not a.enter(3)                  # the limit holds for both workers together
    a.leave()
    assert b.enter(3) and b.total == 3 and list(slots) == [1, 2]


def test_worker_defaults():
    assert auto_workers("cpu", 2) == 1 and auto_workers("cpu", 64) == 1      # a CPU host: today's one process
    assert auto_workers("cuda", 16) == 8 and auto_workers("cuda", 4) == 4
    s = worker_settings(Settings(upload_buffer_bytes=1000, media_memory_bytes=600, upload_peer_bytes=70), 3)
    assert (s.workers, s.upload_buffer_bytes, s.media_memory_bytes, s.upload_peer_bytes) == (3, 333, 200, 70)


@pytest.mark.parametrize("workers", ["-1", "65"])
def test_a_worker_count_out_of_range_is_refused(workers, capsys, tiny_index_dir):
    assert cli_main(["serve", "--index", str(tiny_index_dir), "--workers", workers]) == 2
    assert "workers" in capsys.readouterr().err


def test_a_request_held_by_one_worker_counts_against_the_limit_in_another():
    """Two workers' admission middlewares over one shared count: with max_queue 1, a request in the first makes
    the second refuse 503 at once; once it is answered, the second admits."""
    import asyncio

    from service.middleware import InFlightMiddleware

    slots = multiprocessing.get_context("spawn").RawArray("q", 2)

    async def scenario():
        gate = asyncio.Event()

        async def model(scope, receive, send):
            await gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        workers = [InFlightMiddleware(model, {"text": 0}, lambda method, path: lambda multipart: "text", limit=1,
                                      shared=SharedAdmission(slots, i)) for i in range(2)]
        sent: list[list[dict]] = [[], []]

        async def call(i: int):
            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message):
                sent[i].append(message)
            scope = {"type": "http", "method": "POST", "path": "/v1/search/images", "headers": []}
            await workers[i](scope, receive, send)

        first = asyncio.create_task(call(0))
        await asyncio.sleep(0.01)
        assert list(slots) == [1, 0]
        await call(1)                                            # refused at once: the service holds 1
        assert sent[1][0]["status"] == 503 and list(slots) == [1, 0]
        gate.set()
        await first
        assert sent[0][0]["status"] == 200 and list(slots) == [0, 0]
        sent[1].clear()
        await call(1)                                            # room again
        assert sent[1][0]["status"] == 200 and list(slots) == [0, 0]

    asyncio.run(scenario())


def test_a_worker_starts_taking_connections_only_once_loaded(tiny_model_path, tiny_index_dir, tmp_path):
    """A worker's start-up (the lifespan, after which uvicorn accepts) ends once the model and index are loaded
    and warmed up, so that its siblings answer meanwhile; when loading fails it fails, saying why."""
    import asyncio

    from service.app import create_app

    slots = multiprocessing.get_context("spawn").RawArray("q", 2)

    async def start(index: Path):
        app = create_app(Settings(model=str(tiny_model_path), index=str(index)),
                         worker=Worker(1, 2, SharedAdmission(slots, 1)))
        async with app.router.lifespan_context(app):
            return app.state.service.ready, app.state.service.phase

    assert asyncio.run(start(tiny_index_dir)) == (True, "ready")
    with pytest.raises(RuntimeError, match="loading failed: .*no jointspace index"):
        asyncio.run(start(tmp_path / "missing"))


def test_a_worker_that_keeps_dying_stops_the_service(tiny_model_path, tiny_index_dir):
    """The same worker killed three times within a minute (each time its replacement): the service stops every
    worker and exits 1 saying why, instead of restarting it forever."""
    proc, port = spawn(["--model", str(tiny_model_path), "--index", str(tiny_index_dir), "--workers", "2",
                        "--log-level", "warning"], capture=True)
    base = f"http://127.0.0.1:{port}"
    try:
        pids = _until(lambda: (lambda v: len(v) == 2 and set(v))(_index_vectors(httpx.get(f"{base}/metrics").text)))
        assert pids
        seen = set(pids)
        victim = min(int(p) for p in pids)
        for kill in range(3):
            os.kill(victim, signal.SIGKILL)
            if kill == 2:
                break
            # its replacement: the new pid in /metrics (answered by the other worker meanwhile)
            new = _until(lambda known=frozenset(seen): set(_index_vectors(httpx.get(f"{base}/metrics").text))
                         - known, timeout=90)
            assert len(new) == 1, new
            seen |= new
            victim = int(next(iter(new)))
        assert proc.wait(timeout=90) == 1
        output = proc.stdout.read()
        assert "exited (code -9) 3 times within 60 s" in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not [p for p in seen if alive(int(p))]
