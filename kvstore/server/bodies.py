"""Request bodies of walkv's HTTP server: read within bounds, parsed without
stalling the event loop, and their fields checked (every bad value is
:class:`~kvstore.client.wire.BadRequest`, a 400).

A raw body (a put's value) is bounded by :attr:`~kvstore.server.context.Served.max_body`
(the store's largest record). A JSON body has bounds of its own, far
below that (:attr:`~kvstore.server.context.Limits.max_json_bytes`,
:attr:`~kvstore.server.context.Limits.max_json_items`), because parsing it
builds a Python object per element: 63 MB of ``[],[],...`` was 21 million
lists, 1.5 GB and 4-5 s of a parser that holds the GIL (issue 33). Over
either bound: 413 ``PayloadTooLarge``, before anything is parsed (the
elements are counted by their ``[``, ``{`` and ``,``, which base64 strings
never hold, so a legitimate body is not over-counted).

Where it is parsed: a body of at most :data:`INLINE_JSON_BYTES` on the
event loop (microseconds); a bigger one, and the conversion of what it
holds (base64 values decoded, a batch built), on a worker thread with the
pure-Python JSON scanner. The C scanner would hold the GIL for the whole
document, so the loop would stall all the same; the Python one lets the
loop run between its steps (measured: ``benchmarks/server_abuse.py``).
Nesting is bounded by :data:`MAX_JSON_DEPTH` before anything is parsed (too
deep: 400): a parser recursing to the interpreter's limit (``[`` x 100,000)
left no stack for whatever finalizer a garbage collection ran meanwhile, in
any thread of the server, and walkv's bodies nest 4 deep. Each field's shape
is then checked where it is read.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
import re
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from kvstore.client.wire import BadRequest, PayloadTooLarge, b64decode
from kvstore.server.context import MAX_LSN, Served

T = TypeVar("T")

MAX_JSON_DEPTH = 32
"""The deepest nesting of arrays and objects a JSON body may have (module docstring)."""
_NESTING = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # a string (skipped whole), or a bracket
INLINE_JSON_BYTES = 64 * 1024
"""JSON bodies up to this size are parsed on the event loop (at most a few ms)."""


async def read_body(request: web.Request, served_: Served, limit: int | None = None) -> bytes:
    """The request body, bounded in size (``limit``, default the store's
    largest record: 413) and in time (:attr:`Limits.body_timeout`)."""
    limit = served_.max_body if limit is None else limit
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"the request body of {request.content_length} bytes is over this server's "
                              f"limit of {limit} bytes for it")
    length = request.content_length
    head = b""
    if length is not None:  # a small body usually arrived with the headers: no timer needed
        head = request.content.read_nowait(length)
        if len(head) == length:
            return head
    try:
        async with asyncio.timeout(served_.limits.body_timeout):
            if length is not None:
                return head + await request.content.readexactly(length - len(head))
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the request body is over this server's limit of {limit} bytes for it")
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise BadRequest(f"the request body took longer than {served_.limits.body_timeout:g} s") from None
    except asyncio.IncompleteReadError:
        raise BadRequest("the request body ended before its Content-Length") from None


def json_items(body: bytes) -> int:
    """An upper bound of the elements of a JSON text: its ``[``, ``{`` and ``,``."""
    return body.count(b"[") + body.count(b"{") + body.count(b",")


def nested_deeper_than(body: bytes, limit: int) -> bool:
    """Whether a JSON text's arrays and objects nest more than ``limit``
    deep (brackets in its strings skipped; a text with at most ``limit``
    brackets is not scanned: it cannot be)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    for match in _NESTING.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def _parse(body: bytes, inline: bool) -> dict[str, Any]:
    if nested_deeper_than(body, MAX_JSON_DEPTH):
        raise BadRequest(f"the request body's JSON is nested more than {MAX_JSON_DEPTH} deep")
    try:
        text = body.decode("utf-8")
        if inline:
            doc = json.loads(text)
        else:
            decoder = json.JSONDecoder()
            decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
            doc = decoder.decode(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise BadRequest("the request body's JSON is nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(doc).__name__}")
    return doc


async def parse_json(request: web.Request, served_: Served, convert: Callable[[dict[str, Any]], T]) -> T:
    """``convert`` of the JSON object of the body (module docstring: the
    bounds, and where it runs; ``convert`` may raise BadRequest)."""
    limits = served_.limits
    body = await read_body(request, served_, limits.max_json_bytes)
    items = json_items(body)
    if items > limits.max_json_items:
        raise PayloadTooLarge(f"the JSON body has about {items} elements, over this server's limit of "
                              f"{limits.max_json_items} (--max-json-items); send fewer at a time")
    if len(body) <= INLINE_JSON_BYTES:
        return convert(_parse(body, True))
    return await asyncio.get_running_loop().run_in_executor(None, lambda: convert(_parse(body, False)))


async def read_json(request: web.Request, served_: Served) -> dict[str, Any]:
    """The JSON object of the body (BadRequest when it is not one)."""
    return await parse_json(request, served_, lambda doc: doc)


def key_field(doc: dict[str, Any], name: str, *, nullable: bool = False) -> bytes | None:
    """A base64 key or value field of a JSON object; ``nullable``: null is
    allowed (an unbounded range end). A missing field is always an error: a
    ``delete_range`` without its bounds must not mean "everything"."""
    if name not in doc:
        raise BadRequest(f"missing field {name!r}" + (" (null for unbounded)" if nullable else ""))
    value = doc[name]
    if value is None:
        if nullable:
            return None
        raise BadRequest(f"field {name!r} must not be null")
    return b64decode(value, name)


def lsn_field(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name)
    if type(value) is not int or not 0 <= value <= MAX_LSN:
        raise BadRequest(f"field {name!r} must be an LSN (an integer >= 0), not {value!r}")
    return value
