"""The dict face the store, its views and replicas share (:class:`Lookups`).

Not compiled with mypyc (:mod:`wal.compiled` lists what is): interpreted
classes (the store, replicas) derive from it as well as a compiled one (the
view), and a compiled base class would refuse interpreted subclasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


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
