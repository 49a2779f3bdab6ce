"""`python -m opwarden`: the same as the `opwarden` command."""

import sys

from opwarden.cli import main

sys.exit(main())
