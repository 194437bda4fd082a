"""The ``walkv`` command line: ``walkv --help`` lists the commands.

:mod:`kvstore.cli.main` parses arguments and maps errors to exit codes;
:mod:`kvstore.cli.common` holds what the command modules share. Commands:
:mod:`kvstore.cli.kv` (put, get, delete, scan, load), :mod:`kvstore.cli.stats`
(stats), :mod:`kvstore.cli.inspection` (inspect), :mod:`kvstore.cli.files`
(verify, repair), :mod:`kvstore.cli.admin` (snapshot, restore, export, bench)
and :mod:`kvstore.cli.demo` with :mod:`kvstore.cli.demo_work` and
:mod:`kvstore.cli.demo_report` (the main job);
:mod:`kvstore.cli.progress` draws progress bars.
"""

from kvstore.cli.main import main

__all__ = ["main"]
