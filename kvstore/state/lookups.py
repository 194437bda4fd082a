"""The dict face the store, its views and replicas share (:class:`Lookups`),
and the writable one of the stores and keyspaces, embedded or remote
(:class:`MutableLookups`).

Not compiled with mypyc (:mod:`wal.compiled` lists what is): interpreted
classes (the store, replicas) derive from it as well as a compiled one (the
view), and a compiled base class would refuse interpreted subclasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Lookups:
    """The dict face the store, its views and replicas share: ``x[key]`` and
    ``key in x`` from ``x.get``; ``iter(x)``, ``keys()`` and ``items()`` from
    ``x.scan()``."""

    __slots__ = ()

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        raise NotImplementedError

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[bytes]:
        for key, _value in self.scan():
            yield key

    def keys(self) -> Iterator[bytes]:
        return iter(self)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return self.scan()

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """``[self.get(k, default) for k in keys]``, in one call (the store
        answers it in bulk)."""
        return [self.get(k, default) for k in keys]

    def __getitem__(self, key: bytes) -> bytes:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]  # any non-bytes key: get says why


class _Batch(Protocol):
    """What :meth:`MutableLookups.update` needs of a batch: ``update`` and, once committed, ``lsn``."""

    lsn: int | None

    def update(self, pairs: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]) -> Any: ...


class MutableLookups(Lookups):
    """:class:`Lookups` and the writes' dict face: ``x[key] = value`` from
    ``x.put``, ``del x[key]`` from ``x.get`` and ``x.delete``, ``x.update``
    from ``x.batch()``. Shared by the store and its keyspaces, embedded
    (:mod:`kvstore.store`) and remote (:mod:`kvstore.client`)."""

    __slots__ = ()

    def put(self, key: bytes, value: bytes) -> int:
        raise NotImplementedError

    def delete(self, key: bytes) -> int:
        raise NotImplementedError

    def batch(self) -> AbstractContextManager[_Batch]:
        raise NotImplementedError

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        """``del x[k]``: KeyError when ``k`` is absent (checked just before
        the delete is logged; a concurrent writer may race it)."""
        if self.get(key) is None:
            raise KeyError(key)
        self.delete(key)

    def update(self, pairs: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]) -> int | None:
        """Put every (key, value) of ``pairs`` (a mapping or an iterable of
        pairs) as ONE atomic batch; return its LSN (None if empty). The
        fastest way to load many pairs."""
        with self.batch() as b:
            b.update(pairs)
        return b.lsn
