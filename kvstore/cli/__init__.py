"""The ``walkv`` command line: ``walkv --help`` lists the commands.

:mod:`kvstore.cli.main` parses arguments and maps errors to exit codes;
:mod:`kvstore.cli.common` holds what the command modules share. Commands:
:mod:`kvstore.cli.kv` (put, get, delete, scan, load), :mod:`kvstore.cli.admin`
(stats, snapshot, restore, export, bench), :mod:`kvstore.cli.inspection`
(inspect), :mod:`kvstore.cli.files` (verify, repair) and
:mod:`kvstore.cli.demo` (the main job); :mod:`kvstore.cli.progress` draws
progress bars.
"""

from kvstore.cli.main import main

__all__ = ["main"]
