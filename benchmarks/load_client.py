"""A load client that is not its own bottleneck: ``c`` keep-alive connections spread over several processes, each
an asyncio loop that sends the next request as soon as the last one is answered (a closed loop, as
``service_load.py`` does in one process). Each process reports its answers, their latencies and its own CPU time, so
a run shows what the client itself cost. Standard library only: a client process imports nothing of the service.

    from benchmarks.load_client import ClientPool
    with ClientPool(processes=8) as pool:
        row = pool.run(port, requests, concurrency=128, seconds=5.0)
"""
from __future__ import annotations

import asyncio
import multiprocessing
import re
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

_LENGTH = re.compile(rb"(?i)content-length: *(\d+)")


async def _one_connection(port: int, requests: list[bytes], offset: int, stop: float, warm: float,
                          latencies: list[float], statuses: dict[int, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        i = offset
        while True:
            began = time.perf_counter()
            if began >= stop:
                return
            writer.write(requests[i % len(requests)])
            head = await reader.readuntil(b"\r\n\r\n")
            match = _LENGTH.search(head)
            await reader.readexactly(int(match.group(1)) if match else 0)
            if began >= warm:                     # answers to requests sent after the warm-up count
                latencies.append(time.perf_counter() - began)
                status = int(head.split(b" ", 2)[1])
                statuses[status] = statuses.get(status, 0) + 1
            i += 1
    finally:
        writer.close()


def drive(port: int, requests: list[bytes], connections: int, offset: int, seconds: float, warmup: float) -> dict:
    """In a client process: ``connections`` connections for ``warmup + seconds``; what was answered after the
    warm-up, and this process's CPU seconds over the measured time."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def main() -> float:
        start = time.perf_counter()
        warm, stop = start + warmup, start + warmup + seconds
        cpu = [0.0]

        async def mark() -> None:               # CPU time from the end of the warm-up
            await asyncio.sleep(warmup)
            cpu[0] = time.process_time()
        marker = asyncio.ensure_future(mark())
        await asyncio.gather(*(_one_connection(port, requests, offset + j * 7, stop, warm, latencies, statuses)
                               for j in range(connections)))
        await marker
        return time.process_time() - cpu[0]
    cpu_s = asyncio.run(main())
    return {"latencies": latencies, "statuses": statuses, "cpu_s": cpu_s}


class ClientPool:
    """``processes`` client processes (spawned once, kept for every :meth:`run`)."""

    def __init__(self, processes: int):
        self.processes = max(1, processes)
        self.pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"))

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(cancel_futures=True)

    def run(self, port: int, requests: list[bytes], concurrency: int, seconds: float, warmup: float = 0.5) -> dict:
        """``concurrency`` connections in all, spread over at most :attr:`processes` processes: answers per second,
        p50/p99 latency (ms), the statuses that were not 200, and the client's own CPU (cores busy, summed)."""
        procs = min(self.processes, concurrency)
        shares = [concurrency // procs + (1 if p < concurrency % procs else 0) for p in range(procs)]
        begun = time.perf_counter()
        jobs = [self.pool.submit(drive, port, requests, n, sum(shares[:p]), seconds, warmup)
                for p, n in enumerate(shares)]
        parts = [job.result() for job in jobs]
        wall = time.perf_counter() - begun - warmup
        latencies = sorted(x for part in parts for x in part["latencies"])
        statuses: dict[str, int] = {}
        for part in parts:
            for status, n in part["statuses"].items():
                if status != 200:
                    statuses[str(status)] = statuses.get(str(status), 0) + n
        q = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else latencies * 99
        return {"concurrency": concurrency, "client_processes": procs, "answers": len(latencies),
                "rps": len(latencies) / seconds, "p50_ms": 1000 * q[49] if q else None,
                "p99_ms": 1000 * q[98] if q else None, "not_200": statuses,
                "client_cpu_cores": sum(part["cpu_s"] for part in parts) / max(wall, 1e-9)}
