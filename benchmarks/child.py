"""Entry point of the benchmark child processes (see :func:`benchmarks.timing.in_child`).

``python -m benchmarks.child package.module:function '{"kw": ...}'`` calls the
function with the keyword arguments and prints its result dict (``ops``,
``seconds`` and extras) as one JSON line on stdout.
"""

from __future__ import annotations

import importlib
import json
import sys


def main(argv: list[str]) -> int:
    target, args = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    result = fn(**args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
