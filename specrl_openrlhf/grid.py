"""`python -m specrl_openrlhf.grid`: the ablation grid, one OpenRLHF (or quickstart) command per cell, run or
printed (`analysis.grid_run`)."""

import sys

from .analysis.grid_run import main

if __name__ == "__main__":
    sys.exit(main())
