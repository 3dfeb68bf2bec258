"""`python -m specrl_openrlhf.grid`: the ablation grid, one OpenRLHF (or quickstart) command per cell, run or
printed (`analysis.grid`)."""

import sys

from .analysis.grid import main

if __name__ == "__main__":
    sys.exit(main())
