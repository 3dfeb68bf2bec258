"""Reuse policies: one interface (`ReusePolicy`), a registry and the built-ins."""

from ..references import short_name
from . import builtin, speculative  # noqa: F401  (registers the built-ins)
from .base import (
    DraftBatch,
    NoParams,
    ReusePolicy,
    check_lenience,
    first_rejection,
    lenient_acceptance_logprob,
    lenient_cut,
)
from .builtin import DEFAULT_LENIENCE, LenienceParams
from .registry import (
    PluginError,
    UnknownPolicyError,
    builtin_names,
    describe_policies,
    lenient_builtins,
    load_plugin,
    make,
    policy_class,
    register,
    registered,
    takes_lenience,
)
from .steered import SteeredLenience, check_steering

__all__ = [
    "DEFAULT_LENIENCE",
    "DraftBatch",
    "LenienceParams",
    "NoParams",
    "PluginError",
    "ReusePolicy",
    "SteeredLenience",
    "UnknownPolicyError",
    "builtin_names",
    "check_lenience",
    "check_steering",
    "describe_policies",
    "first_rejection",
    "lenient_acceptance_logprob",
    "lenient_builtins",
    "lenient_cut",
    "load_plugin",
    "make",
    "policy_class",
    "register",
    "registered",
    "short_name",
    "takes_lenience",
]
