"""``python -m bertfast``: the same as the ``bertfast`` command."""

import sys

from .cli import main

sys.exit(main())
