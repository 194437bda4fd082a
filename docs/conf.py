"""Sphinx configuration: the API reference from the docstrings (``make docs``).

Sphinx's autodoc because the docstrings are reStructuredText with Sphinx roles
(:class:`~kvstore.KVStore`, :mod:`wal.log`, ``literal``); myst-parser reads the
Markdown pages (architecture.md). Warnings are errors (``sphinx-build -W``).

Built from the sources (``make docs`` sets ``WALKV_PURE=1``): mypyc 2.4 compiles
no docstring, so the compiled twins would leave the hot modules' pages empty.
What ``help()`` shows of a compiled install: :mod:`wal.compiled`, "Docstrings".
"""

from __future__ import annotations

import os
import sys

# Document this checkout, whatever walkv the interpreter has installed.
sys.path.insert(0, os.path.abspath(".."))

project = "walkv"
author = "walkv's authors"
copyright = "walkv's authors"  # noqa: A001 - Sphinx's name for it

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
# Arguments whose defaults are module-level objects show their names, not reprs.
autodoc_preserve_defaults = True
# Spark's modules import pyspark lazily; the reference never needs it.
autodoc_mock_imports = ["pyspark"]

myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "walkv"
html_theme_options = {"description": "an embedded write-ahead-log key-value database", "fixed_sidebar": True}


def _drop_field_aliases(app, what, name, obj, options, lines):
    """A NamedTuple's fields say "Alias for field number N": say nothing instead."""
    if lines and lines[0].startswith("Alias for field number") and not any(line.strip() for line in lines[1:]):
        lines.clear()


def setup(app):
    app.connect("autodoc-process-docstring", _drop_field_aliases)
