"""SPEC-RL for OpenRLHF: speculative rollouts that reuse the previous epoch's responses as drafts.

The core (this package, minus `integration`) imports only torch and numpy, and only when used: the names below load
their module on first access, so `import specrl_openrlhf.grid` or `.report` costs no torch import.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Draft": "cache",
    "DraftCache": "cache",
    "prompt_key": "cache",
    "ReuseConfig": "config",
    "ReuseStats": "metrics",
    "DEFAULT_LENIENCE": "lenience",
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
    "SampleOutput": "assembly",
    "SpeculativePlanner": "rollout",
    "UnsupportedSamplingError": "sampling",
    "check_sampling": "sampling",
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
