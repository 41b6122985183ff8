"""``python -m shuffle_opacus.cli``: the ``shuffle-opacus`` command."""

import sys

from .command import main

sys.exit(main())
