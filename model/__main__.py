"""``python -m model ...``: see model/cli.py."""

import sys

from model.cli import main

sys.exit(main())
