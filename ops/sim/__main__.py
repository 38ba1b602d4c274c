"""``python -m ops.sim ...`` runs ``kvroute sim ...``."""

import sys

from ops.sim.cli import main

sys.exit(main())
