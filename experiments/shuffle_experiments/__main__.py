"""``python -m shuffle_experiments``: the ``shuffle-experiment`` command."""

import sys

from .cli import main

sys.exit(main())
