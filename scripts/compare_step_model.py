"""Our measured plain-PyTorch step curve against the kernel step model (`pricing.kernels`, aiconfigurator's vLLM
0.24.0 kernels) for the same shape, GPU and context: a markdown table per measured point (our ms, the model's ms with
each attention bound, their ratios to ours), then how much a 4-token step costs over a 1-token one at 128 and 512 rows
on each. Needs aiconfigurator-core (`pip install 'specrl-openrlhf[pricing]'`).

    python scripts/compare_step_model.py                                  # docs/gpu_step_h200.json
    python scripts/compare_step_model.py --curve curve.json --gpu h100    # another measured curve
    python scripts/compare_step_model.py --summary                        # and step times, KV capacities
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specrl_openrlhf.markdown import numbers, table
from specrl_openrlhf.pricing.kernels import GPUS, MODELS, KernelStepModel

ROOT = Path(__file__).resolve().parents[1]


def compare(curve: dict, gpu: str) -> list[str]:
    model, context = curve["shape"], int(curve["context"])
    bounds = {a: KernelStepModel.build(gpu, model, a) for a in ("once", "per_token")}
    ours = {(p["rows"], p["tokens"]): p["seconds"] for p in curve["curve"]}
    points = []
    for (rows, tokens), seconds in sorted(ours.items()):
        once, per_token = (bounds[a].time(rows, tokens, context) for a in ("once", "per_token"))
        points.append([rows, tokens, *(f"{t * 1e3:.2f}" for t in (seconds, once, per_token))])
        points[-1] += [f"{once / seconds:.2f}", f"{per_token / seconds:.2f}"]
    head = ["rows", "tokens", "ours ms", "once ms", "per_token ms", "once / ours", "per_token / ours"]
    four_over_one = []
    for rows in (128, 512):
        if (rows, 1) in ours and (rows, 4) in ours:
            ratio = [bounds[a].time(rows, 4, context) / bounds[a].time(rows, 1, context) for a in bounds]
            four_over_one.append([rows, f"{ours[rows, 4] / ours[rows, 1]:.2f}", f"{ratio[0]:.2f}", f"{ratio[1]:.2f}"])
    return [
        f"{curve['device']} (ours, {curve.get('attention', '?')} attention) against {bounds['once'].source} on {gpu}, "
        f"{model}, context {context}",
        "",
        table(head, points, "right"),
        "",
        table(["rows", "ours t4/t1", "once t4/t1", "per_token t4/t1"], four_over_one, "right"),
    ]


def summary(gpu: str, model: str) -> list[str]:
    once = KernelStepModel.build(gpu, model)
    steps = []
    for context in (512, 2048, 4096):
        for rows in (128, 512):
            steps.append([context, rows, *(f"{once.time(rows, tokens, context) * 1e3:.2f}" for tokens in (1, 4))])
    capacities = [[name, *(f"{KernelStepModel.build(g, name).kv_capacity_tokens:,}" for g in GPUS)] for name in MODELS]
    return [
        f"{model} on {once.device}, attention once",
        "",
        table(["context", "rows", "t=1 ms", "t=4 ms"], steps, "right"),
        "",
        "KV capacity (tokens)",
        "",
        table(["model", *GPUS], capacities, numbers(1, 1 + len(GPUS))),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curve", default=str(ROOT / "docs" / "gpu_step_h200.json"), help="a measured step curve")
    parser.add_argument("--gpu", choices=list(GPUS), default="h200", help="the GPU the curve was measured on")
    parser.add_argument("--summary", action="store_true", help="also qwen3-8b on h100 and every KV capacity")
    args = parser.parse_args(argv)
    lines = compare(json.loads(Path(args.curve).read_text()), args.gpu)
    if args.summary:
        lines += ["", *summary("h100", "qwen3-8b")]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
