"""A vLLM engine step's GPU time from measured kernels: NVIDIA's aiconfigurator-core holds per-kernel timings taken in
vLLM 0.24.0 on H100, H200 and B200 (GEMMs, decode and prefill attention, norms); `KernelStepModel` sums them into one
step of a Qwen3 shape, as aiconfigurator's own step model does, and prices steps by context as well as by size.

Terminology:
- *step*: one forward of `rows` decoding rows, each carrying `tokens_per_row` tokens (1, or 1 + drafts in a
  verification step) and reading a KV cache of `context` tokens (those cached before the step, a mean per row),
  beside which prefill tokens may ride;
- *dense ops* (`layers`, `logits`): every op but attention (embedding, norms, the GEMMs, the activation; the logits
  GEMM apart), by the step's tokens m = rows x tokens_per_row (+ prefill tokens);
- *decode attention*: by rows and the KV length each row reads (its context plus the step's own tokens); the
  measured kernel has one query token a row;
- *prefill attention*: one sequence's `tokens` new tokens after `context` cached ones (aiconfigurator's context
  attention, with its QK-norm, RoPE and KV-write);
- *attention bound* (`attention`): how a verification step's t tokens a row read the cache. "once" (the default):
  each row reads its cache once, at context + t, as vLLM's FlashAttention kernels do with several queries a row (the
  KV read dominates; the extra queries ride in the same tiles), a lower bound. "per_token": t one-query rows, each
  reading the cache (rows x t rows at context + (t + 1) / 2), an upper bound;
- *KV capacity* (`kv_capacity_tokens`): the KV tokens vLLM's cache holds for the model on the GPU, at vLLM's default
  `gpu_memory_utilization` (`GPU_MEMORY_UTILIZATION`) or another share of the GPU's memory (`kv_capacity_at`);
- *eager* (`with_eager`): the kernels were timed inside CUDA graphs; an engine without them (`enforce_eager`) pays its
  launches on top (`eager.EagerLaunches`), which the model carries for whoever prices a whole step.

`build` tabulates each part once on a grid with aiconfigurator (seconds; cached in process), so that pricing is numpy
interpolation, and the model travels as JSON data (`as_data`, `from_data`) that needs no aiconfigurator to read.

Core module: numpy only (`build` imports aiconfigurator lazily).
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import math
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import linear
from .curves import HostCurve
from .eager import EagerLaunches
from .interpolation import line, plane

# Published config.json values (Hugging Face Qwen/Qwen3-*): hidden size, layers, query and key-value heads, head
# dim, MLP size, vocabulary, tied embeddings.
MODELS = {
    "qwen3-1.7b": dict(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, mlp=6144, vocab=151936, tied=True),
    "qwen3-8b": dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, mlp=12288, vocab=151936, tied=False),
    "qwen3-14b": dict(hidden=5120, layers=40, heads=40, kv_heads=8, head_dim=128, mlp=17408, vocab=151936, tied=False),
}
GPUS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}  # name -> aiconfigurator's system
DEVICES = {"h100": "NVIDIA H100", "h200": "NVIDIA H200", "b200": "NVIDIA B200"}
ATTENTION = ("once", "per_token")
VLLM_VERSION = "0.24.0"
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
# What vLLM keeps besides weights and KV: its profiled peak activations at the default token budget, the CUDA
# context and other non-torch allocations, CUDA graphs.
RESERVE_BYTES = 3 * 2**30
INSTALL = "pip install 'specrl-openrlhf[pricing]' (or pip install aiconfigurator-core==0.12.0)"

# Grids (aiconfigurator interpolates between its own measured points; past these, ours extend the last slope).
_TOKENS = np.unique(np.r_[1:17, 32:257:16, 384:4609:128, 5120, 6144, 8192, 12288, 16384, 24576, 32768, 65536])
_ROWS = np.array([0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096])
_KV = np.array([1, 16, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768])
_PREFILL = np.array([1, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384])
_PREFIX = np.array([0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
_GEMM_N = 65536  # the widest GEMM aiconfigurator measured
BUDGET_DRAFTS = 4.0  # a budget's per-token cost: the slope over this many drafts a row, a verification step's size
BUDGET_TOKENS = (1.0, 1.0 + BUDGET_DRAFTS)  # the tokens a row that slope is taken between


class KernelStepModel:
    """One engine step's GPU time on a GPU for a model, from tables of aiconfigurator's per-op timings (`build`) or
    their JSON data (`from_data`). Linear between grid points, the first point's value below a grid (a step of no
    tokens still launches every kernel: `time(0, 1, 0)` is the step's fixed cost), the last slope past it."""

    def __init__(self, data: dict, source: str = ""):
        where = source or "the kernel step model"
        try:
            dense, decode, prefill = data["dense"], data["decode_attention"], data["prefill_attention"]
            self.device, self.model = str(data["device"]), str(data["model"])
            self.attention, self.kv_capacity_tokens = str(data["attention"]), int(data["kv_capacity_tokens"])
            self.gpu_memory_bytes = float(data.get("gpu_memory_bytes", math.nan))  # NaN: data of an older build
            self.source = str(data.get("source") or where)
            self.tokens = np.array(dense["tokens"], np.float64)  # [M]
            self.layers = np.array(dense["layers"], np.float64)  # [M] seconds of the dense ops but logits
            self.logits = np.array(dense["logits"], np.float64)  # [M]
            self.rows = np.array(decode["rows"], np.float64)  # [R]
            self.kv = np.array(decode["kv"], np.float64)  # [K]
            self.decode = np.array(decode["seconds"], np.float64)  # [R, K]
            self.prefill_tokens = np.array(prefill["tokens"], np.float64)  # [P]
            self.prefill_context = np.array(prefill["context"], np.float64)  # [C]
            self.prefill = np.array(prefill["seconds"], np.float64)  # [P, C]
            host, eager = data.get("host"), data.get("eager")
            self.host = HostCurve.from_data(host, where) if host is not None else None
            self.eager = EagerLaunches.from_data(eager, where) if eager is not None else None
            self._budget_ends: dict[tuple, np.ndarray] = {}  # `budget_cost` at (rows, scale, a stretch's end)
        except (TypeError, KeyError, ValueError) as error:
            raise ValueError(
                f"{where}: not a kernel step model ({type(error).__name__}: {error}); KernelStepModel.build makes one"
            ) from None
        shapes_ok = (
            self.layers.shape == self.logits.shape == self.tokens.shape
            and self.decode.shape == (len(self.rows), len(self.kv))
            and self.prefill.shape == (len(self.prefill_tokens), len(self.prefill_context))
        )
        grids = (self.tokens, self.rows, self.kv, self.prefill_tokens, self.prefill_context)
        tables = (self.layers, self.logits, self.decode, self.prefill)
        if not shapes_ok or not all(g.ndim == 1 and len(g) >= 2 and np.all(np.diff(g) > 0) for g in grids):
            raise ValueError(f"{where}: a kernel step model's grids must rise and match its tables' shapes")
        if not all(np.all(np.isfinite(t)) and np.all(t >= 0) for t in tables) or self.attention not in ATTENTION:
            raise ValueError(
                f"{where}: a kernel step model needs finite, non-negative seconds and attention in {ATTENTION}"
            )
        self._dense = self.layers + self.logits  # [M] every op but attention
        shifts = [q if self.attention == "once" else (q + 1) / 2 for q in BUDGET_TOKENS]  # the KV read past context
        self._budget_points = sorted({float(kv) - shift for kv in self.kv[:-1] for shift in shifts})  # `_stretch`

    @classmethod
    def from_data(cls, data, source: str = "") -> KernelStepModel:
        """From `as_data`'s JSON object; malformed data is one ValueError naming `source`."""
        if not isinstance(data, dict):
            raise ValueError(f"{source or 'the kernel step model'}: not a kernel step model (a JSON object)")
        return cls(data, source)

    def as_data(self) -> dict:
        """The model as a JSON object `from_data` reads back."""
        return {
            "device": self.device,
            "model": self.model,
            "source": self.source,
            "attention": self.attention,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "dense": {"tokens": self.tokens.tolist(), "layers": self.layers.tolist(), "logits": self.logits.tolist()},
            "decode_attention": {"rows": self.rows.tolist(), "kv": self.kv.tolist(), "seconds": self.decode.tolist()},
            "prefill_attention": {
                "tokens": self.prefill_tokens.tolist(),
                "context": self.prefill_context.tolist(),
                "seconds": self.prefill.tolist(),
            },
            **({"host": self.host.as_data()} if self.host is not None else {}),
            **({"eager": self.eager.as_data()} if self.eager is not None else {}),
        }

    def kv_capacity_at(self, utilization: float) -> int:
        """KV tokens the cache holds when the engine takes `utilization` of the GPU's memory (vLLM's
        `gpu_memory_utilization`)."""
        if math.isnan(self.gpu_memory_bytes):
            raise ValueError(f"{self.source}: no GPU memory recorded, so no KV capacity at {utilization}: rebuild it")
        return kv_capacity_tokens(self.model, self.gpu_memory_bytes, utilization)

    def with_host(self, host: HostCurve | None) -> KernelStepModel:
        """This model with the engine's host time per step beside it (a fixed cost of a step in `budget_cost`)."""
        data = self.as_data()
        data.pop("host", None)
        return KernelStepModel({**data, **({"host": host.as_data()} if host else {})}, self.source)

    def with_eager(self, eager: bool) -> KernelStepModel:
        """This model for an engine without CUDA graphs (`eager`: vLLM's `enforce_eager`), its steps priced with
        their launches (`eager.EagerLaunches` for this model's layers, which `projection.step_costs` and
        `budget_cost` add), or for one with them (False)."""
        data = self.as_data()
        data.pop("eager", None)
        if eager and self.model not in MODELS:
            raise ValueError(f"{self.source}: no layer count for model {self.model!r}, so no eager launches")
        launches = {"eager": EagerLaunches(layers=MODELS[self.model]["layers"]).as_data()} if eager else {}
        return KernelStepModel({**data, **launches}, self.source)

    def with_attention(self, attention: str) -> KernelStepModel:
        """This model with a verification step's attention at `attention` (in ATTENTION): the same tables, priced as
        the other bound ("per_token": the upper bound of the engine path's verification steps)."""
        if attention not in ATTENTION:
            raise ValueError(f"unknown attention {attention!r}: choose one of {', '.join(ATTENTION)}")
        return KernelStepModel({**self.as_data(), "attention": attention}, self.source)

    def budget_cost(self, rows: int, scale: int = 1, context=None) -> np.ndarray:
        """[3] (base, per_row, per_token) that price a step of `rows` rows at `context` cached tokens a row as the
        model does at rows x `scale`, each row and draft slot standing for `scale` of the GPU's (`linear.budget_cost`,
        its slope over BUDGET_TOKENS tokens a row); the cache read and the host's time, where there is one, are part
        of the base. No context is refused, as by `time`.

        The proposer asks at every step, at a context that moves on: between the KV grid's points (shifted by the
        tokens a row that the slope reads) the price is linear in the context, so each such stretch's ends are priced
        once and the price read off their line (directly where the token slope, floored at 0, reaches 0 inside)."""
        if context is None:
            return linear.budget_cost(self, rows, scale, context, BUDGET_TOKENS)  # refused, as by `time`
        context = float(context)
        (low, high), ends = self._stretch(context), []
        for point in (low, high):  # priced once at every end, which the stretches on either side share
            key = (int(rows), int(scale), point)
            if key not in self._budget_ends:
                self._budget_ends[key] = linear.budget_cost(self, rows, scale, point, BUDGET_TOKENS)
            ends.append(self._budget_ends[key])
        if (ends[0][2] > 0) != (ends[1][2] > 0):  # the token slope reaches 0 inside: no line
            return linear.budget_cost(self, rows, scale, context, BUDGET_TOKENS)
        return ends[0] + (context - low) / (high - low) * (ends[1] - ends[0])

    def _stretch(self, context: float) -> tuple[float, float]:
        """The stretch of contexts around `context` over which `budget_cost` is linear, as its (low, high) ends: no
        KV length the price reads (context + an offset per tokens a row) crosses a grid point inside it, nor the
        grid's start (below which the price is flat); past the grid's last interval, stretches of its width."""
        points = self._budget_points
        i = bisect.bisect_right(points, context)
        if i == 0:
            return points[0] - 1.0, points[0]
        if i < len(points):
            return points[i - 1], points[i]
        width = max(float(self.kv[-1] - self.kv[-2]), 1.0)
        low = points[-1] + (context - points[-1]) // width * width
        return low, low + width

    @classmethod
    def build(cls, gpu: str, model: str, attention: str = "once") -> KernelStepModel:
        """The model of `model` on `gpu` (names in MODELS and GPUS), tabulated from aiconfigurator's vLLM 0.24.0
        kernels; needs aiconfigurator-core (the `pricing` extra)."""
        for flag, value, choices in (
            ("gpu", gpu, GPUS),
            ("model", model, MODELS),
            ("attention", attention, ATTENTION),
        ):
            if value not in choices:
                raise ValueError(f"unknown {flag} {value!r}: choose one of {', '.join(choices)}")
        return cls({**_tables(gpu, model), "attention": attention})

    def time(self, rows, tokens_per_row, context=None):
        """Seconds of the forward of steps of `rows` rows carrying `tokens_per_row` tokens each over `context` cached
        tokens a row (scalars or arrays, broadcast together): float for scalars, else an array."""
        if context is None:
            raise ValueError(f"{self.source}: a kernel step model prices by context: pass each row's cached tokens")
        r, q, c = (np.asarray(v, np.float64) for v in (rows, tokens_per_row, context))  # broadcast as they meet
        m = r * q  # tokens the dense ops carry: every position of a verification step needs its logits
        out = line(self.tokens, self._dense, m)
        if self.attention == "once":
            out = out + plane(self.rows, self.kv, self.decode, r, c + q)
        else:  # the t queries of a row see context + 1 .. context + t keys
            out = out + plane(self.rows, self.kv, self.decode, m, c + (q + 1) / 2)
        return float(out) if out.ndim == 0 else out

    def prefill_cost(self, tokens, rows=0.0, context=None, sequences=1.0, carried=None):
        """Seconds that `tokens` prefill tokens (of `sequences` sequences, evenly split, each after `context` cached
        ones: 0 where None) add to a step whose decoding rows (`rows` of them) carry `carried` tokens (None: one a
        row), scalars or arrays: the dense ops' marginal cost past the decoding tokens, and the sequences' attention
        (one launch's fixed cost for all); 0 where tokens is 0. Priced as aiconfigurator prices a mixed step: the
        prefill's attention a call of its own (vLLM's unified kernel may share one launch: an upper bound), and no
        logits for prefill positions (vLLM computes those only for a request's last prompt token; a request for
        prompt log-probs pays `logits_cost` for the rest). The attention is at least each sequence's cache read once,
        as a decode row reads it: the prefill table is one sequence's, and its fixed cost hides a short chunk's read
        of its context, which many sequences' reads can't hide."""
        context = 0.0 if context is None else context
        carried = rows if carried is None else carried
        values = (tokens, rows, context, sequences, carried)
        n, _, c, k, m = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in values))
        k = np.maximum(k, 1.0)
        dense = line(self.tokens, self.layers, m + n) - line(self.tokens, self.layers, m)
        one = plane(self.prefill_tokens, self.prefill_context, self.prefill, n / k, c)
        fixed = plane(self.prefill_tokens, self.prefill_context, self.prefill, np.ones_like(n), c)
        table = k * one - (k - 1) * fixed  # vLLM runs a step's prefills in one varlen call: one fixed cost
        read = plane(self.rows, self.kv, self.decode, k, c + n / k)  # each sequence's keys, read once
        out = np.where(n > 0, np.maximum(dense, 0.0) + np.maximum(table, read), 0.0)
        return float(out) if out.ndim == 0 else out

    def logits_cost(self, tokens):
        """Seconds of the logits GEMM over `tokens` positions more: what prompt log-probs add to a prefill."""
        n = np.asarray(tokens, np.float64)
        more = line(self.tokens, self.logits, n) - line(self.tokens, self.logits, np.zeros_like(n))
        out = np.where(n > 0, np.maximum(more, 0.0), 0.0)
        return float(out) if out.ndim == 0 else out


