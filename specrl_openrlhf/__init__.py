"""SPEC-RL for OpenRLHF: speculative rollouts that reuse the previous epoch's responses as drafts.

The core (this package, minus `integration`) imports only torch and numpy.
"""

from .cache import Draft, DraftCache, prompt_key
from .config import ReuseConfig
from .metrics import ReuseStats
from .policies import (
    DEFAULT_LENIENCE,
    DraftBatch,
    PluginError,
    ReusePolicy,
    UnknownPolicyError,
    describe_policies,
    load_plugin,
    make,
    register,
    registered,
)
from .rollout import SampleOutput, SpeculativePlanner, UnsupportedSamplingError, check_sampling

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_LENIENCE",
    "Draft",
    "DraftBatch",
    "DraftCache",
    "PluginError",
    "ReuseConfig",
    "ReusePolicy",
    "ReuseStats",
    "SampleOutput",
    "SpeculativePlanner",
    "UnknownPolicyError",
    "UnsupportedSamplingError",
    "check_sampling",
    "describe_policies",
    "load_plugin",
    "make",
    "prompt_key",
    "register",
    "registered",
]
