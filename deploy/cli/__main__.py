"""``python -m deploy.cli`` = ``kvroute``."""

import sys

from deploy.cli.main import main

sys.exit(main())
