"""Routing of walkv's HTTP server: the one parse of a request's target, and
the matching of its path against the route table (:data:`kvstore.server.app.ROUTES`).

Why the server routes by itself: aiohttp's router matches the DECODED path,
so ``PUT /v1/%6Bv/x`` reached the handler of ``/v1/kv/{key}`` while the role
was chosen by the raw path, and fell back to ``read`` (issue 33). Here the
route, its role, its handler and the values of its parameters (the key, a
subscription's name) all come from ONE match of the raw target:

* The request-target (RFC 9112 section 3.2) is origin-form (``/path?query``)
  or absolute-form (``http://host/path?query``, which a server MUST accept:
  its path and query are used, and the host is ignored, as the ``Host``
  header is). Anything else is a 400: the asterisk form (``OPTIONS *``), the
  authority form (``CONNECT host:port``), another scheme, userinfo in the
  authority (RFC 9110 section 4.2.4), a fragment (``#`` is no part of a target).
* A route's pattern is segments: fixed ones match the raw path literally,
  byte for byte, so ``%6Bv`` is not ``kv`` and ``//``, ``.`` and ``..`` are
  segments no fixed one equals; a ``{name}`` is one raw segment (not empty,
  ``.``, ``..`` or holding a ``/``, decoded or not), percent-decoded; a
  last ``{name*}`` is the rest of the raw path, percent-decoded, whatever
  it holds (``/v1/kv/{key*}``: everything after ``/v1/kv/`` is the key,
  ``..`` and ``//`` included).
  Decoding is :func:`urllib.parse.unquote_to_bytes`: any byte string.
* A request that matches no route is refused (deny by default): 404, after
  the token check a ``read`` route would get (so a stranger learns nothing).
  A path that some route has, asked with another method, is 405 with
  ``Allow``, after the check of the lowest role among that path's routes
  (HEAD or OPTIONS on an admin route is 403 to a read token).
* A route names the query parameters it takes; any other is a 400, and so
  is a parameter given twice (:class:`~kvstore.server.context.Query`).

Adding a route is one :class:`Route` line in the table; its handler is
``async def handler(request, match)`` and reads its parameters from the
:class:`RouteMatch`, never from the request's path.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web

from kvstore.client.wire import BadRequest, MethodNotAllowed, NotFound
from kvstore.server.auth import READ
from kvstore.server.context import Query

Handler = Callable[[web.Request, "RouteMatch"], Awaitable[web.StreamResponse]]

_ABSOLUTE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)", re.DOTALL)
_PARAM = re.compile(r"\{(\w+)(\*?)\}")


def split_target(target: str) -> tuple[str, str]:
    """``(path, query)`` of a raw request-target, both still percent-encoded
    (module docstring); :class:`BadRequest` for a form walkv does not serve."""
    if not target.startswith("/"):
        m = _ABSOLUTE.fullmatch(target)
        if m is None or m.group(1).lower() not in ("http", "https"):
            raise BadRequest(f"the request-target must be a path (/v1/...) or an http(s) URL, not "
                             f"{target[:60]!r} (RFC 9112 section 3.2)")
        if "@" in m.group(2) or not m.group(2):
            raise BadRequest("the request-target's URL must name a host and no user (RFC 9110 section 4.2.4)")
        target = m.group(3)
        if not target.startswith("/"):
            target = "/" + target
    if "#" in target:
        raise BadRequest("the request-target holds a fragment ('#'); percent-encode '#' in a key as %23")
    path, _, query = target.partition("?")
    return path, query


@dataclass(frozen=True)
class Route:
    """One line of the route table: ``method pattern`` is served by
    ``handler`` for a token of at least ``role``, with the query parameters
    ``params`` (any other is a 400)."""

    method: str
    pattern: str
    handler: Handler
    role: int
    params: frozenset[str] = frozenset()
    segments: tuple[str, ...] = field(init=False, repr=False)
    names: tuple[str | None, ...] = field(init=False, repr=False)
    """Per segment: None for a fixed one, else the parameter's name."""
    tail: bool = field(init=False, repr=False)
    """The last segment is ``{name*}``: the rest of the path."""

    def __post_init__(self) -> None:
        if not self.pattern.startswith("/"):
            raise ValueError(f"a route's pattern starts with '/': {self.pattern!r}")
        segments = tuple(self.pattern[1:].split("/"))
        names: list[str | None] = []
        tail = False
        for i, segment in enumerate(segments):
            m = _PARAM.fullmatch(segment)
            if m is None:
                if "{" in segment or "%" in segment or segment in (".", ".."):
                    raise ValueError(f"route {self.pattern!r}: segment {segment!r} is neither fixed nor {{name}}")
                names.append(None)
                continue
            if m.group(2) and i != len(segments) - 1:
                raise ValueError(f"route {self.pattern!r}: {{{m.group(1)}*}} must be the last segment")
            tail = bool(m.group(2))
            names.append(m.group(1))
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "names", tuple(names))
        object.__setattr__(self, "tail", tail)

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The raw values of the parameters when the path ``parts`` (the raw
        path split at ``/``, without its leading empty part) matches, else None."""
        segments, names = self.segments, self.names
        if len(parts) != len(segments) and not (self.tail and len(parts) > len(segments)):
            return None
        values: dict[str, str] = {}
        last = len(segments) - 1
        for i, segment in enumerate(segments):
            name = names[i]
            if name is None:
                if parts[i] != segment:
                    return None
            elif i == last and self.tail:
                values[name] = "/".join(parts[i:])
            elif not _segment(parts[i]):
                return None
            else:
                values[name] = parts[i]
        return values


def _segment(raw: str) -> bool:
    """Whether a raw segment can be a ``{name}``: not empty, ``.`` or ``..``,
    and no ``/`` once decoded (a name never holds one; ``%2F`` in a path
    must not make two segments of one)."""
    decoded = urllib.parse.unquote(raw) if "%" in raw else raw
    return decoded not in ("", ".", "..") and "/" not in decoded


def route(method: str, pattern: str, handler: Handler, role: int, params: Iterable[str] = ()) -> Route:
    """A :class:`Route` (the table's one-line spelling)."""
    return Route(method, pattern, handler, role, frozenset(params))


class RouteMatch:
    """What the router found for a request: the route, its path parameters
    (percent-decoded on demand), its query (checked against the route's) and
    the token it came with (its index in the tokens file; None without tokens)."""

    __slots__ = ("route", "_values", "query", "token")

    def __init__(self, route: Route, values: dict[str, str], query: Query, token: int | None) -> None:
        self.route = route
        self._values = values
        self.query = query
        self.token = token

    def param(self, name: str) -> bytes:
        """Path parameter ``name``, percent-decoded to bytes."""
        return urllib.parse.unquote_to_bytes(self._values[name])

    def text(self, name: str) -> str:
        """Path parameter ``name`` as UTF-8 text (:class:`BadRequest` when it is not)."""
        try:
            return self.param(name).decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest(f"the {name} in the path is not UTF-8 text") from None


class Router:
    """The route table, matched against raw request-targets (module docstring)."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = list(routes)
        seen = set()
        for r in self.routes:
            key = (r.method, r.segments)
            if key in seen:
                raise ValueError(f"two routes for {r.method} {r.pattern}")
            seen.add(key)

    def resolve(self, method: str, target: str) -> tuple[Route | RouteRefusal, dict[str, str], str]:
        """The route ``method target`` asks for, its raw path values and raw
        query; or, when there is none, the :class:`RouteRefusal` to answer
        with (a 400 for a target walkv does not serve raises here)."""
        path, query = split_target(target)
        parts = path[1:].split("/")
        allowed: list[Route] = []
        for r in self.routes:
            values = r.match(parts)
            if values is None:
                continue
            if r.method == method:
                return r, values, query
            allowed.append(r)
        if not allowed:
            return RouteRefusal(READ, NotFound("no such route; see docs/http-api.md for the /v1 API")), {}, query
        methods = sorted({r.method for r in allowed})
        error = MethodNotAllowed(f"{method} is not allowed here (allowed: {', '.join(methods)})")
        error.allow = ", ".join(methods)
        return RouteRefusal(min(r.role for r in allowed), error), {}, query


@dataclass(frozen=True)
class RouteRefusal:
    """No route serves the request: ``error`` is the answer, given once the
    token was checked against ``role``."""

    role: int
    error: Exception
