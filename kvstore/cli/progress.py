"""Progress bars and log output for the ``walkv`` command line.

The library reports long work (replay, verify, snapshot, restore, load,
export) through ``progress(done, total)`` callbacks and the ``walkv`` logger;
this module turns both into something a person can read:

* in a terminal (stderr is a TTY and ``--quiet`` was not given): a rich
  progress bar per task, transient, with the rate and time left;
* in a pipe, a file or CI: nothing at all for progress, so that stdout stays
  machine-readable and logs stay short. Warnings from the library still go to
  stderr, one line each, prefixed ``walkv:``.

rich is optional (the ``cli`` extra); without it the bars are skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Self, TextIO

ProgressFn = Callable[[int, "int | None"], None]


def interactive(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stderr) is a terminal and not disabled by
    ``WALKV_NO_PROGRESS`` or ``TERM=dumb``."""
    stream = stream if stream is not None else sys.stderr
    if os.environ.get("WALKV_NO_PROGRESS") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Reporter:
    """Makes progress callbacks for named tasks.

    ``with reporter.task("replay", unit="entries") as progress: work(progress=progress)``.
    When the reporter is disabled, ``progress`` is a cheap no-op. Callbacks may
    come from any thread; updates are throttled to ~10 per second.
    """

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = interactive() if enabled is None else enabled
        self._progress: Any = None  # a rich Progress (rich is optional, so not named here)
        self._lock = threading.Lock()
        if self.enabled:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TaskProgressColumn,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )
            except ImportError:  # pragma: no cover - rich is in the cli extra
                self.enabled = False
            else:
                self._progress = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    TaskProgressColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.fields[unit]}"),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=Console(stderr=True),
                    transient=True,
                    # stdout carries data (`walkv scan > file`): never send it
                    # to the terminal. Log lines on stderr go above the bars.
                    redirect_stdout=False,
                    redirect_stderr=True,
                )
        self._active = 0
        self._entered = False

    def __enter__(self) -> Self:
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered = False
        with self._lock:
            if self._progress is not None and self._active:
                self._active = 0
                self._progress.stop()

    @contextlib.contextmanager
    def task(self, description: str, total: int | None = None, unit: str = "") -> Iterator[ProgressFn]:
        """A progress callback ``(done, total)`` for one piece of work; the bar
        disappears when the block ends."""
        if self._progress is None:
            yield _noop
            return
        bar = self._progress
        with self._lock:
            # The live display runs only while a task does, so that what the
            # command prints between tasks goes out plainly.
            if self._active == 0:
                bar.start()
            self._active += 1
            task_id = bar.add_task(description, total=total, unit=unit)
        last = [0.0]

        def progress(done: int, total: int | None = None) -> None:
            now = time.monotonic()
            finished = total is not None and done >= total
            if not finished and now - last[0] < 0.1:
                return
            last[0] = now
            with self._lock:
                if total is not None:
                    bar.update(task_id, completed=done, total=total)
                else:
                    bar.update(task_id, completed=done)

        try:
            yield progress
        finally:
            with self._lock:
                bar.remove_task(task_id)
                self._active -= 1
                if self._active == 0:
                    bar.stop()

    def console_print(self, text: str) -> None:
        """Print a line above the bars (or plainly to stderr without them)."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)


def _noop(done: int, total: int | None = None) -> None:
    return None


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if record.exc_info and record.levelno >= logging.ERROR and logging.getLogger("walkv").level <= logging.DEBUG:
            text += "\n" + self.formatException(record.exc_info)
        return f"walkv: {text}"


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at the time, so that lines logged
    while a rich bar is showing go above it (rich redirects sys.stderr)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    """Send the ``walkv`` logger to stderr: warnings by default, info with
    ``-v``, debug with ``-vv``, errors only with ``--quiet``."""
    root = logging.getLogger("walkv")
    for h in list(root.handlers):
        if isinstance(h, _StderrHandler):  # set up before (main() run twice in one process)
            root.removeHandler(h)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    root.addHandler(handler)
    root.propagate = False
    if quiet:
        root.setLevel(logging.ERROR)
    elif verbose >= 2:
        root.setLevel(logging.DEBUG)
    elif verbose == 1:
        root.setLevel(logging.INFO)
    else:
        root.setLevel(logging.WARNING)
