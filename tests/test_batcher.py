"""The dynamic batcher on its own: batch limits, each caller gets its own result, errors, the bounded queue,
and the adaptive wait."""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from service.batcher import DynamicBatcher, QueueFull


def _run(coro):
    return asyncio.run(coro)


def test_concurrent_items_are_batched_up_to_max_batch_and_answered_in_order():
    seen = []

    def square_all(items):
        seen.append(list(items))
        time.sleep(0.01)                      # a forward pass takes time: later arrivals form the next batch
        return [x * x for x in items]

    async def main():
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(square_all, pool, max_batch=8, max_wait_ms=50)
            await b.start()
            results = await asyncio.gather(*(b.submit(i) for i in range(30)))
            await b.stop()
            return results

    assert _run(main()) == [i * i for i in range(30)]
    assert all(1 <= len(batch) <= 8 for batch in seen) and max(len(batch) for batch in seen) == 8
    assert sorted(x for batch in seen for x in batch) == list(range(30))          # each item exactly once


def test_a_failing_request_fails_alone_and_the_rest_of_its_batch_is_answered():
    calls = []

    def fail_on_13(items):
        calls.append(list(items))
        if 13 in items:
            raise ValueError("bad request 13")
        return [x * 10 for x in items]

    async def main():
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(fail_on_13, pool, max_batch=8, max_wait_ms=50)
            await b.start()
            first = await asyncio.gather(*(b.submit(i) for i in (11, 12, 13, 14)), return_exceptions=True)
            after = await b.submit(7)
            await b.stop()
            return first, after

    first, after = _run(main())
    assert first[:2] == [110, 120] and first[3] == 140 and after == 70
    assert isinstance(first[2], ValueError) and "13" in str(first[2])
    assert calls[0] == [11, 12, 13, 14]                 # tried as one batch first, then each on its own
    assert [11] in calls and [13] in calls


def test_full_queue_refuses_at_once():
    def slow(items):
        time.sleep(0.2)
        return list(items)

    async def main():
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(slow, pool, max_batch=1, max_wait_ms=0, max_queue=2)
            await b.start()
            tasks = [asyncio.create_task(b.submit(i)) for i in range(2)]
            await asyncio.sleep(0.05)         # the worker has taken one; one waits
            tasks.append(asyncio.create_task(b.submit(2)))   # fills the queue again
            await asyncio.sleep(0)
            with pytest.raises(QueueFull):
                await b.submit(3)
            done = await asyncio.gather(*tasks)
            await b.stop()
            return done

    assert _run(main()) == [0, 1, 2]


def test_a_lone_request_does_not_wait_when_nobody_else_is_coming():
    async def main(pending):
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(lambda items: list(items), pool, max_batch=8, max_wait_ms=300, pending=pending)
            await b.start()
            start = time.perf_counter()
            await b.submit(1)
            elapsed = time.perf_counter() - start
            await b.stop()
            return elapsed

    assert _run(main(lambda: 1)) < 0.2        # only itself in flight: runs at once
    assert _run(main(lambda: 2)) >= 0.25      # one more announced: waits (up to max_wait_ms) for it
