"""How ``walkv demo`` (:mod:`kvstore.cli.demo`) tells what it does: a
heading for each step (``[n/STEPS] ...``), indented lines under it, its
checks (``ok: ...``; one that fails stops the demo with
:class:`~kvstore.cli.demo_work.DemoFailed`, exit 1), and what it measured:
the closing table, and the same as JSON for ``--json``.
"""

from __future__ import annotations

import json
from typing import Any

from kvstore.cli.common import print_table
from kvstore.cli.demo_work import DemoFailed


class DemoReport:
    """The demo's output as it runs, and what it measured: ``rows`` for the
    closing table, ``data`` for ``--json``."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.rows: list[tuple[str, str]] = []
        self.data: dict[str, Any] = {}

    def step(self, n: int, text: str) -> None:
        print(f"\n[{n}/{self.steps}] {text}", flush=True)

    def say(self, text: str) -> None:
        print(f"      {text}", flush=True)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            raise DemoFailed(f"demo check failed: {what}")
        self.say(f"ok: {what}")

    def add(self, name: str, value: Any, text: str, label: str | None = None) -> None:
        """A measurement: ``value`` under ``name`` in the JSON, ``text`` in
        the table's row ``label`` (default: ``name`` in words)."""
        self.data[name] = value
        self.rows.append((label or name.replace("_", " "), text))

    def print_summary(self) -> None:
        print("\nsummary")
        print_table(self.rows)

    def write_json(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.data, fh, indent=2)
