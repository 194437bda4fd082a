"""The progress callback every long operation takes (replay, rebuild, repair,
snapshot, restore, export): ``progress(done, total)``, with ``total`` None
when it is not known in advance. The command line draws it as a bar
(:mod:`kvstore.cli.progress`)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[int, "int | None"], None]
