"""SPEC-RL for OpenRLHF: speculative rollouts that reuse the previous epoch's responses as drafts.

The package's top level and `policies/` are the engine-free core (torch and numpy only); `request_path/` is the
engine-free request path, `analysis/` the offline tools, `integration/` what touches vLLM, Ray and OpenRLHF, and
`miniature/` the paper's experiments on CPU (docs/design.md, "Layers"). The names below load their module on first
access, so `python -m specrl_openrlhf.grid` or `.report` costs no torch import.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Draft": "draft",
    "DraftCache": "cache",
    "prompt_key": "cache",
    "ReuseConfig": "config",
    "ReuseStats": "metrics",
    "DEFAULT_LENIENCE": "params",
    "check_fields": "params",
    "limits": "params",
    "DraftBatch": "policies",
    "PluginError": "policies",
    "ReusePolicy": "policies",
    "SteeredLenience": "policies",
    "UnknownPolicyError": "policies",
    "describe_policies": "policies",
    "load_plugin": "policies",
    "make": "policies",
    "register": "policies",
    "registered": "policies",
    "SampleOutput": "request_path.assembly",
    "SpeculativePlanner": "request_path.planner",
    "UnsupportedSamplingError": "policies.sampling",
    "check_sampling": "policies.sampling",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    try:  # a submodule, as `sr.policies` in a plugin file
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
    return sorted([*globals(), *_EXPORTS])
