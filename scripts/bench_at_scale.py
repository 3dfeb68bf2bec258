"""`lossless` at RL scale in the simulator: every rule's engine steps on a recorded corpus, priced on a GPU's step
curve with every cost (specrl_openrlhf/miniature/at_scale.py).

    python scripts/bench_at_scale.py                          # 512 rows, 32 prompts x 16 samples a step, the H200
    python scripts/bench_at_scale.py --rules off,lossless     # a first look

Prints a table per rule and one RESULT line: projected[RULE]=, proposer_us[RULE]=, kept[RULE]=.
"""

import sys

from specrl_openrlhf.miniature.at_scale import main

if __name__ == "__main__":
    sys.exit(main())
