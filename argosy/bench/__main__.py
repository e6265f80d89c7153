"""`python -m argosy.bench ...`: the same as `argosy bench ...`."""

import sys

from argosy.bench.cli import main

sys.exit(main())
