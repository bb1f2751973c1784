"""Prometheus metrics of one app instance (its own registry, so several apps in one process never clash).

* ``jointspace_requests_total{route, method, status}`` — requests answered, by route template;
* ``jointspace_request_seconds{route, method}`` — request latency histogram;
* ``jointspace_batch_size{batcher}`` — requests per forward pass of each dynamic batcher;
* ``jointspace_batch_seconds{batcher}`` — forward pass + index search time per batch;
* ``jointspace_queue_depth{batcher}`` — requests waiting to be batched;
* ``jointspace_in_flight`` — requests admitted to the model (read, decoded, queued or computed), the number
  ``JOINTSPACE_MAX_QUEUE`` bounds;
* ``jointspace_shed_total{batcher, reason}`` — requests answered 503 without being computed: ``reason`` =
  ``queue_full`` (refused on arrival, or by a full batcher queue) or ``deadline`` (dropped when its deadline
  passed before its batch began); ``batcher`` = ``admission`` for those refused on arrival, ``thumbnail`` for
  thumbnails refused on arrival, ``uploads`` (``reason`` = ``buffer_full``) for bodies refused before they were
  read because the upload buffer was full;
* ``jointspace_bodies_receiving`` — request bodies being received now (not yet admitted);
* ``jointspace_body_timeouts_total`` — requests answered 408 because their body arrived too slowly;
* ``jointspace_index_vectors{side}`` — vectors in the live index generation.

With ``serve --workers N`` (service/workers.py) the metrics are prometheus_client's multiprocess ones
(``PROMETHEUS_MULTIPROC_DIR`` set by the parent before the workers start) and every worker's ``/metrics`` reports
the whole service: counters and histograms summed over the workers, the gauges of requests in flight, queued and
being received summed over the live workers, and ``jointspace_index_vectors`` one series per live worker, labelled
``pid``.
"""
from __future__ import annotations

import os
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("jointspace_requests", "HTTP requests answered", ["route", "method", "status"],
                                registry=self.registry)
        self.latency = Histogram("jointspace_request_seconds", "HTTP request latency", ["route", "method"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("jointspace_batch_size", "requests encoded together in one forward pass",
                                    ["batcher"], buckets=BATCH_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram("jointspace_batch_seconds", "forward pass + index search per batch",
                                       ["batcher"], buckets=LATENCY_BUCKETS, registry=self.registry)
        # multiprocess_mode: how the workers' values add up under serve --workers (ignored with one process)
        self.queue_depth = Gauge("jointspace_queue_depth", "requests waiting for a batch", ["batcher"],
                                 registry=self.registry, multiprocess_mode="livesum")
        self.in_flight = Gauge("jointspace_in_flight", "requests admitted to the model and not yet answered",
                               registry=self.registry, multiprocess_mode="livesum")
        self.shed = Counter("jointspace_shed", "requests answered 503 without being computed",
                            ["batcher", "reason"], registry=self.registry)
        self.bodies_receiving = Gauge("jointspace_bodies_receiving", "request bodies being received (not yet "
                                                                     "admitted)", registry=self.registry,
                                      multiprocess_mode="livesum")
        self.body_timeouts = Counter("jointspace_body_timeouts", "requests answered 408: body too slow",
                                     registry=self.registry)
        self.index_vectors = Gauge("jointspace_index_vectors", "vectors in the live index", ["side"],
                                   registry=self.registry, multiprocess_mode="liveall")

    def render(self) -> bytes:
        """The Prometheus text of this app's metrics; of every worker's together under ``serve --workers``."""
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=directory)
            return generate_latest(registry)
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Pure ASGI middleware: counts and times every HTTP request under its route template (``/v1/images/{id}``,
    not the concrete path, so the label set stays small)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(template, scope["method"], str(status)).inc()
            self.metrics.latency.labels(template, scope["method"]).observe(time.perf_counter() - start)
