"""``python -m tesla_gateway`` is ``tesla-gateway``."""

import sys

from tesla_gateway.daemon.cli import main

sys.exit(main())
