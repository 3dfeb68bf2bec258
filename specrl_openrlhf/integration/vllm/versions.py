"""Which engine the installed vLLM verifies drafts in, chosen in one place, and what neither engine can run.

Terminology:
- *V1 path* (vLLM <= 0.33): the V1 model runner calls a proposer on the host between steps. `lossless` is our
  `custom_class` proposer (`v1.proposer`), whose host time the step pays serially (vLLM turns async scheduling off
  for it); the peers are vLLM's V1 proposers (`suffix`: arctic-inference's suffix tree on the host).
- *V2 path* (vLLM >= 0.34, which has no V1 runner): speculators draft on the device. `lossless` is our speculator,
  registered as `HISTORY_SPECULATOR` by our general plugin (`v2.registration`) and built with `speculator_options`;
  the peers are vLLM's GPU speculators (`suffix`: `SuffixSpeculator`; `ngram`: `NgramGPUSpeculator`).
- *adaptive verification* (V2): vLLM sizes each row's verified draft from the speculator's confidences. It needs
  full CUDA graphs, no LoRA, no pipeline parallelism (`VllmConfig._validate_adaptive_verification`, vLLM 0.34);
  where it is off, every row verifies its k draft tokens.

`engine_path(kwargs)` reads the installed vLLM and an engine's arguments into an `EnginePath`: its engine-free
`EngineTarget` (what a rule's `engine_arguments` takes) and the start-up log's line. `check_settings` refuses, before
any engine starts, a setting that the installed vLLM's engine cannot run, naming the flag and the fix.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ...policies.base import EngineTarget, ReusePolicy
from ...policies.builtin import HISTORY_SPECULATOR
from ...policies.speculative import SpeculativeConfigError

V2_SINCE = (0, 34)  # the first vLLM without the V1 model runner, and with the V2 speculator registry
V2_RUNNER_SINCE = (0, 32)  # the first whose V2 runner takes our logits processor (0.29's runs every engine on V1)
SUPPORTED = ((0, 29), (0, 32), (0, 33), (0, 34))  # the minor versions we support (docs/install.md says what ran)
# keys of vLLM's speculative config that only one runner takes, and what to say where the other runs
V2_ONLY_KEYS = ("speculator_options", "enable_adaptive_verification", "suffix_decoding_corpus_tokens")
V1_ONLY_SUFFIX_KEYS = ("suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")  # no effect on the GPU's
RUNNERS = {"v1": "the V1 runner (vLLM <= 0.33)", "v2": "the V2 runner's speculators (vLLM >= 0.34)"}
ADAPTIVE_METHODS = (HISTORY_SPECULATOR, "suffix")  # ours and the peers' that give confidences (ngram: none)


def parse(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a vLLM version string ("0.34.0", "0.32.0+cpu", "0.35.0.dev12+g1234")."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if found is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    return tuple(int(part or 0) for part in found.groups())


@functools.cache
def installed() -> str:
    """The installed vLLM's version. Raises ImportError where vLLM is not installed."""
    import vllm

    return vllm.__version__


def runner_of(version: str) -> str:
    """ "v1" or "v2": the runner that verifies our drafts on vLLM `version`."""
    return "v2" if parse(version)[:2] >= V2_SINCE else "v1"


def adaptive_blockers(kwargs: dict, flags: dict[str, str] | None = None) -> list[str]:
    """Why an engine built with `kwargs` has no adaptive verification (empty: it may have it), each reason naming the
    setting as `flags` names it (e.g. {"enforce_eager": "--vllm.enforce_eager"}), else as the engine argument."""
    name = lambda key: (flags or {}).get(key, key)  # noqa: E731
    reasons = []
    if kwargs.get("enforce_eager"):
        reasons.append(f"{name('enforce_eager')}: no CUDA graphs")
    if kwargs.get("enable_lora"):
        reasons.append(f"{name('enable_lora')}: LoRA")
    if int(kwargs.get("pipeline_parallel_size") or 1) > 1:
        reasons.append(f"{name('pipeline_parallel_size')} {kwargs['pipeline_parallel_size']}: pipeline parallelism")
    compilation = kwargs.get("compilation_config")
    mode = compilation.get("cudagraph_mode") if isinstance(compilation, dict) else None
    mode = getattr(compilation, "cudagraph_mode", mode)
    if mode is not None and not str(getattr(mode, "name", mode)).upper().startswith("FULL"):
        reasons.append(
            f"{name('compilation_config')} cudagraph_mode {getattr(mode, 'name', mode)}: no full CUDA graphs"
        )
    return reasons


