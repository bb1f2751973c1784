"""Bulk embedding's double buffering (training/inference/overlap.py), run here on the CPU at the depth a GPU uses:
results come back one batch late, in order, with their tags, equal to embedding each batch at once; the timeline
tells the start-up from the steady rate, and ``index build`` says both."""
import numpy as np
import torch

from index.cli_build import timing_line
from training.inference import overlap
from training.inference.overlap import Overlap, Timeline


def test_two_batches_in_flight_come_back_in_order_and_equal():
    weight = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    batches = [torch.randn(n, 6, generator=torch.Generator().manual_seed(n)) for n in (4, 1, 3, 5)]
    flight = Overlap(lambda x: x @ weight, "cpu", depth=2)
    got = []
    for i, batch in enumerate(batches):
        now = list(flight.push(batch, f"b{i}"))
        assert [tag for tag, _ in now] == ([] if i == 0 else [f"b{i - 1}"])          # one batch late
        got += now
    assert len(flight.pending) == 1
    got += list(flight.drain())
    assert [tag for tag, _ in got] == ["b0", "b1", "b2", "b3"] and not flight.pending
    for (_, rows), batch in zip(got, batches):
        assert rows.dtype == np.float32 and np.allclose(rows, (batch @ weight).numpy())
    assert [done for _, done in flight.timeline.marks] == [4, 5, 8, 13]
    assert Overlap(lambda x: x, "cpu").depth == 1                 # a CPU: each batch done when pushed
    assert [t for t, _ in Overlap(lambda x: x, "cpu").push(batches[0], "now")] == ["now"]


def test_startup_and_steady_rate_apart():
    timeline = Timeline([(12.0, 64), (13.0, 128), (14.0, 192), (16.0, 320)])
    assert timeline.startup(10.0) == 2.0 and timeline.steady() == 64.0      # (320 - 64) photos in 4 s
    assert Timeline([(3.0, 10)]).steady() is None and Timeline().startup(0.0) is None
    line = timing_line(timeline, 10.0, 17.5)
    assert line == ("timing: start-up 2.0 s to the first batch of 64 photos, then 64.0 photos/s steady over 256 "
                    "photos; 7.5 s in all")
    assert timing_line(None, 0.0, 1.0) == "timing: 1.0 s in all (no photo embedded in-process)"
    timeline.phases.update({"waiting for decoded photos": 2.5, "the model": 1.25})
    assert timing_line(timeline, 10.0, 17.5).endswith(
        "7.5 s in all (after the first batch: waiting for decoded photos 2.5 s, the model 1.2 s)")


def test_the_phases_count_the_host_time_after_the_first_batch(monkeypatch):
    clock = iter([0.0, 1.0, 5.0, 5.5, 10.0, 12.0, 20.0])
    monkeypatch.setattr(overlap.time, "perf_counter", lambda: next(clock))
    timeline = Timeline()
    with timeline.phase("waiting for decoded photos"):      # began at 0: no batch in hand yet, not counted
        timeline.mark(4)                                     # the first batch, at 1
    with timeline.phase("waiting for decoded photos"):      # 5 → 5.5
        pass
    with timeline.phase("the model"):                        # 10 → 20, the second batch in hand at 12
        timeline.mark(4)
    assert timeline.phases == {"waiting for decoded photos": 0.5, "the model": 10.0}
    assert timeline.marks == [(1.0, 4), (12.0, 8)]


def test_an_event_keeps_the_first_time_it_happened(monkeypatch):
    clock = iter([3.0, 4.0])
    monkeypatch.setattr(overlap.time, "perf_counter", lambda: next(clock))
    timeline = Timeline()
    timeline.event("first decoded batch in hand")
    timeline.event("first decoded batch in hand")
    assert timeline.events == {"first decoded batch in hand": 3.0}
