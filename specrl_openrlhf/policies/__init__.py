"""Reuse policies: one interface (`ReusePolicy`), a registry and the built-ins."""

from . import builtin  # noqa: F401  (registers the built-ins)
from .base import (
    DraftBatch,
    NoParams,
    ReusePolicy,
    check_lenience,
    first_rejection,
    lenient_acceptance_logprob,
    lenient_cut,
    short_name,
)
from .builtin import DEFAULT_LENIENCE, LenienceParams
from .registry import (
    PluginError,
    UnknownPolicyError,
    describe_policies,
    load_plugin,
    make,
    policy_class,
    register,
    registered,
)

__all__ = [
    "DEFAULT_LENIENCE",
    "DraftBatch",
    "LenienceParams",
    "NoParams",
    "PluginError",
    "ReusePolicy",
    "UnknownPolicyError",
    "check_lenience",
    "describe_policies",
    "first_rejection",
    "lenient_acceptance_logprob",
    "lenient_cut",
    "load_plugin",
    "make",
    "policy_class",
    "register",
    "registered",
    "short_name",
]
