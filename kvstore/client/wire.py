"""The wire format shared by walkv's HTTP server and its clients (docs/http-api.md).

* Keys and values in JSON are standard base64 (RFC 4648, with padding):
  :func:`b64encode`/:func:`b64decode`. In a path or a query parameter a key
  is percent-encoded bytes (:func:`quote`; the server decodes the raw target
  with :func:`urllib.parse.unquote_to_bytes`), so any byte string travels,
  ``/`` and ``%`` and non-UTF-8 bytes included.
* Every error answer is ``{"error": {"type", "message", ...fields}}``:
  :func:`error_body` makes it from an exception (the status from
  :data:`STATUS`, by the nearest class in the exception's MRO),
  :func:`raise_for_error` raises it again on the client as the same class,
  with the same attributes. The HTTP-only types (:class:`BadRequest`,
  :class:`NotFound`, ...) are defined here so that both ends share them.
* A watch change in JSON (:func:`change_json`, :func:`change_from_json`;
  the operations of a batch: :mod:`kvstore.client.batches`).
"""

from __future__ import annotations

import base64
import binascii
import builtins
import json
import urllib.parse
from typing import Any, NoReturn

import wal.errors
from kvstore.entry.codec import DELETE_RANGE
from kvstore.watch.watcher import Change
from wal.errors import RecordTooLargeError, WalkvError

MAX_GET_MANY = 10_000
"""Most keys of one ``POST /v1/get_many`` (clients ask in chunks of it)."""
MAX_PAGE = 10_000
"""Most items of one scan page (``limit``)."""

# -- HTTP-only error types -------------------------------------------------------


class HttpError(WalkvError):
    """An error only the HTTP face has (the request, not the store, is wrong)."""


class BadRequest(HttpError, ValueError):
    """400: bad JSON, bad base64, a bad parameter."""


class MethodNotAllowed(BadRequest):
    """405: the path is served, but not with this method (``allow``: the methods it takes)."""

    allow: str | None = None


class Unauthorized(HttpError):
    """401: no token, or not a token the server knows."""


class Forbidden(HttpError):
    """403: the token's role does not allow the request."""


class NotFound(HttpError):
    """404: no such key (``GET /v1/kv/{key}``), route, snapshot or subscription."""


class ConditionFailed(HttpError):
    """409: a transaction's condition did not hold. ``lsn``: the entry that
    recorded the attempt; ``failed``: the index of the first condition that
    did not hold."""

    lsn: int | None = None
    failed: int | None = None


class PayloadTooLarge(HttpError, RecordTooLargeError):
    """413: the request body is over the server's limit."""


class AnswerTooLarge(HttpError):
    """413: the answer would be over the server's answer budget
    (``--max-answer-bytes``); ``fits``: how many of the keys asked for fit
    (the client asks for those first, then for the rest)."""

    fits: int | None = None

    def __init__(self, message: str, *, fits: int | None = None) -> None:
        super().__init__(message)
        self.fits = fits


class NotSupportedRemotelyError(HttpError, NotImplementedError):
    """What a client of a server cannot do that the embedded store can
    (``view()``, ``write(payload)``, the store's files...): ``method`` names it."""

    method: str | None = None

    def __init__(self, method: str, why: str) -> None:
        super().__init__(f"{method} is not supported over HTTP: {why} (README: what the client can and cannot do)")
        self.method = method


class TooManyStreams(HttpError):
    """429: over the server's cap on open watch streams (or connections)."""


class InternalError(HttpError):
    """500: a bug in the server (its log has the traceback; the client never gets one)."""


class ServerUnavailable(HttpError):
    """The client could not reach the server, or the connection broke. For a
    write the outcome is unknown: the write may have been applied."""


class WriteOutcomeUnknown(ServerUnavailable, wal.errors.OutcomeUnknownError):
    """A write was sent and whether it was applied is unknown: the connection
    broke after it went out, or the server answered that it failed with the
    write in its log (:class:`~wal.errors.OutcomeUnknownError`). Read the key
    to find out; only an idempotent write is safe to send again as it is."""

    @classmethod
    def of(cls, exc: BaseException, method: str, path: str) -> "WriteOutcomeUnknown":
        return cls(f"{method} {path}: its outcome is unknown ({type(exc).__name__}: {exc}); it may or may not "
                   "have been applied: read the key to find out (a put or delete of one key may be sent again)")


# -- the status table -------------------------------------------------------------

STATUS: dict[type[BaseException], int] = {
    BadRequest: 400, ValueError: 400, TypeError: 400,
    Unauthorized: 401, Forbidden: 403, NotFound: 404, MethodNotAllowed: 405,
    ConditionFailed: 409, wal.errors.ReadOnlyError: 409, wal.errors.SnapshotError: 409,
    wal.errors.NotLeaderError: 421,
    wal.errors.LogGapError: 410, wal.errors.SubscriptionInvalidatedError: 410, wal.errors.ForkedHistoryError: 410,
    RecordTooLargeError: 413, PayloadTooLarge: 413, AnswerTooLarge: 413,
    wal.errors.LeaseNotFoundError: 404, wal.errors.KeyspaceLimitError: 409,
    TooManyStreams: 429,
    wal.errors.LogFailedError: 503, wal.errors.ArchiveError: 503, wal.errors.ClosedError: 503,
    wal.errors.ReplicaError: 503, wal.errors.CorruptionError: 503, wal.errors.LockedError: 503,
    ServerUnavailable: 503,
    InternalError: 500,
}
"""Status of an error answer, by exception class (the nearest in the MRO wins)."""

