"""benchmarks/gpu_host.py's pieces that run anywhere: the index build's timing line read back, the multi-process
load client against a small HTTP server, the host's utilisation, and the docs table of every new field."""
import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import tables  # noqa: E402
from benchmarks.gpu_host import PHASES, STEPS, TIMING, Utilisation, _seconds  # noqa: E402
from benchmarks.load_client import ClientPool  # noqa: E402
from index.cli_build import timing_line  # noqa: E402
from training.inference.overlap import Timeline  # noqa: E402


def test_the_benchmark_reads_the_build_timing_line():
    steady = TIMING.search(timing_line(Timeline([(11.0, 64), (13.0, 192)]), 10.0, 14.0))
    assert steady is not None and steady.groups() == ("1.0", "64", "64.0")
    once = TIMING.search(timing_line(Timeline([(12.5, 9)]), 10.0, 13.0))
    assert once is not None and once.group(1) == "2.5" and once.group(3) is None
    timed = Timeline([(11.0, 64), (13.0, 192)], {"waiting for decoded photos": 0.5, "the model": 1.25},
                     {"model loaded": 10.75, "photos found": 10.25})
    line = timing_line(timed, 10.0, 14.0)
    assert "(start-up: photos found 0.2 s, model loaded 0.8 s)" in line          # in the order they happened
    assert _seconds(STEPS.search(line)) == {"photos found": 0.2, "model loaded": 0.8}
    assert _seconds(PHASES.search(line)) == {"waiting for decoded photos": 0.5, "the model": 1.2}
    assert _seconds(STEPS.search("timing: 1.0 s in all")) is None


@pytest.fixture
def server():
    """An HTTP/1.1 keep-alive server answering every request 200 (even ones), 503 (odd ones)."""
    loop = asyncio.new_event_loop()
    count = [0]

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                count[0] += 1
                status = b"200 OK" if count[0] % 2 else b"503 Busy"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
    srv = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = srv.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield port, count
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_the_load_client_spreads_connections_over_processes(server):
    port, count = server
    request = b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi"
    with ClientPool(2) as pool, Utilisation() as use:
        row = pool.run(port, [request], concurrency=3, seconds=0.4, warmup=0.1)
    assert row["client_processes"] == 2 and row["concurrency"] == 3
    assert row["answers"] > 10 and row["rps"] == pytest.approx(row["answers"] / 0.4)
    assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert 0 < row["not_200"]["503"] < row["answers"] and count[0] >= row["answers"]
    assert row["client_cpu_cores"] > 0
    assert 0 <= use.result()["cpu_util_pct"] <= 100 and use.result()["gpu_util_pct"] is None


def test_the_table_shows_every_new_field(tmp_path, monkeypatch):
    data = {"hardware": "NVIDIA H200 + 16 cores", "date": "2026-11-28", "commit": "abc1234", "model": "m",
            "index_build": [{"photo": "1 MP (1280×800)", "images": 10000, "seconds": 6.0, "img_per_s": 1666.7,
                             "workers": 14, "tta": "default", "startup_s": 3.5, "steady_img_per_s": 4000.0,
                             "cpu_util_pct": 80.0, "gpu_util_pct": 60.0,
                             "startup_steps": {"photos found": 2.0, "model loaded": 3.0},
                             "phases": {"waiting for decoded photos": 0.4, "decoding on the device": 1.5,
                                        "the model": 2.0},
                             "backend_warnings": ["inference backend auto failed (cuda: boom)"] * 2}],
            "notes": "measured on a tree like abc1234",
            "ceilings": [{"tower": "image", "mode": "backend eager", "error": "inference backend auto failed (x)"},
                         {"tower": "image", "mode": "compiled (inductor)", "batch": 256, "per_s": 9000.0,
                          "first_call_s": 40.0}, {"tower": "text", "mode": "eager", "batch": 64, "per_s": 20000.0}],
            "first_answer": {"start_to_ready_s": 12.0, "warmup_s": 4.0, "batch_sizes": [1, 64],
                             "search_backend": "torch-cuda-fp16", "image_backend": "cuda",
                             "image": {"1": {"seconds": 0.05, "from_start_s": 12.1, "not_200": {}}},
                             "text": {"1": {"seconds": 0.02, "from_start_s": 12.2, "not_200": {"503": 1}}}},
            "search": [{"backend": "torch-cuda-fp16", "vectors": 1000000, "dim": 1024, "batch": 1, "qps": 2000.0,
                        "recall_at_10": 1.0, "gb_per_s": 4096.0, "card_gb_per_s": 4800.0, "p50_ms": 0.45,
                        "p99_ms": 0.6}],
            "service_mp": {"serve_workers": None, "client_processes": 8, "rows": [
                {"route": "text", "concurrency": 128, "client_processes": 8, "rps": 6000.0, "p50_ms": 20.0,
                 "p99_ms": 40.0, "not_200": {}, "client_cpu_cores": 2.5, "cpu_util_pct": 70.0,
                 "gpu_util_pct": 50.0, "raw_limit": 11000.0}]}}
    (tmp_path / "gpu_host_cuda_h200.json").write_text(json.dumps(data))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    table = tables.gpu_host_table("gpu_host_cuda_h200.json")
    for shown in ("--tta default", "start-up 3.5 s, then 4000.0 img/s steady; CPU 80%, GPU 60%",
                  "image tower alone, compiled (inductor), batch 256", "9,000 views/s (first call 40.0 s)",
                  "20,000 sentences/s", "12.1 s from start", "4,096 GB/s read of the card's 4,800",
                  "p50 0.45 ms, p99 0.60 ms", "text route, c = 128 (8 client processes, serve --workers default)",
                  "6,000 req/s, p50 20.0 ms, p99 40.0 ms; raw limit 11000/s (55%); client CPU 2.50 cores, host CPU "
                  "70%, GPU 50%", "GPU 60%; start-up steps done at photos found 2.0 s, model loaded 3.0 s; after the first batch: waiting for decoded photos 0.4 s, decoding on the device 1.5 s, the "
                  "model 2.0 s; inference backend auto failed (cuda: boom) |",
                  "search backend torch-cuda-fp16; image backend cuda)",
                  "| image tower alone, backend eager | not loaded: inference backend auto failed (x) |", "| notes | measured on a tree like abc1234 |"):
        assert shown in table, shown


