"""What decoding media and receiving uploads may hold, checked on the two mechanisms themselves (no server, no
sleeps for timing: jobs are held on events, bodies on queues):

* the media admission (service/decoding.py): heavy jobs take at most half the admission and all threads but one,
  waiting light jobs go first, running jobs stay within the memory budget (one larger runs alone), a job whose
  request went away never starts;
* the upload reservation (service/middleware.py ``BodyMiddleware``): bytes are counted as they arrive, so 128
  stalled uploads that declared 2 MB and sent 1 KB hold 128 KB and deny nobody; one client address holds at most
  its share; the whole buffer is bounded; small bodies take nothing; everything is given back when answered."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from service.decoding import LIGHT_BYTES, MediaBusy, MediaDecoder
from service.middleware import SMALL_BODY, BodyMiddleware

HEAVY = LIGHT_BYTES + 1


async def _until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never met"
        await asyncio.sleep(0.005)


class _Jobs:
    """Jobs that record their start and wait for their own release."""

    def __init__(self):
        self.started: list[str] = []
        self.gates: dict[str, threading.Event] = {}

    def __call__(self, name: str) -> str:
        self.started.append(name)
        self.gates.setdefault(name, threading.Event()).wait(10)
        return name

    def release(self, name: str) -> None:
        self.gates.setdefault(name, threading.Event()).set()


def test_heavy_jobs_leave_a_thread_and_half_the_admission_to_light_ones():
    async def run():
        media, jobs = MediaDecoder(workers=2, limit=4, memory_bytes=10 ** 12), _Jobs()
        heavy = [asyncio.create_task(media.run(HEAVY, jobs, f"h{i}")) for i in range(2)]
        await _until(lambda: jobs.started == ["h0"])
        with pytest.raises(MediaBusy):                               # a third heavy one: refused at once
            await media.run(HEAVY, jobs, "h2")
        light = asyncio.create_task(media.run(1000, jobs, "l0"))     # runs beside h0, h1 still waits
        await _until(lambda: jobs.started == ["h0", "l0"])
        jobs.release("l0")
        assert await light == "l0"
        for name in ("h0", "h1"):
            jobs.release(name)
        assert await asyncio.gather(*heavy) == ["h0", "h1"]
        assert jobs.started == ["h0", "l0", "h1"] and media.admitted == media.running == media.running_bytes == 0
        media.shutdown()

    asyncio.run(run())


def test_waiting_light_jobs_go_first_and_the_admission_is_bounded():
    async def run():
        media, jobs = MediaDecoder(workers=1, limit=4, memory_bytes=10 ** 12), _Jobs()
        first = asyncio.create_task(media.run(HEAVY, jobs, "h0"))
        await _until(lambda: jobs.started == ["h0"])
        waiting = [asyncio.create_task(media.run(HEAVY, jobs, "h1")),
                   asyncio.create_task(media.run(10, jobs, "l0")), asyncio.create_task(media.run(10, jobs, "l1"))]
        await _until(lambda: media.admitted == 4)
        with pytest.raises(MediaBusy):                               # four admitted: a light one is refused too
            await media.run(10, jobs, "l2")
        for name in ("h0", "l0", "l1", "h1"):
            jobs.release(name)
        await asyncio.gather(first, *waiting)
        assert jobs.started == ["h0", "l0", "l1", "h1"]
        media.shutdown()

    asyncio.run(run())


def test_running_jobs_stay_within_the_memory_budget_and_a_larger_one_runs_alone():
    async def run():
        media, jobs = MediaDecoder(workers=4, limit=16, memory_bytes=100), _Jobs()
        a = asyncio.create_task(media.run(60, jobs, "a"))
        b = asyncio.create_task(media.run(60, jobs, "b"))
        await _until(lambda: jobs.started == ["a"])
        await asyncio.sleep(0.05)
        assert jobs.started == ["a"] and media.running_bytes == 60   # b waits: 120 > 100
        jobs.release("a")
        await _until(lambda: jobs.started == ["a", "b"])
        big = asyncio.create_task(media.run(500, jobs, "big"))       # larger than the budget: waits for b, then alone
        await asyncio.sleep(0.05)
        assert "big" not in jobs.started
        jobs.release("b")
        await _until(lambda: jobs.started[-1] == "big")
        small = asyncio.create_task(media.run(1, jobs, "small"))
        await asyncio.sleep(0.05)
        assert "small" not in jobs.started                           # nothing beside the one over the budget
        jobs.release("big")
        jobs.release("small")
        await asyncio.gather(a, b, big, small)
        assert media.peak_bytes == 500 and media.running_bytes == 0
        media.shutdown()

    asyncio.run(run())


def test_a_job_whose_request_went_away_never_starts_and_errors_reach_their_request():
    async def run():
        media, jobs = MediaDecoder(workers=1, limit=4, memory_bytes=10 ** 12), _Jobs()
        first = asyncio.create_task(media.run(10, jobs, "a"))
        await _until(lambda: jobs.started == ["a"])
        gone = asyncio.create_task(media.run(10, jobs, "gone"))
        await _until(lambda: media.admitted == 2)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        jobs.release("a")
        await first

        def fails():
            raise ValueError("no frame decodes")

        with pytest.raises(ValueError, match="no frame decodes"):
            await media.run(10, fails)
        assert jobs.started == ["a"] and media.admitted == media.running == 0
        media.shutdown()

    asyncio.run(run())


# --- the upload reservation -------------------------------------------------------------------------------------

class _Bodies:
    """A BodyMiddleware around an app that reads nothing more and answers 200 with the body's length."""

    def __init__(self, **options):
        async def app(scope, receive, send):
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": str(len(body)).encode()})

        settings = {"limit": 30_000_000, "timeout_s": 60.0, "min_rate": 1.0, "buffer_bytes": 256 * 2 ** 20,
                    "peer_bytes": 64 * 2 ** 20, **options}
        self.middleware = BodyMiddleware(app, **settings)

    def upload(self, peer: str, chunks: list[bytes], length: int | None, stall: bool = False):
        """A task answering ``(status, detail)``: ``chunks`` sent, then — with ``stall`` — nothing more."""
        queue: asyncio.Queue = asyncio.Queue()
        for i, chunk in enumerate(chunks):
            queue.put_nowait({"type": "http.request", "body": chunk,
                              "more_body": stall or i < len(chunks) - 1})
        headers = [(b"content-type", b"multipart/form-data; boundary=x")]
        headers.append((b"content-length", str(length).encode()) if length is not None
                       else (b"transfer-encoding", b"chunked"))
        scope = {"type": "http", "method": "POST", "path": "/v1/search/captions", "headers": headers,
                 "client": (peer, 40000)}
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        async def call():
            await self.middleware(scope, queue.get, send)
            body = sent[1]["body"]
            return sent[0]["status"], (json.loads(body)["detail"] if sent[0]["status"] != 200 else body.decode())

        return asyncio.create_task(call())