def kv_capacity_tokens(model: str, memory_bytes: float, utilization: float = GPU_MEMORY_UTILIZATION) -> int:
    """KV tokens vLLM's cache holds for `model` on a GPU of `memory_bytes`: what is left of its share of the memory
    (`utilization`, vLLM's `gpu_memory_utilization`) after the bf16 weights and RESERVE_BYTES, over each token's keys
    and values (bf16)."""
    s = MODELS[model]
    h, d = s["hidden"], s["head_dim"]
    layer = h * (s["heads"] + 2 * s["kv_heads"]) * d + s["heads"] * d * h + 3 * h * s["mlp"] + 2 * h + 2 * d
    weights = 2 * (s["layers"] * layer + (1 if s["tied"] else 2) * s["vocab"] * h + h)
    per_token = 2 * s["layers"] * s["kv_heads"] * d * 2
    return max(int((memory_bytes * utilization - weights - RESERVE_BYTES) // per_token), 0)


@contextmanager
def _quiet(name: str):
    """aiconfigurator warns of every fallback table it loads, none of which a dense Qwen3 reads."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@functools.lru_cache(maxsize=None)
def _tables(gpu: str, model: str) -> dict:
    """The tables of `model` on `gpu` as JSON data (no attention bound: the same tables serve both)."""
    try:
        from importlib import metadata, resources

        import yaml
        from aiconfigurator_core.sdk import common, operations
        from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"KernelStepModel.build needs aiconfigurator-core ({error.name}): {INSTALL}"
        ) from None
    s, system = MODELS[model], GPUS[gpu]
    config = {  # a Qwen3ForCausalLM config.json, which aiconfigurator reads from a model directory
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": s["hidden"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "intermediate_size": s["mlp"],
        "vocab_size": s["vocab"],
        "tie_word_embeddings": s["tied"],
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "torch_dtype": "bfloat16",
    }
    with _quiet("aiconfigurator_core"), tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        handle = EngineHandle.compile(folder, system, "vllm", backend_version=VLLM_VERSION, tp_size=1)
        names = [op[0] for op in handle.decode_step_per_op(1, 1, 2)]  # the decode op list, in order
        attention, logits = names.index("generation_attention"), names.index("generation_logits_gemm")
        dense = [i for i in range(len(names)) if i not in (attention, logits)]
        context_names = [op[0] for op in handle.evaluate_context_ops(list(range(len(names))), batch_size=1, s=1)]
        prefill = context_names.index("context_attention")
        # The logits GEMM (n = vocab) is wider than any measured (n <= 65536): priced as the widest measured one
        # scaled by vocab / 65536, as a GEMM's time at fixed m and k grows in proportion to n whether it reads its
        # weights (n x k) or computes (m x n x k); at n = 65536 it already fills every SM.
        wide = build_ops_json([operations.GEMM("logits", 1, _GEMM_N, s["hidden"], common.GEMMQuantMode.bfloat16)])

        def seconds(ops, **shape):  # aiconfigurator answers milliseconds, per op
            return sum(op[1] for op in ops(**shape)) / 1e3

        gen, ctx, adhoc = handle.evaluate_generation_ops, handle.evaluate_context_ops, handle.evaluate_ops_json
        layers = [seconds(gen, indices=dense, batch_size=int(m), s=1) for m in _TOKENS]  # [M]
        wide_logits = [seconds(adhoc, ops_json=wide, is_context=False, batch_size=int(m), s=1) for m in _TOKENS]
        decode = [[seconds(gen, indices=[attention], batch_size=int(r), s=int(k)) for k in _KV] for r in _ROWS[1:]]
        context = [
            [seconds(ctx, indices=[prefill], batch_size=1, s=int(n), prefix=int(p)) for p in _PREFIX] for n in _PREFILL
        ]
    memory = yaml.safe_load((resources.files("aiconfigurator_core") / "systems" / f"{system}.yaml").read_text())
    # Neighbouring measured shapes jitter by a few % (m = 16 tokens timed faster than m = 8): a step of more tokens,
    # rows or keys is priced at least as one of fewer, the running maximum along each axis.
    rise = np.maximum.accumulate
    decode = np.vstack([np.zeros(len(_KV)), decode])  # [R, K]: no decoding rows, no decode attention
    return {
        "device": DEVICES[gpu],
        "model": model,
        "source": f"aiconfigurator-core {metadata.version('aiconfigurator-core')}, vLLM {VLLM_VERSION} kernels",
        "kv_capacity_tokens": kv_capacity_tokens(model, float(memory["gpu"]["mem_capacity"])),  # nominal capacity
        "gpu_memory_bytes": float(memory["gpu"]["mem_capacity"]),
        "dense": {
            "tokens": _TOKENS.tolist(),
            "layers": rise(layers).tolist(),
            "logits": rise(np.array(wide_logits) * s["vocab"] / _GEMM_N).tolist(),
        },
        "decode_attention": {"rows": _ROWS.tolist(), "kv": _KV.tolist(), "seconds": rise(rise(decode, 0), 1).tolist()},
        "prefill_attention": {
            "tokens": _PREFILL.tolist(),
            "context": _PREFIX.tolist(),
            "seconds": rise(rise(np.array(context), 0), 1).tolist(),
        },
    }
