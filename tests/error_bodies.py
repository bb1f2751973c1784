"""Every error answer the test suite provokes is read for what it must never hold: a server path (the test
session's temporary folder, where every gallery, index and model of the suite lives; the repository; Python's
library folders), a Python object's repr (``object at 0x…``) or a traceback.

A pytest plugin (``pytest_plugins`` in conftest.py): for the whole session, ``httpx.Client.send`` and
``httpx.AsyncClient.send`` — what Starlette's TestClient and every HTTP test use, against in-process apps and
``jointspace serve`` processes alike — check each 4xx and 5xx body they receive whole, and fail the test that
provoked it at once, naming what leaked. Raw-socket tests check their own bodies (tests/test_hostile_clients.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
ALWAYS = ("object at 0x", "Traceback (most recent call last)", "site-packages")


class LeakedError(AssertionError):
    """An error body that holds what no client may see."""


class ErrorBodies:
    """The check, with the server paths of this session."""

    def __init__(self, roots: list[str]):
        self.roots = [r for r in roots if r and r != "/"]
        self.checked = 0                                    # error bodies read so far

    def leak(self, body: str) -> str | None:
        """What in ``body`` must not be there, or None."""
        return next((s for s in (*self.roots, *ALWAYS) if s in body), None)

    def check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            body = response.text
        except httpx.ResponseNotRead:                       # a streamed answer the test reads itself
            return
        self.checked += 1
        found = self.leak(body)
        if found is not None:
            request = response.request
            raise LeakedError(f"{request.method} {request.url} answered {response.status_code} with a body that "
                              f"holds {found!r}: {body[:500]}")


@pytest.fixture(autouse=True, scope="session")
def error_bodies(tmp_path_factory):
    """The session's :class:`ErrorBodies`, checking every error answer an httpx client receives."""
    checker = ErrorBodies([str(tmp_path_factory.getbasetemp()), str(REPO), f"{sys.base_prefix}/lib",
                           f"{sys.prefix}/lib"])
    sync_send, async_send = httpx.Client.send, httpx.AsyncClient.send

    def send(self, request, **kwargs):
        response = sync_send(self, request, **kwargs)
        checker.check(response)
        return response

    async def asend(self, request, **kwargs):
        response = await async_send(self, request, **kwargs)
        checker.check(response)
        return response

    httpx.Client.send, httpx.AsyncClient.send = send, asend      # type: ignore[method-assign]
    try:
        yield checker
    finally:
        httpx.Client.send, httpx.AsyncClient.send = sync_send, async_send    # type: ignore[method-assign]
