"""``python -m server_toolkit.cli`` = ``fedsdk-server``."""

from . import main

main()
