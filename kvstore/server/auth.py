"""Bearer tokens and roles of walkv's HTTP server.

The tokens file has one token a line, ``ROLE TOKEN`` (ROLE: ``read``,
``write`` or ``admin``); ``#`` starts a comment, blank lines are ignored. A
request carries ``Authorization: Bearer TOKEN``.

Tokens are held in memory only as SHA-256 digests: a memory dump or a
log of this object shows no token. A presented token is hashed and compared
with EVERY known digest by :func:`hmac.compare_digest` (constant time, and
no early exit), so the time an answer takes says nothing about how much of
a token was right. Roles are ordered: ``read`` < ``write`` < ``admin``; a
route needs one of them (:data:`READ`, :data:`WRITE`, :data:`ADMIN`) or none
(:data:`OPEN`: ``/healthz``, ``/readyz``).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from kvstore.client.wire import Forbidden, Unauthorized
from wal.errors import WalkvError

OPEN, READ, WRITE, ADMIN = 0, 1, 2, 3
ROLES = {"read": READ, "write": WRITE, "admin": ADMIN}
ROLE_NAMES = {v: k for k, v in ROLES.items()}


class TokensFileError(WalkvError, ValueError):
    """The tokens file is malformed (the message names the line, never the token)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class Tokens:
    """The known tokens, as (digest, role) pairs."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._known: list[tuple[bytes, int]] = []
        for role, token in pairs:
            if role not in ROLES:
                raise TokensFileError(f"unknown role {role!r} (one of read, write, admin)")
            self._known.append((_digest(token), ROLES[role]))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "Tokens":
        """Parse a tokens file (module docstring); errors name the file and line."""
        pairs: list[tuple[str, str]] = []
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                text = line.split("#", 1)[0].strip()
                if not text:
                    continue
                fields = text.split()
                if len(fields) != 2 or fields[0] not in ROLES:
                    raise TokensFileError(f"{os.fspath(path)} line {number}: expected `ROLE TOKEN` with ROLE one "
                                          f"of read, write, admin (the line is not shown: it may hold a token)")
                pairs.append((fields[0], fields[1]))
        if not pairs:
            raise TokensFileError(f"{os.fspath(path)} holds no token; every request would get 401")
        return cls(pairs)

    def __len__(self) -> int:
        return len(self._known)

    def __repr__(self) -> str:
        return f"<Tokens: {len(self._known)} tokens>"

    def identify(self, header: str | None) -> tuple[int, int] | None:
        """``(index, role)`` of the token in an ``Authorization`` header (its
        place among the known tokens, which tells the clients of one token
        apart from another's), or None. The scheme is case-insensitive
        (RFC 7235): ``Bearer``, ``bearer``, ``BEARER``."""
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = _digest(token.strip())
        found = None
        for index, (known, known_role) in enumerate(self._known):  # every digest, always: no early exit
            if hmac.compare_digest(known, digest):
                found = (index, known_role)
        return found

    def role_of(self, header: str | None) -> int | None:
        """The role of the token in an ``Authorization`` header, or None."""
        found = self.identify(header)
        return None if found is None else found[1]

    def role_of_token(self, token: str) -> int | None:
        """The role of ``token`` itself (Redis's ``AUTH TOKEN``), or None."""
        found = self.identify(f"Bearer {token}")
        return None if found is None else found[1]

    def check(self, header: str | None, needed: int) -> int | None:
        """Unauthorized without a known token; Forbidden when its role is below
        ``needed``. Returns the token's index (:meth:`identify`; None when
        ``needed`` is OPEN: no token is looked at)."""
        if needed == OPEN:
            return None
        found = self.identify(header)
        if found is None:
            raise Unauthorized("this server needs `Authorization: Bearer TOKEN` with a token from its tokens file")
        index, role = found
        if role < needed:
            article = "an" if ROLE_NAMES[needed][0] in "aeiou" else "a"
            raise Forbidden(f"a {ROLE_NAMES[role]} token cannot do this; it needs {article} "
                            f"{ROLE_NAMES[needed]} token")
        return index
