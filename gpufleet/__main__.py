"""`python -m gpufleet`: the same entry point as the `gpufleet` command."""

import sys

from gpufleet.cli import main

sys.exit(main())
