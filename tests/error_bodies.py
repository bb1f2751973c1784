"""Every error answer the test suite provokes is read for what it must never hold: a server path (the test
session's temporary folder, where every gallery, index and model of the suite lives; the repository; Python's
library folders), a Python object's repr (``object at 0x…``) or a traceback.

A pytest plugin (``pytest_plugins`` in conftest.py): for the whole session, the ``send`` of httpx's clients and of
httpx2's (Starlette's TestClient) — what every HTTP test uses, against in-process apps and ``jointspace serve``
processes alike — check each 4xx and 5xx body they receive whole, and fail the test that provoked it at once,
naming what leaked. Raw-socket tests check their own bodies (tests/test_hostile_clients.py).
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
        except Exception:  # noqa: BLE001 - ResponseNotRead (httpx's or httpx2's): a stream the test reads itself
            return
        self.checked += 1
        found = self.leak(body)
        if found is not None:
            request = response.request
            raise LeakedError(f"{request.method} {request.url} answered {response.status_code} with a body that "
                              f"holds {found!r}: {body[:500]}")


def _clients():
    """The httpx client classes in use: httpx's, and httpx2's (what Starlette's TestClient is built on)."""
    modules = [httpx]
    try:
        import httpx2
    except ImportError:
        pass
    else:
        modules.append(httpx2)
    return [(m.Client, m.AsyncClient) for m in modules]


@pytest.fixture(autouse=True, scope="session")
def error_bodies(tmp_path_factory):
    """The session's :class:`ErrorBodies`, checking every error answer an httpx client receives."""
    checker = ErrorBodies([str(tmp_path_factory.getbasetemp()), str(REPO), f"{sys.base_prefix}/lib",
                           f"{sys.prefix}/lib"])
    originals = []
    for sync_client, async_client in _clients():
        sync_send, async_send = sync_client.send, async_client.send
        originals.append((sync_client, async_client, sync_send, async_send))

        def send(self, request, _send=sync_send, **kwargs):
            response = _send(self, request, **kwargs)
            checker.check(response)
            return response

        async def asend(self, request, _send=async_send, **kwargs):
            response = await _send(self, request, **kwargs)
            checker.check(response)
            return response

        sync_client.send, async_client.send = send, asend
    try:
        yield checker
    finally:
        for sync_client, async_client, sync_send, async_send in originals:
            sync_client.send, async_client.send = sync_send, async_send
