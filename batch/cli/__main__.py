"""`python -m clarify.batch.cli ...`: the same as the `clarify` command."""

import sys

from clarify.batch.cli import main

sys.exit(main())
