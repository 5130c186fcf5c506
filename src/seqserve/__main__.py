"""`python -m seqserve`: the `seqserve` command."""

import sys

from seqserve.api.cli import main

sys.exit(main())
