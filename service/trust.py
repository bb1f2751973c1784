"""Who may talk to the service from a browser: the ``Host`` names it answers (against DNS rebinding) and the
origins allowed to read it cross-site (CORS, off unless configured).

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