@dataclass(frozen=True)
class EnginePath:
    """The engine the installed vLLM runs for one engine's arguments."""

    version: str  # vLLM's
    target: EngineTarget
    blockers: tuple[str, ...] = ()  # why adaptive verification is off on V2 (empty: it is on)

    def line(self, policy: ReusePolicy) -> str | None:
        """The start-up log's line for a rule verified in the engine (None for any other)."""
        if not policy.verifies_in_engine:
            return None
        config = policy.engine_arguments(self.target).get("speculative_config", {})
        method = config.get("method")
        if self.target.runner == "v1":
            ngram = "V1 n-gram (prompt lookup on the host), host paid serially"
            if parse(self.version)[:2] >= V2_RUNNER_SINCE:  # where Triton runs, vLLM picks V2 for n-gram
                ngram = "vLLM's n-gram: the V2 runner's on the GPU where Triton runs, else V1's on the host"
            kind = {
                "custom_class": "V1 custom_class proposer, host paid serially",
                "suffix": "V1 suffix decoding (arctic-inference's tree on the host), host paid serially",
                "ngram": ngram,
            }.get(method, f"vLLM's {method}")
            return f"{policy.name}: vLLM {self.version}, {kind}"
        kind = {HISTORY_SPECULATOR: f"V2 speculator {HISTORY_SPECULATOR}", "suffix": "V2 SuffixSpeculator (GPU)"}
        kind = kind.get(method, f"V2 speculator {method}")
        on = bool(config.get("enable_adaptive_verification"))
        if not on and method not in ADAPTIVE_METHODS:
            return f"{policy.name}: vLLM {self.version}, {kind}, every row verifies k draft tokens"
        why = "" if on else f" ({'; '.join(self.blockers) or 'the config turns it off'})"
        return f"{policy.name}: vLLM {self.version}, {kind}, adaptive verification {'on' if on else 'off'}{why}"


def engine_path(kwargs: dict | None = None, flags: dict[str, str] | None = None, version: str | None = None):
    """The `EnginePath` of an engine built with `kwargs` on vLLM `version` (default: the installed one; ImportError
    where there is none); `flags` name the settings in the reasons, as `adaptive_blockers`."""
    version = installed() if version is None else version
    runner = runner_of(version)
    blockers = tuple(adaptive_blockers(kwargs or {}, flags)) if runner == "v2" else ()
    return EnginePath(
        version, EngineTarget(runner=runner, adaptive_verification=runner == "v2" and not blockers), blockers
    )


def check_settings(policy: ReusePolicy, path: EnginePath) -> None:
    """Raises `SpeculativeConfigError` where the rule's engine arguments ask the installed vLLM for what its engine
    cannot run, naming the setting and the fix (before any engine starts, never inside one)."""
    config = policy.engine_arguments(path.target).get("speculative_config")
    if not config:
        return
    wanted = getattr(getattr(policy, "params", None), "engine", "auto")  # a rule may name the runner it was priced on
    if wanted in RUNNERS and wanted != path.target.runner:
        raise SpeculativeConfigError(
            f"--rollout_reuse {policy.name}: engine={wanted} is {RUNNERS[wanted]}, and vLLM {path.version} runs "
            f"{RUNNERS[path.target.runner]}: engine=auto, or install a vLLM that runs {wanted}"
        )
    setting = f"--rollout_reuse {policy.name}: speculative_config"
    method = config.get("method")
    if path.target.runner == "v1":
        for key in V2_ONLY_KEYS:
            if config.get(key):
                raise SpeculativeConfigError(
                    f"{setting}.{key} is vLLM >= 0.34's (its V2 speculators); vLLM {path.version} runs the V1 runner: "
                    "remove it, or install vLLM 0.34"
                )
        return
    if method == "custom_class":
        raise SpeculativeConfigError(
            f"{setting}.method 'custom_class' is the V1 runner's, which vLLM {path.version} no longer has: "
            f"--rollout_reuse lossless runs ours as the V2 speculator {HISTORY_SPECULATOR!r}; another proposer must "
            "be registered as a V2 speculator (vLLM's register_speculative_method), or install vLLM <= 0.33"
        )
    if method == "suffix":
        for key in V1_ONLY_SUFFIX_KEYS:
            if key in config:
                raise SpeculativeConfigError(
                    f"{setting}.{key} is V1 suffix decoding's; vLLM {path.version}'s GPU suffix speculator ignores "
                    "it (every row drafts num_speculative_tokens): remove it"
                )
    if config.get("enable_adaptive_verification") and path.blockers:
        raise SpeculativeConfigError(
            f"{setting}.enable_adaptive_verification needs full CUDA graphs, no LoRA and no pipeline parallelism, "
            f"which {'; '.join(path.blockers)} rules out: drop one of them"
        )
