"""A group: the entries one leader writes, fsyncs and hands to the log's hooks at once.

:mod:`wal.commit` forms groups; :mod:`wal.log_writer` writes them; the layer
above sees each in its hooks (:mod:`wal.hooks`), every payload with
the *context* its appender passed (the store passes the decoded operations,
so it never decodes what it just encoded).
"""

from __future__ import annotations

from typing import final

from wal.segment import Payload


@final
class Group:
    """One group as written: the entries with LSNs ``first_lsn ..`` in order,
    each payload with the context its appender passed (``None``: none).

    A plain final class, not a NamedTuple: one is made for every group, and
    compiled, making a NamedTuple goes through Python's ``__new__`` (0.27 us,
    a tenth of a raw append)."""

    __slots__ = ("contexts", "first_lsn", "payloads")

    def __init__(self, first_lsn: int, payloads: list[Payload], contexts: list[object]) -> None:
        self.first_lsn = first_lsn
        self.payloads = payloads  # bytes, or a tuple of pieces (see Log.append)
        self.contexts = contexts

    @property
    def last_lsn(self) -> int:
        return self.first_lsn + len(self.payloads) - 1

    def entries(self) -> list[tuple[int, Payload]]:
        """``[(lsn, payload), ...]``."""
        return list(zip(range(self.first_lsn, self.first_lsn + len(self.payloads)), self.payloads))

    def __repr__(self) -> str:
        return f"Group(first_lsn={self.first_lsn}, {len(self.payloads)} entries)"