def test_stalled_uploads_hold_only_what_they_sent_and_deny_nobody():
    """The issue's attack: 128 connections from one client declare 2 MB, send 1 KB and stall. They hold 128 KB
    (they once reserved 256 MB by their declared lengths, and every other upload over 64 KB got 503)."""
    async def run():
        bodies = _Bodies()
        stalled = [bodies.upload("10.0.0.66", [b"x" * 1024], 2_000_000, stall=True) for _ in range(128)]
        await _until(lambda: bodies.middleware.held == 128 * 1024)
        others = [bodies.upload("10.0.0.7", [b"y" * 500_000, b"y" * 500_000], 1_000_000),
                  bodies.upload("10.0.0.8", [b"z" * 9_000_000], None),
                  bodies.upload("10.0.0.66", [b"w" * 2_000_000], 2_000_000)]         # the stalling client too
        assert await asyncio.gather(*others) == [(200, "1000000"), (200, "9000000"), (200, "2000000")]
        assert bodies.middleware.held == 128 * 1024                   # what the answered ones held is back
        for task in stalled:
            task.cancel()
        await asyncio.gather(*stalled, return_exceptions=True)
        assert bodies.middleware.held == 0 and bodies.middleware.held_by == {}

    asyncio.run(run())


def test_one_client_holds_at_most_its_share_and_all_at_most_the_buffer():
    async def run():
        bodies = _Bodies(buffer_bytes=3_000_000, peer_bytes=1_000_000)
        hog = bodies.upload("10.0.0.66", [b"x" * 900_000], 5_000_000, stall=True)
        await _until(lambda: bodies.middleware.held == 900_000)
        # its next upload is refused before it is read (declared), or when the bytes that do not fit arrive
        declared = await bodies.upload("10.0.0.66", [b"x" * 200_000], 200_000)
        chunked = await bodies.upload("10.0.0.66", [b"x" * 50_000, b"x" * 150_000], None)
        for status, detail in (declared, chunked):
            assert status == 503 and "this client" in detail and "uploads" in detail
        assert await bodies.upload("10.0.0.7", [b"y" * 200_000], 200_000) == (200, "200000")   # others: fine
        # all clients together: at most the buffer
        more = [bodies.upload(f"10.0.1.{i}", [b"z" * 900_000], 1_000_000, stall=True) for i in range(2)]
        await _until(lambda: bodies.middleware.held == 2_700_000)
        status, detail = await bodies.upload("10.0.0.9", [b"q" * 400_000], 400_000)
        assert status == 503 and "uploads already" in detail
        small = await bodies.upload("10.0.0.9", [b"{}" * 100], 200)     # a JSON query takes nothing from it
        assert small == (200, "200") and SMALL_BODY > 200
        for task in (hog, *more):
            task.cancel()
        await asyncio.gather(hog, *more, return_exceptions=True)
        assert bodies.middleware.held == 0 and bodies.middleware.held_by == {}

    asyncio.run(run())
