"""``python -m replayer.sim``: the same entry point as ``replayer sim``."""

import sys

from replayer.sim.cli import main

sys.exit(main())
