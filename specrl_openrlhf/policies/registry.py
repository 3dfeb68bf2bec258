"""Name -> policy registry, in the style of Gymnasium's `register`/`make`.

Rules come from three places: the built-ins and `register` calls, rule references (`path/rule.py:Class`,
`package.module:Class`) loaded on first use, and packages that advertise rules as entry points of the group
`specrl_openrlhf.policies` (`my_rule = my_package.rules:MyRule` in their metadata), loaded the first time their name
is asked for, in every process, so a team can ship its rules as a package.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import sys
from pathlib import Path

from ..references import is_reference
from .base import ReusePolicy

_REGISTRY: dict[str, type[ReusePolicy]] = {}
_ALIASES: dict[str, type[ReusePolicy]] = {}  # rule references (rule.py:Class) already loaded
ENTRY_POINT_GROUP = "specrl_openrlhf.policies"


class UnknownPolicyError(ValueError):
    """Raised by `make` for a name that is not registered."""


class PluginError(ValueError):
    """Raised when a policy plugin file can't be loaded."""


def register(name: str, *, override: bool = False):
    """Class decorator that registers a `ReusePolicy` subclass under `name`.

    >>> @register("my_rule")  # doctest: +SKIP
    ... class MyRule(ReusePolicy): ...
    """

    def decorator(cls: type[ReusePolicy]) -> type[ReusePolicy]:
        if not (isinstance(cls, type) and issubclass(cls, ReusePolicy)):
            raise TypeError(f"register({name!r}) decorates ReusePolicy subclasses, got {cls!r}")
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"register({name!r}): a rule's name is a non-empty string without ':'")
        if not dataclasses.is_dataclass(cls.Params) or not cls.Params.__dataclass_params__.frozen:
            raise TypeError(f"{cls.__name__}.Params must be a frozen dataclass")
        if name in _REGISTRY and _REGISTRY[name] is not cls and not override:
            raise ValueError(f"a reuse policy named {name!r} is already registered ({_REGISTRY[name].__name__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered() -> dict[str, type[ReusePolicy] | None]:
    """The registered policies, by name, in registration order, then the installed entry points' names (None until
    they are loaded)."""
    return {**_REGISTRY, **{name: None for name in entry_points() if name not in _REGISTRY}}


def entry_points() -> dict:
    """The rules installed packages advertise: {name: importlib.metadata.EntryPoint}."""
    from importlib.metadata import entry_points as installed

    return {point.name: point for point in installed(group=ENTRY_POINT_GROUP)}


def _load_entry_point(name: str) -> type[ReusePolicy] | None:
    point = entry_points().get(name)
    if point is None:
        return None
    package = getattr(point.dist, "name", "an installed package")
    where = f"--rollout_reuse {name}: the entry point {point.value} of {package}"
    try:
        cls = point.load()
    except Exception as error:  # a package may fail in any way; report it as the package's fault
        raise PluginError(f"{where} failed to load: {type(error).__name__}: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, ReusePolicy)):
        raise PluginError(f"{where} is not a ReusePolicy subclass (see policies/template.py)")
    if not dataclasses.is_dataclass(cls.Params) or not cls.Params.__dataclass_params__.frozen:
        raise PluginError(f"{where}: {cls.__name__}.Params must be a frozen dataclass")
    if name not in _REGISTRY:  # loading may have registered it already
        register(name)(cls)
    return _REGISTRY[name]


def policy_class(name: str) -> type[ReusePolicy]:
    """The class registered under `name`, or named by a rule reference `path/to/rule.py:Class` or
    `package.module:Class` (loaded on first use, in every process that asks). An unknown name suggests the closest
    one and lists the valid ones."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if is_reference(name):
        return rule_class(name)
    if isinstance(name, str) and (name.endswith(".py") or "/" in name):
        raise PluginError(
            f"--rollout_reuse {name}: the class name is missing; write path/to/rule.py:ClassName, naming the "
            "ReusePolicy subclass in the file (or load a file that registers names with --reuse.plugin FILE.py)"
        )
    from_package = _load_entry_point(name) if isinstance(name, str) else None
    if from_package is not None:
        return from_package
    names = list(registered())
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownPolicyError(
        f"unknown reuse policy {name!r}.{hint} Valid names: {', '.join(names)}. "
        f"A rule of your own: --rollout_reuse path/to/rule.py:ClassName (or package.module:ClassName), "
        f"or register names with --reuse.plugin FILE.py."
    )


def rule_class(reference: str) -> type[ReusePolicy]:
    """Load the `ReusePolicy` subclass a rule reference names. Errors name the reference and the fix."""
    if reference in _ALIASES:
        return _ALIASES[reference]
    flag = f"--rollout_reuse {reference}"
    target, _, attr = reference.rpartition(":")
    if not target or not attr.isidentifier():
        raise PluginError(f"{flag}: write a rule as path/to/rule.py:ClassName or package.module:ClassName")
    if target.endswith(".py"):
        module = _execute_file(Path(target), flag)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as error:
            raise PluginError(f"{flag}: cannot import {target} ({type(error).__name__}: {error})") from error
    cls = getattr(module, attr, None)
    if cls is None:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, ReusePolicy) and v is not ReusePolicy
        )
        raise PluginError(f"{flag}: {target} has no {attr!r}; the rules it defines: {', '.join(defined) or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, ReusePolicy)):
        raise PluginError(f"{flag}: {attr} is not a ReusePolicy subclass (see policies/template.py)")
    if not dataclasses.is_dataclass(cls.Params) or not cls.Params.__dataclass_params__.frozen:
        raise PluginError(f"{flag}: {attr}.Params must be a frozen dataclass")
    if cls not in _REGISTRY.values():  # not registered under a name of its own: it goes by its reference
        cls.name = reference
    _ALIASES[reference] = cls
    return cls


def make(name: str, **params) -> ReusePolicy:
    """Build the policy registered under `name` with keyword parameters, validated by its Params dataclass.

    Parameters the policy does not take are an error, a lenience for a rule without one included: it would be
    silently ignored.
    """
    cls = policy_class(name)
    accepted = {f.name for f in dataclasses.fields(cls.Params)}
    unknown = sorted(set(params) - accepted)
    if unknown == ["lenience"]:
        raise TypeError(
            f"reuse policy {name!r} takes no lenience; drop --lenience, or pick a lenient rule "
            f"({', '.join(lenient_builtins())})"
        )
    if unknown:
        raise TypeError(
            f"reuse policy {name!r} takes no parameter {', '.join(unknown)}; "
            f"its parameters are: {', '.join(sorted(accepted)) or 'none'}"
        )
    try:
        return cls(cls.Params(**params))
    except (TypeError, ValueError) as error:
        raise type(error)(f"reuse policy {name!r}: {error}") from None


def takes_lenience(name: str) -> bool:
    """Whether the rule `name` has a lenience parameter."""
    return "lenience" in {f.name for f in dataclasses.fields(policy_class(name).Params)}


def builtin_names() -> list[str]:
    """The rules this package ships, in registration order."""
    shipped = (f"{__package__}.builtin", f"{__package__}.speculative")
    return [name for name, cls in _REGISTRY.items() if cls.__module__ in shipped]


def lenient_builtins() -> list[str]:
    """The shipped rules that take a lenience: `spec`, `anchored`, `delayed`."""
    return [name for name in builtin_names() if takes_lenience(name)]


def describe_policies() -> str:
    """One line per registered policy, installed entry points included: name, parameters with defaults, what it
    does."""
    lines = []
    for name in registered():
        cls = policy_class(name)
        fields = [
            f"{f.name}={f.default!r}"
            if f.default is not dataclasses.MISSING
            else f"{f.name}={f.default_factory()!r}"
            if f.default_factory is not dataclasses.MISSING
            else f.name
            for f in dataclasses.fields(cls.Params)
            if f.init
        ]
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        flags = [] if cls.needs_scores else ["no scoring"]
        if cls.draft_age != 1:
            flags.append("no drafts" if cls.draft_age == 0 else f"drafts from {cls.draft_age} visits back")
        extra = f" [{'; '.join(flags)}]" if flags else ""
        origin = "" if cls.__module__.startswith(__package__) else f" (from {cls.__module__})"
        lines.append(f"{name:<10} ({', '.join(fields)}){extra}  {summary}{origin}")
    return "\n".join(lines)


def _execute_file(path: Path, flag: str):
    """Run a Python file as a module, once per process (Ray workers call this again and again)."""
    path = Path(path).expanduser().resolve()
    if path.suffix != ".py":
        raise PluginError(f"{flag}: a plugin must be a Python file ending in .py")
    if not path.is_file():
        raise PluginError(f"{flag}: no such file {path}; pass the path to a file like policies/template.py")
    module_name = "specrl_plugin_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    before = set(_REGISTRY)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # a plugin may fail in any way; report it as the plugin's fault
        for name in set(_REGISTRY) - before:
            del _REGISTRY[name]
        raise PluginError(f"{flag} failed to load: {type(error).__name__}: {error}") from error
    module._specrl_registered = [name for name in _REGISTRY if name not in before]
    sys.modules[module_name] = module
    return module


def load_plugin(path: str | Path) -> list[str]:
    """Execute a plugin file that registers policies and return the names it added.

    Safe to call again with the same file (in every Ray process, for example): it is executed once per process.
    """
    flag = f"--reuse.plugin {Path(path).expanduser().resolve()}"
    module = _execute_file(Path(path), flag)
    if not module._specrl_registered:
        raise PluginError(
            f"{flag} registered no policy; decorate a ReusePolicy subclass with "
            f"@specrl_openrlhf.register('name') (see policies/template.py), or name the class directly with "
            f"--rollout_reuse FILE.py:ClassName"
        )
    return list(module._specrl_registered)