def test_the_tower_rows_say_why_a_backend_did_not_load(tiny_model_path, monkeypatch):
    """gpu_host's backend row: the backend auto attaches, or, when the one asked for fails, eager and the log's
    reason (what the H200 run could not tell from its table: the CUDA tower had fallen back to eager)."""
    from benchmarks.gpu_host import _attach_backend
    from training.inference import backend as backend_mod
    from training.models.checkpoint import load_model

    model = load_model(tiny_model_path, "cpu").eval()

    def broken(*args, **kwargs):
        raise RuntimeError("folding the BatchNorms changed the features")
    monkeypatch.setattr(backend_mod, "eager_reason", lambda m: None)          # as if the model were one it runs
    monkeypatch.setattr(backend_mod, "_load", broken)
    name, failed = _attach_backend(model)
    assert name == "eager" and "folding the BatchNorms changed the features" in failed
    assert "inference backend auto failed" in failed


def test_a_profiled_build_says_where_its_own_time_went_and_the_table_shows_it(tmp_path, monkeypatch):
    import cProfile
    import time

    from benchmarks.gpu_host import profile_rows

    def slow_wait():                       # not the project's code: stands in for a blocking call
        time.sleep(0.05)

    def work():
        for _ in range(3):
            slow_wait()
        return timing_line(Timeline([(11.0, 64)]), 10.0, 12.0)     # the project's code

    profiler = cProfile.Profile()
    profiler.runcall(work)
    profiler.dump_stats(tmp_path / "build.prof")
    rows = profile_rows(tmp_path / "build.prof", top=5)
    assert rows["self"][0]["function"] == "<built-in method time.sleep>" and rows["self"][0]["calls"] == 3
    assert rows["self"][0]["self_s"] >= 0.15 and len(rows["self"]) <= 5
    assert [r["self_s"] for r in rows["self"]] == sorted((r["self_s"] for r in rows["self"]), reverse=True)
    assert rows["project"] and not any(r["function"].startswith("/") for r in rows["project"])   # the checkout's
    assert any(r["function"].startswith("index/cli_build.py:") and "timing_line" in r["function"]
               for r in rows["project"])
    data = {"hardware": "h", "date": "d", "commit": "c", "model": "m",
            "profile": {"photo": "1 MP (1280×800)", "images": 1000, "seconds": 9.5, **rows}}
    (tmp_path / "gpu_host_cuda_h200.json").write_text(json.dumps(data))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    table = tables.gpu_host_table("gpu_host_cuda_h200.json")
    assert "| index build under cProfile, 1000 1 MP (1280×800) JPEGs | 9.5 s end to end; most own time: " \
           "<built-in method time.sleep> 0.2 s (3 calls)" in table