_TYPES: dict[str, type[BaseException]] = {
    name: cls for name, cls in vars(wal.errors).items()
    if isinstance(cls, type) and issubclass(cls, WalkvError)
}
_TYPES.update({cls.__name__: cls for cls in (
    HttpError, BadRequest, MethodNotAllowed, Unauthorized, Forbidden, NotFound, ConditionFailed, PayloadTooLarge,
    AnswerTooLarge, TooManyStreams, InternalError, ServerUnavailable, builtins.ValueError, builtins.TypeError)})
_BY_STATUS: dict[int, type[BaseException]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                              405: MethodNotAllowed, 409: ConditionFailed, 413: PayloadTooLarge, 429: TooManyStreams}
_SCALARS = (str, int, float, bool, type(None))


def status_of(exc: BaseException) -> int:
    """The HTTP status an exception answers with (500 for anything unknown: a bug)."""
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 500


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """``(status, {"error": {"type", "message", ...fields}})`` for ``exc``.
    The fields are the exception's attributes that are JSON scalars. An
    exception the table does not know is a bug: 500 ``InternalError``,
    whose message names only the exception's class (the server logs the rest)."""
    status = status_of(exc)
    if status == 500:
        return 500, {"error": {"type": "InternalError",
                               "message": f"internal error in the walkv server ({type(exc).__name__}); "
                                          f"this is a bug: the server's log has the details"}}
    name = next(cls.__name__ for cls in type(exc).__mro__ if _TYPES.get(cls.__name__) is cls)
    err: dict[str, Any] = {"type": name, "message": str(exc)}
    for key, value in vars(exc).items():
        if not key.startswith("_") and key not in err and isinstance(value, _SCALARS):
            err[key] = value
    return status, {"error": err}


def error_from_json(status: int, err: Any) -> BaseException:
    """The exception an error answer describes (the same class the server
    raised, with the same attributes)."""
    if not isinstance(err, dict):
        err = {}
    message = str(err.get("message") or f"HTTP {status}")
    cls = _TYPES.get(str(err.get("type")))
    if cls is None or status_of_class(cls) != status:
        cls = _BY_STATUS.get(status, ServerUnavailable if status in (502, 503, 504) else InternalError)
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    for key, value in err.items():
        if key not in ("type", "message") and isinstance(key, str):
            setattr(exc, key, value)
    return exc


def status_of_class(cls: type[BaseException]) -> int:
    for c in cls.__mro__:
        if c in STATUS:
            return STATUS[c]
    return 500


def raise_for_error(status: int, body: bytes) -> NoReturn:
    """Raise the exception of an error answer (``body``: its JSON)."""
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        text = body[:200].decode("utf-8", "replace")
        err = {"message": f"HTTP {status} from the server, not a walkv error answer: {text!r}"}
    raise error_from_json(status, err)


# -- encodings ---------------------------------------------------------------------


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: Any, what: str = "value") -> bytes:
    """Standard base64 with padding; anything else is :class:`BadRequest`."""
    if not isinstance(text, str):
        raise BadRequest(f"{what} must be a base64 string, not {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is not valid base64 (RFC 4648, with padding): {text[:40]!r}") from None


def b64_or_none(data: bytes | None) -> str | None:
    return None if data is None else b64encode(data)


def quote(key: bytes) -> str:
    """A key for a path or a query parameter: every byte but unreserved ones percent-encoded."""
    return urllib.parse.quote_from_bytes(key, safe="")


def change_json(change: Change, index: int) -> dict[str, Any]:
    """A watch change as the stream's JSON (``index``: its place in its
    batch). A delete_range from the first key has ``key`` null (and one to
    the last, ``end_key`` null, as the change's ``end_key`` None)."""
    key = None if change.op == DELETE_RANGE and not change.key else b64encode(change.key)
    return {"lsn": change.lsn, "op": change.op, "key": key, "value": b64_or_none(change.value),
            "end_key": b64_or_none(change.end_key), "time": change.time, "index": index,
            "keyspace": change.keyspace}


def change_from_json(data: dict[str, Any]) -> Change:
    end = data.get("end_key")
    value = data.get("value")
    return Change(int(data["lsn"]), int(data.get("time") or 0), str(data["op"]), b64decode(data.get("key") or ""),
                  None if value is None else b64decode(value), None if end is None else b64decode(end),
                  str(data.get("keyspace") or ""))


__all__ = [
    "AnswerTooLarge", "BadRequest", "ConditionFailed", "Forbidden", "HttpError", "InternalError", "MethodNotAllowed",
    "NotFound", "NotSupportedRemotelyError", "PayloadTooLarge", "ServerUnavailable", "STATUS", "TooManyStreams", "Unauthorized", "b64decode", "b64encode", "change_from_json",
    "change_json", "error_body", "error_from_json", "quote", "raise_for_error",
]
