"""``python -m bench`` runs the CLI."""

import sys

from bench.cli.app import main

sys.exit(main())
