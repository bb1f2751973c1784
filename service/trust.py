"""Who may talk to the service: the ``Host`` names it answers (against DNS rebinding), the origins allowed to read
it cross-site (CORS, off unless configured) and to post to it (:class:`OriginMiddleware`: its own, and those
configured), and how fast one client address may guess API keys (:class:`FailureLimiter`).

DNS rebinding: a web page on ``evil.example`` makes its name resolve to 127.0.0.1, and its scripts then read the
local service as *same-origin* — the browser sends ``Host: evil.example``. The service answers only the ``Host``
names it knows (:class:`TrustedHostMiddleware`): the loopback names, the address it is bound to and those
configured; any other is answered 421. A request without ``Host`` (HTTP/1.0 probes) passes: browsers always
send one. ``/healthz``, ``/readyz`` and ``/metrics`` answer any ``Host``: probes and scrapers address a
container by its own name or IP, and those routes carry no gallery content.
"""
from __future__ import annotations

import ipaddress
import json
import math
import time
from collections import OrderedDict

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
ANY_HOST_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def split_names(text: str | None) -> list[str]:
    """A comma-separated setting → its non-empty, stripped entries."""
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def host_name(value: str) -> str | None:
    """The name of a ``Host`` header value, lower-case, without the port or a trailing dot: ``localhost:8000`` →
    ``localhost``, ``[::1]:8000`` → ``[::1]``, ``Example.COM.`` → ``example.com``. None when it is not a host
    (empty, spaces, a bad port, an unclosed bracket)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[:end + 1], value[end + 1:]
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    else:
        name, _, port = value.partition(":")
        rest = f":{port}" if port or value.endswith(":") else ""
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    name = name.rstrip(".") if not name.startswith("[") else name
    if not name or any(c.isspace() or c in "/\\@?#" for c in name):
        return None
    return name


def normalise(entry: str) -> str:
    """A configured host name as :func:`host_name` gives it; a bare IPv6 address gets its brackets."""
    entry = entry.strip().lower()
    if entry in ("*", ""):
        return entry
    if ":" in entry and not entry.startswith("["):
        try:
            return f"[{ipaddress.IPv6Address(entry).compressed}]"
        except ValueError:
            pass
    if entry.startswith("[") and entry.endswith("]"):
        try:
            return f"[{ipaddress.IPv6Address(entry[1:-1]).compressed}]"
        except ValueError:
            return entry
    return entry.rstrip(".")


def allowed_hosts(configured: str | None, bound: str) -> list[str]:
    """Every name served: the loopback names, the bound address (``JOINTSPACE_HOST``) and the configured ones."""
    names = [*LOOPBACK, normalise(bound), *(normalise(e) for e in split_names(configured))]
    return list(dict.fromkeys(n for n in names if n))


class TrustedHostMiddleware:
    """Answers 421 (JSON ``{"detail"}``) to a request whose ``Host`` is not one of ``hosts`` (the port is not
    compared; ``*`` allows any host, ``*.example.com`` that domain's subdomains), except on the operations routes
    (:data:`ANY_HOST_PATHS`)."""

    def __init__(self, app: ASGIApp, hosts: list[str]):
        self.app = app
        self.any = "*" in hosts
        self.exact = {h for h in hosts if not h.startswith("*.")}
        self.suffixes = tuple(h[1:] for h in hosts if h.startswith("*."))      # ".example.com"

    def allows(self, value: str) -> bool:
        name = host_name(value)
        if name is None:
            return False
        if name.startswith("["):
            name = normalise(name)
        return self.any or name in self.exact or (bool(self.suffixes) and name.endswith(self.suffixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.any:
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope.get("headers", ()) if k == b"host"]
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if (not values or (len(values) == 1 and self.allows(values[0].decode("latin-1")))) \
                or path in ANY_HOST_PATHS:
            await self.app(scope, receive, send)
            return
        shown = values[0].decode("latin-1")[:100] if len(values) == 1 else f"{len(values)} Host headers"
        body = json.dumps({"detail": f"this service does not answer for the host {shown!r} (the Host header): "
                                     f"it serves only the names it is configured for (JOINTSPACE_ALLOWED_HOSTS, "
                                     f"or serve --allowed-hosts; loopback names always)"}).encode()
        await send({"type": "http.response.start", "status": 421, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def cors_origins(configured: str | None) -> list[str]:
    """The origins of ``JOINTSPACE_CORS_ORIGINS``, without a trailing slash (a browser's ``Origin`` has none)."""
    return [o.rstrip("/") for o in split_names(configured)]


# --- cross-site requests ------------------------------------------------------------------------------------------

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def origin_key(origin: str) -> tuple[str, str, str] | None:
    """``scheme://host[:port]`` → ``(scheme, host, port)`` (lower-case; the scheme's default port when none is
    given); None when it is not an origin (``null``, no scheme, a path)."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or scheme not in _DEFAULT_PORTS or not rest or "/" in rest:
        return None
    name, port = _host_port(rest)
    if name is None:
        return None
    return scheme, name, port or _DEFAULT_PORTS[scheme]


def _host_port(value: str) -> tuple[str | None, str]:
    """A ``Host`` value's name (:func:`host_name`) and port ('' when none)."""
    value = value.strip().lower()
    tail = value[value.find("]") + 1:] if value.startswith("[") else value
    port = tail.rpartition(":")[2] if ":" in tail else ""
    return host_name(value), port


class OriginMiddleware:
    """Answers 403 to a request of an unsafe method (POST, PUT, PATCH, DELETE: anything but :data:`SAFE_METHODS`)
    whose ``Origin`` header names another origin than the service's own — the ``Host`` it was sent to — or one of
    ``origins`` (``*``: any). A web page anywhere can make its visitor's browser POST a form or a file to
    ``http://localhost:8000`` without a CORS preflight (a *simple* request); the browser says where the page came
    from in ``Origin``, and the service refuses it, as Ollama-class local services do. A request without ``Origin``
    (curl, scripts, a browser's same-origin GET) passes; ``Origin: null`` (a sandboxed or file:// page) does not.
    The check runs before the body is read."""

    def __init__(self, app: ASGIApp, origins: list[str]):
        self.app = app
        self.any = "*" in origins
        self.allowed = {k for k in (origin_key(o) for o in origins if o != "*") if k is not None}

    def same_origin(self, origin: tuple[str, str, str], host: str) -> bool:
        name, port = _host_port(host)
        return name is not None and (origin[1], origin[2]) == (name, port or _DEFAULT_PORTS[origin[0]])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS or self.any:
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", ())
        origins = [v.decode("latin-1") for k, v in headers if k == b"origin"]
        if not origins:
            await self.app(scope, receive, send)
            return
        hosts = [v.decode("latin-1") for k, v in headers if k == b"host"]
        key = origin_key(origins[0]) if len(origins) == 1 else None
        if key is not None and (key in self.allowed or (len(hosts) == 1 and self.same_origin(key, hosts[0]))):
            await self.app(scope, receive, send)
            return
        shown = origins[0][:100] if len(origins) == 1 else f"{len(origins)} Origin headers"
        body = json.dumps({"detail": f"cross-site request refused: the page at the origin {shown!r} (the Origin "
                                     f"header) is not this service's own and not one it is configured to accept "
                                     f"(JOINTSPACE_ALLOWED_ORIGINS or JOINTSPACE_CORS_ORIGINS)"}).encode()
        await send({"type": "http.response.start", "status": 403, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


# --- guessing API keys --------------------------------------------------------------------------------------------

class FailureLimiter:
    """Wrong API keys per client address, a token bucket each: ``per_minute`` tokens, refilled at that rate; a
    wrong key takes one. An address whose bucket is empty is refused (:meth:`wait`) until a token is back, whether
    its next key is right or not — so keys can be guessed at most ``per_minute`` a minute per address, instead of
    as fast as the service answers. At most ``addresses`` are remembered (the least recently failed forgotten
    first). ``per_minute`` 0: no limit."""

    def __init__(self, per_minute: int, addresses: int = 10_000, clock=time.monotonic):
        self.per_minute, self.addresses, self.clock = per_minute, addresses, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()     # address → (tokens, when)

    def _tokens(self, address: str) -> float:
        tokens, when = self._buckets.get(address, (float(self.per_minute), self.clock()))
        return min(float(self.per_minute), tokens + (self.clock() - when) * self.per_minute / 60)

    def wait(self, address: str) -> int:
        """Seconds ``address`` must wait before its next attempt (0: it may try now)."""
        if not self.per_minute or address not in self._buckets:
            return 0
        tokens = self._tokens(address)
        return 0 if tokens >= 1 else max(1, math.ceil((1 - tokens) * 60 / self.per_minute))

    def failed(self, address: str) -> None:
        if not self.per_minute:
            return
        self._buckets[address] = (max(0.0, self._tokens(address) - 1), self.clock())
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.addresses:
            self._buckets.popitem(last=False)
