"""``python -m devkit.mutation``: run the targets, record them, write docs/mutation.md."""

from __future__ import annotations

import sys

from devkit.mutation.main import main

sys.exit(main(sys.argv[1:]))
