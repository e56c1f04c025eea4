"""`python -m flows.cli ...`: the `imagebench` command line (what the tests and benchmarks run)."""

import sys

from flows.cli import main

if __name__ == "__main__":
    sys.exit(main())
