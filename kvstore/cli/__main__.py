"""``python -m kvstore.cli``: the same as the ``walkv`` command."""

import sys

from kvstore.cli.main import main

sys.exit(main())
