"""``python -m server_toolkit.cli`` = ``fedsdk-server``."""

import sys

from . import main

sys.exit(main())
