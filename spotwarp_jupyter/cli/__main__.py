"""`python -m spotwarp_jupyter.cli`: the `spotwarp` command."""

import sys

from . import main

sys.exit(main())
