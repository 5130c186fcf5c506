"""`python -m seqserve.api.cli`: the `seqserve` command (as `python -m seqserve`)."""

import sys

from seqserve.api.cli import main

sys.exit(main())
