"""Every rule at RL scale in the simulator, priced where RL runs: a named GPU and model from measured vLLM kernels,
every row's context, every cost (specrl_openrlhf/at_scale/cli.py).

    python scripts/bench_at_scale.py                                   # the long corpus, Qwen3-8B on an H100
    python scripts/bench_at_scale.py --corpus short --model qwen3-1.7b --gpu h200
    python scripts/bench_at_scale.py --curve docs/gpu_step_h200.json   # on our measured PyTorch curve instead
    python scripts/bench_at_scale.py --map                             # every corpus x model x GPU: the fastest,
                                                                       # and its heatmap (--map-image PNG)
    python scripts/bench_at_scale.py --lenience-curve --corpus short   # spec@ℓ, ℓ = 1 .. ∞, beside the paper's
    python scripts/bench_at_scale.py --validate                        # the simulator against the real engine
    python scripts/bench_at_scale.py --rules off,spec@2,lossless,verify=requests,policies/prefix_cap.py:PrefixCap
                                             # any rules --rollout_reuse takes, in its spelling (plugins too)

Prints a table per rule, the fastest rule with the host measured and with it hidden, and one RESULT line (RULE: the
rule's spelling as given, `lossless,verify=requests` included): projected[RULE]=, projected_async[RULE]=,
breakeven_host_ms[RULE]=, kept[RULE]=, steps[RULE]=, forward_s[off]=, prefill_s[off]=, missing=, fastest=,
fastest_margin=, fastest_async=, fastest_async_margin= (the margin: the fastest rule's speedup over the runner-up's).
`--lenience-curve`'s RESULT line: kept_of_drafted[RULE]=, paper_kept[RULE]=, projected[RULE]=, projected_async[RULE]=,
breakeven_host_ms[RULE]= for each spec@ℓ.
"""

import sys

from specrl_openrlhf.at_scale.cli import main

if __name__ == "__main__":
    sys.exit(main())
