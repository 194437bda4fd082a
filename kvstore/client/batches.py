"""A client batch's and transaction's operations as the JSON of
``/v1/batch`` and ``/v1/txn`` (docs/http-api.md): the batch and transaction
are the store's own classes (:class:`~kvstore.store.write_batch.WriteBatch`,
:class:`~kvstore.store.txn.Transaction`), whose ops, in the codec's format,
:func:`commit` sends; :class:`RemoteExpiry` is what they call for a put with
``ttl=`` or ``lease=``. The outcome of a transaction is recorded in its ops
as the store's log records it embedded, so the same classes report it."""

from __future__ import annotations

from typing import Any

import httpx

from kvstore.client.calls import Call, ServerInfo, json_body, lsn_of
from kvstore.client.wire import ConditionFailed, b64_or_none, b64encode
from kvstore.entry.codec import (
    END_OF_KEYS,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_KEYSPACE,
    OP_PUT,
    OP_PUT_EXPIRING,
    OP_PUT_LEASED,
    OP_REQUIRE_ABSENT,
    OP_REQUIRE_EQUALS,
    OP_REQUIRE_PRESENT,
)
from kvstore.entry.conditions import Outcome
from kvstore.store.expiring import expiring_put_op

_CONDITIONS = {OP_REQUIRE_EQUALS, OP_REQUIRE_ABSENT, OP_REQUIRE_PRESENT}


class RemoteExpiry:
    """What a client's batch or transaction (the store's own classes) calls
    for a put with ``ttl=`` or ``lease=`` (as embedded,
    :class:`kvstore.store.expiring.Expiring`): the arguments get the embedded
    checks, and the TTL stays relative. In a client's ops an
    ``OP_PUT_EXPIRING`` holds its TTL in microseconds, never an instant (such
    ops are never logged: :func:`ops_json` sends ``"ttl"`` in seconds, and the
    server's clock makes it an instant, as the writer's does embedded)."""

    def __init__(self, max_value: int) -> None:
        self._max_value = max_value

    def put_op(self, key: object, value: object, ttl: object, lease: object) -> list:
        return expiring_put_op(key, value, self._max_value, ttl, lease, 0)

    @staticmethod
    def check(ops: list, lsn: int) -> None:
        """Nothing: the server raised LeaseNotFoundError already."""


_WRITES = {OP_PUT: "put", OP_PUT_EXPIRING: "put", OP_PUT_LEASED: "put", OP_DELETE: "delete",
           OP_DELETE_RANGE: "delete_range"}


def ops_json(ops: list) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """A client batch's or transaction's ops (the codec's, :class:`RemoteExpiry`'s
    TTL puts) as the JSON of ``/v1/batch`` and ``/v1/txn``: the conditions,
    the writes, and the index in ``ops`` of each condition."""
    conditions: list[dict[str, Any]] = []
    writes: list[dict[str, Any]] = []
    placed: list[int] = []
    keyspace = ""
    for i, op in enumerate(ops):
        code = op[0]
        if code == OP_KEYSPACE:
            keyspace = op[1]
            continue
        doc: dict[str, Any]
        if code in _CONDITIONS:
            doc = {"key": b64encode(op[1])}
            if code == OP_REQUIRE_EQUALS:
                doc["equals"] = b64encode(op[2])
            else:
                doc["absent" if code == OP_REQUIRE_ABSENT else "present"] = True
            conditions.append(doc)
            placed.append(i)
        elif code in _WRITES:
            doc = {"op": _WRITES[code]}
            if code == OP_DELETE_RANGE:
                doc["start"] = b64_or_none(op[1] or None)
                doc["end"] = None if op[2] == END_OF_KEYS else b64encode(op[2])
            else:
                doc["key"] = b64encode(op[1])
                if code != OP_DELETE:
                    doc["value"] = b64encode(op[2])
                if code == OP_PUT_EXPIRING:
                    doc["ttl"] = op[3] / 1e6
                elif code == OP_PUT_LEASED:
                    doc["lease"] = op[3]
            writes.append(doc)
        else:
            raise ValueError(f"not a write operation: {op!r}")
        if keyspace:
            doc["keyspace"] = keyspace
    return conditions, writes, placed


def commit(ops: list, info: ServerInfo | None = None) -> Call[int]:
    """Log ``ops`` (a batch's, or a transaction's :class:`Outcome`, whose
    conditions come first); the answer is the entry's LSN, and a
    transaction's outcome is recorded in ``ops``."""
    conditions, writes, placed = ops_json(ops)
    if not isinstance(ops, Outcome):
        return Call("POST", "/v1/batch", lsn_of, json=json_body({"ops": writes}, info, "batch"))

    def held(response: httpx.Response) -> int:
        ops.decided, ops.failed = True, None
        lsn = response.json()["lsn"]
        return int(lsn) if lsn is not None else 0

    def failed(exc: Exception) -> int:
        assert isinstance(exc, ConditionFailed)
        ops.decided, ops.failed = True, None if exc.failed is None else placed[int(exc.failed)]
        return int(exc.lsn) if exc.lsn is not None else 0

    return Call("POST", "/v1/txn", held, json=json_body({"conditions": conditions, "ops": writes}, info,
                                                        "transaction"),
                expected=(ConditionFailed,), recover=failed)
