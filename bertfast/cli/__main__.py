"""``python -m bertfast.cli``: the same as the ``bertfast`` command."""

import sys

from . import main

sys.exit(main())
