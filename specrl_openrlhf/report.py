"""`python -m specrl_openrlhf.report`: the paper's tables and figures from finished runs (`analysis.report`)."""

import sys

from .analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
