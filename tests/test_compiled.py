"""Which twin runs (wal/compiled.py): ``WALKV_PURE=1`` runs the sources even
where the mypyc extensions sit beside them, a source edited after the build runs
interpreted with a warning (never the stale extension), and ``build_info()``
says which. Each case runs in a fresh interpreter: the choice is made once, at
the first import of ``wal``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from wal.compiled import COMPILED_MODULES, MANIFEST, restore_docstrings, source_docstrings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = ("import json, wal, kvstore.state.machine as m, wal.record as r; "
         "print(json.dumps([wal.build_info(), r.__file__, m.__file__]))")


def probe(root: str, pure: bool = False) -> tuple[list[str], str]:
    """(build_info, wal.record's file, kvstore.state.machine's file) as a fresh
    interpreter with ``root`` first on its path sees them; and its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "WALKV_PURE"}
    env["PYTHONPATH"] = root
    if pure:
        env["WALKV_PURE"] = "1"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", PROBE], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def built(root: str) -> bool:
    return os.path.exists(os.path.join(root, "wal", MANIFEST))


def copy_tree(dest: str) -> str:
    """The three packages, extensions and manifest included (mypyc's shared library is wal/core__mypyc)."""
    for package in ("wal", "snapshot", "kvstore"):
        shutil.copytree(os.path.join(REPO, package), os.path.join(dest, package),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_pure_runs_the_sources_even_beside_the_extensions() -> None:
    (info, record, machine), _ = probe(REPO, pure=True)
    assert info == "pure Python (WALKV_PURE set)"
    assert record.endswith("record.py") and machine.endswith("machine.py")


def test_build_info_says_what_was_loaded() -> None:
    (info, record, machine), err = probe(REPO)
    if built(REPO):  # `pip install -e .` / `make` compiled this checkout: its extensions run
        assert info.startswith("compiled (mypyc "), (info, err)
        assert not record.endswith(".py") and not machine.endswith(".py")
    else:
        assert info == "pure Python (not compiled at install)"
        assert record.endswith("record.py")


def test_an_edited_source_runs_interpreted_with_a_warning(tmp_path) -> None:
    root = copy_tree(str(tmp_path))
    manifest = os.path.join(root, "wal", MANIFEST)
    if not built(root):  # an uncompiled checkout: a manifest as a build writes it, for sources that differ
        with open(manifest, "w") as f:
            json.dump({"mypyc": "0", "sources": {m: "0" * 64 for m in COMPILED_MODULES}}, f)
    else:
        (info, record, _), err = probe(root)  # the copy, unedited, runs compiled
        assert info.startswith("compiled (mypyc ") and not record.endswith(".py"), (info, err)
    edited = os.path.join(root, "kvstore", "state", "overlay.py")
    with open(edited, "a") as f:
        f.write("\n# edited after the build\n")
    (info, record, machine), err = probe(root)
    assert info == "pure Python (sources changed since the build)"
    assert record.endswith("record.py") and machine.endswith("machine.py")  # all of them, not the edited one alone
    assert "StaleBuildWarning" in err and edited in err and "pip install -e ." in err


def test_no_compiled_generator_yields_inside_an_except_block() -> None:
    """Compiled by mypyc 2.4, a generator that yields inside an ``except`` block
    leaves the caught exception as its caller's ``sys.exc_info()``: every later
    exception in that thread chains to it ("During handling of the above
    exception...") and its traceback keeps old frames alive. The interpreted
    twin does not, so no compiled module may yield there."""
    import ast

    found = []
    for module in COMPILED_MODULES:
        path = os.path.join(REPO, *module.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for handler in (n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler)):
            found += [f"{module}:{y.lineno}" for y in ast.walk(handler) if isinstance(y, (ast.Yield, ast.YieldFrom))]
    assert not found, found


def test_a_reader_stopped_at_damage_leaves_no_exception_behind() -> None:
    """The record reader yields the records before a damaged one, then raises:
    a caller that takes those and stops sees no exception left in
    ``sys.exc_info()``, and a new exception chains to nothing (it did, compiled,
    before the reader stopped yielding inside its ``except``)."""
    import io

    from wal.record import RecordWriter
    from wal.record_reader import RecordReader

    buf = io.BytesIO()
    writer = RecordWriter(buf, 0)
    for _ in range(5):
        writer.add_record(b"x" * 100)
    data = bytearray(buf.getvalue())
    data[3 * 107 + 10] ^= 0xFF  # inside the fourth record's payload
    batches = RecordReader(io.BytesIO(bytes(data))).batches()
    assert len(next(batches).payloads) == 3
    assert sys.exc_info() == (None, None, None)
    try:
        raise ValueError("after the reader stopped")
    except ValueError as e:
        assert e.__context__ is None


DOCS_PROBE = ("import json, wal, wal.log as log, kvstore.store.write_batch as wb; "
              "print(json.dumps([wal.build_info(), log.__doc__, wb.WriteBatch.__doc__]))")


def test_the_build_records_the_docstrings_mypyc_leaves_out() -> None:
    source = '"""The module."""\n\nclass A:\n    """The class."""\n\n    def f(self) -> None:\n' \
             '        """Not recorded: a method\'s __doc__ is read-only."""\n\nclass B:\n    pass\n'
    docs = source_docstrings(source)
    assert docs == {"": "The module.", "A": "The class."}
    module = types.ModuleType("m")
    exec(compile(source.replace('"""The module."""', "").replace('"""The class."""', ""), "m", "exec"),
         module.__dict__)
    assert module.__doc__ is None and module.A.__doc__ is None
    restore_docstrings(module, docs)
    assert module.__doc__ == "The module." and module.A.__doc__ == "The class." and module.B.__doc__ is None


def test_the_compiled_twins_give_help_their_module_and_class_docstrings() -> None:
    if not built(REPO):
        pytest.skip("this checkout is not compiled (make .venv/.compiled)")
    env = {k: v for k, v in os.environ.items() if k != "WALKV_PURE"}
    env["PYTHONPATH"] = REPO
    proc = subprocess.run([sys.executable, "-c", DOCS_PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    info, log_doc, batch_doc = json.loads(proc.stdout)
    assert info.startswith("compiled (mypyc ")
    with open(os.path.join(REPO, "wal", "log.py"), "rb") as f:
        assert log_doc == source_docstrings(f.read())[""]
    with open(os.path.join(REPO, "kvstore", "store", "write_batch.py"), "rb") as f:
        assert batch_doc == source_docstrings(f.read())["WriteBatch"]
