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

from specrl_openrlhf.pricing.kernels import GPUS, MODELS, KernelStepModel

ROOT = Path(__file__).resolve().parents[1]


def compare(curve: dict, gpu: str) -> list[str]:
    model, context = curve["shape"], int(curve["context"])
    bounds = {a: KernelStepModel.build(gpu, model, a) for a in ("once", "per_token")}
    lines = [
        f"{curve['device']} (ours, {curve.get('attention', '?')} attention) against {bounds['once'].source} on {gpu}, "
        f"{model}, context {context}",
        "",
        "| rows | tokens | ours ms | once ms | per_token ms | once / ours | per_token / ours |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ours = {(p["rows"], p["tokens"]): p["seconds"] for p in curve["curve"]}
    for (rows, tokens), seconds in sorted(ours.items()):
        once, per_token = (bounds[a].time(rows, tokens, context) for a in ("once", "per_token"))
        lines.append(
            f"| {rows} | {tokens} | {seconds * 1e3:.2f} | {once * 1e3:.2f} | {per_token * 1e3:.2f} "
            f"| {once / seconds:.2f} | {per_token / seconds:.2f} |"
        )
    lines += ["", "| rows | ours t4/t1 | once t4/t1 | per_token t4/t1 |", "|---:|---:|---:|---:|"]
    for rows in (128, 512):
        if (rows, 1) in ours and (rows, 4) in ours:
            ratio = [bounds[a].time(rows, 4, context) / bounds[a].time(rows, 1, context) for a in bounds]
            lines.append(f"| {rows} | {ours[rows, 4] / ours[rows, 1]:.2f} | {ratio[0]:.2f} | {ratio[1]:.2f} |")
    return lines


def summary(gpu: str, model: str) -> list[str]:
    once = KernelStepModel.build(gpu, model)
    lines = [
        f"{model} on {once.device}, attention once",
        "",
        "| context | rows | t=1 ms | t=4 ms |",
        "|---:|---:|---:|---:|",
    ]
    for context in (512, 2048, 4096):
        for rows in (128, 512):
            one, four = (once.time(rows, tokens, context) * 1e3 for tokens in (1, 4))
            lines.append(f"| {context} | {rows} | {one:.2f} | {four:.2f} |")
    lines += ["", "KV capacity (tokens)", "", "| model | " + " | ".join(GPUS) + " |", "|---|" + "---:|" * len(GPUS)]
    for name in MODELS:
        lines.append(
            f"| {name} | " + " | ".join(f"{KernelStepModel.build(g, name).kv_capacity_tokens:,}" for g in GPUS) + " |"
        )
    return lines


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
