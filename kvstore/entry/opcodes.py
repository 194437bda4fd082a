"""The op codes of the entry format, their names, and the sets of them the
readers and the state machine test against. What each op is, and why, is
:mod:`kvstore.entry.codec`'s (the format's one description); every module
imports these from there."""

from __future__ import annotations

from typing import Final

OP_PUT: Final = 1
OP_DELETE: Final = 2
OP_DELETE_RANGE: Final = 3
OP_REQUIRE_EQUALS: Final = 4
OP_REQUIRE_ABSENT: Final = 5
OP_REQUIRE_PRESENT: Final = 6
OP_FAILED: Final = 7
OP_PUT_EXPIRING: Final = 8
OP_PUT_LEASED: Final = 9
OP_REQUIRE_LEASE: Final = 10
OP_GRANT: Final = 11
OP_KEEPALIVE: Final = 12
OP_REVOKE: Final = 13
OP_EXPIRE: Final = 14
OP_KEYSPACE: Final = 16
OP_DROP_KEYSPACE: Final = 17
OP_GROUP_PART: Final = 20
OP_GROUP_COMMIT: Final = 21
OP_GROUP_ABORT: Final = 22
OP_NAMES: Final = {OP_PUT: "put", OP_DELETE: "delete", OP_DELETE_RANGE: "delete_range",
                   OP_REQUIRE_EQUALS: "require_equals", OP_REQUIRE_ABSENT: "require_absent",
                   OP_REQUIRE_PRESENT: "require_present", OP_FAILED: "failed", OP_PUT_EXPIRING: "put_expiring",
                   OP_PUT_LEASED: "put_leased", OP_REQUIRE_LEASE: "require_lease", OP_GRANT: "grant",
                   OP_KEEPALIVE: "keepalive", OP_REVOKE: "revoke", OP_EXPIRE: "expire", OP_KEYSPACE: "keyspace",
                   OP_DROP_KEYSPACE: "drop_keyspace", OP_GROUP_PART: "group_part",
                   OP_GROUP_COMMIT: "group_commit", OP_GROUP_ABORT: "group_abort"}
"""Every op code of the format (the module docstring's) and its name: the one
full list, which whatever shows every op (``walkv inspect``) is held to."""
CONDITION_CODES: Final = frozenset((OP_REQUIRE_EQUALS, OP_REQUIRE_ABSENT, OP_REQUIRE_PRESENT, OP_REQUIRE_LEASE))
NO_WRITE_CODES: Final = CONDITION_CODES | {OP_FAILED}
"""Op codes that change nothing (a reader skips them; a batch starting with
``OP_FAILED`` applies nothing)."""
PUT_CODES: Final = frozenset((OP_PUT, OP_PUT_EXPIRING, OP_PUT_LEASED))
"""Op codes that set a key to a value (``[code, key, value, ...]``)."""
LEASE_CODES: Final = frozenset((OP_GRANT, OP_KEEPALIVE, OP_REVOKE))
"""Op codes that change a lease and no key (readers of changes skip them)."""
EXPIRY_CODES: Final = frozenset((OP_PUT_EXPIRING, OP_PUT_LEASED, OP_EXPIRE)) | LEASE_CODES
"""Op codes that read or write expiry metadata (:mod:`kvstore.state.expiry`)."""
MAX_LEASE_ID: Final = (1 << 63) - 1
KEYSPACE_CODES: Final = frozenset((OP_KEYSPACE, OP_DROP_KEYSPACE))
"""Op codes of keyspaces: a batch holding one is applied op by op, keyspace by keyspace."""

GROUP_CODES: Final = frozenset((OP_GROUP_PART, OP_GROUP_COMMIT, OP_GROUP_ABORT))
"""Op codes that head an entry of a staged group (a part, a commit, an abort)."""
GROUP_WRITE_CODES: Final = frozenset((OP_PUT, OP_DELETE, OP_DELETE_RANGE, OP_PUT_EXPIRING, OP_KEYSPACE,
                                      OP_DROP_KEYSPACE))
"""Op codes that may stand in a staged group (after its head op)."""
MAX_GROUP_ID_BYTES: Final = 64
MAX_APP_ID_CHARS: Final = 255

KEYSPACE_SECTION: Final = "ks:"
"""Keyspace ``name`` is the snapshot section ``ks:<name>`` (the default keyspace is the default section)."""

# What a change is called, wherever changes are shown (the Spark ``changes``
# table's ``_change_type``, :meth:`kvstore.KVStore.watch`): named once, here.
UPSERT: Final = "upsert"
DELETE: Final = "delete"
DELETE_RANGE: Final = "delete_range"
EXPIRE: Final = "expire"
CHANGE_NAMES: Final = {OP_PUT: UPSERT, OP_PUT_EXPIRING: UPSERT, OP_PUT_LEASED: UPSERT, OP_DELETE: DELETE,
                OP_EXPIRE: EXPIRE, OP_DELETE_RANGE: DELETE_RANGE}
"""The change each op code that changes keys is shown as (codes not here change none)."""
