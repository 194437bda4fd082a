"""Entry point of the benchmark child processes (see :func:`benchmarks.timing.in_child`).

``python -m benchmarks.child package.module:function '{"kw": ...}'`` calls the
function with the keyword arguments and prints its result dict (``ops``,
``seconds`` and extras, plus ``peak_rss_mb``) as one JSON line on stdout.

Peak RSS is the kernel's high-water mark of this process's own address space
(``VmHWM`` in /proc/self/status). ``ru_maxrss`` (getrusage, wait4) is *not*
used where VmHWM exists: Linux carries it across ``execve``, so a child
spawned by a parent holding 200 MB reports at least 200 MB whatever it does.
"""

from __future__ import annotations

import importlib
import json
import resource
import sys


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class AnonPeak:
    """Peak anonymous memory (RssAnon: heap, not file pages) while the block
    runs, sampled every ``interval`` seconds by a thread, in MiB.

    LMDB maps its file, so every page a scan touches counts in RSS (VmHWM)
    although it is page cache the kernel can drop; RssAnon is the memory the
    process itself allocated, the growth that matters for "bounded memory".
    """

    def __init__(self, interval: float = 0.005) -> None:
        import threading

        self.interval = interval
        self.start_mb = 0.0
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        kb = _status_kb("RssAnon:")
        if kb is not None:
            self.peak_mb = max(self.peak_mb, kb / 1024.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "AnonPeak":
        kb = _status_kb("RssAnon:")
        self.start_mb = self.peak_mb = (kb or 0) / 1024.0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def growth_mb(self) -> float:
        return self.peak_mb - self.start_mb


def peak_rss_mb() -> float:
    """Peak RSS of this process since its exec (VmHWM), in MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str]) -> int:
    target, args = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    result = fn(**args)
    result.setdefault("peak_rss_mb", peak_rss_mb())
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
