"""``python -m gateway`` is ``tesla-gateway``."""

import sys

from gateway.cli import main

sys.exit(main())
