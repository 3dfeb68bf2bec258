"""`ReuseConfig`: everything a run needs to know about rollout reuse, validated on construction.

It is the one definition of our settings. Each field carries its command-line flag and help, and from them come the
argument group OpenRLHF's command and the quickstart add (`add_arguments`), the config of a parsed command line
(`from_namespace`), the flags a grid sets per cell (`cell_flags`) and the flag table of docs/usage.md
(`flags_markdown`, checked by a test). It imports no torch: the policies load when a config builds its rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .markdown import table
from .params import DEFAULT_LENIENCE, check_lenience, check_value
from .references import absolute_reference, spelled_rule

if TYPE_CHECKING:
    from .policies import ReusePolicy

GROUP_TITLE = "speculative rollouts (specrl-openrlhf)"
REUSED_LOGPROBS = ("auto", "scored", "draft")
SCORING_MODES = ("chunked", "full")


def json_object(text: str) -> dict:
    """argparse type of `--reuse.params`: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}); write e.g. '{{\"target_kept\": 0.9}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object; write e.g. '{{\"target_kept\": 0.9}}'")
    return value


def option(flag: str, default, help: str, *, shown: str | None = None, cell: bool = False, **argparse_kwargs):
    """A config field with its flag. `shown`: the default as the docs show it; `cell`: a grid sets it per cell."""
    kind = {"default_factory": default} if callable(default) else {"default": default}
    metadata = {"flag": flag, "help": help, "shown": shown, "cell": cell, "argparse": argparse_kwargs}
    return dataclasses.field(**kind, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class ReuseConfig:
    """Rollout-reuse settings (the `--rollout_reuse`, `--lenience` and `--reuse.*` flags), and the engine size
    OpenRLHF has no flag for (`--vllm.max_num_seqs`, `--vllm.max_num_batched_tokens`).

    >>> ReuseConfig(policy="spec", lenience=1.65).build_policy().describe()
    'spec(lenience=1.65)'
    """

    policy: str = option(
        "--rollout_reuse",
        "off",
        "reuse policy: {policies}, a plugin's name, or path/rule.py:Class (off = stock OpenRLHF)",
        cell=True,
        metavar="NAME",
    )
    lenience: float | None = option(
        "--lenience",
        None,
        f"lenience l > 0 of a lenient rule ({{lenient}}; default e^0.5 = {DEFAULT_LENIENCE:.4f}; paper: e^0.5 GRPO, "
        "e^0.3 PPO, e^0.15 DAPO); refused by rules without one",
        shown="the rule's (e^0.5)",
        cell=True,
        type=float,
        metavar="L",
    )
    params: dict = option(
        "--reuse.params",
        dict,
        "the rule's other parameters as JSON, e.g. '{\"target_kept\": 0.9}' (see its Params dataclass)",
        shown="{}",
        cell=True,
        type=json_object,
        metavar="JSON",
    )
    seed: int = option("--reuse.seed", 0, "seed of the acceptance randomness", type=int, metavar="N")
    reused_logprobs: str = option(
        "--reuse.logprobs",
        "auto",
        "rollout logprobs reported for reused tokens: scored (current policy), draft (the draft's own), auto (scored "
        "when the policy scores drafts)",
        choices=REUSED_LOGPROBS,
    )
    scoring: str = option(
        "--reuse.scoring",
        "chunked",
        "chunked: score drafts chunk by chunk up to the first rejection, reading the prompt from vLLM's prefix cache; "
        "full: each draft in one request that recomputes its prompt",
        choices=SCORING_MODES,
    )
    cache_max_gb: float = option(
        "--reuse.cache_max_gb", 6.0, "draft cache memory cap over all shards (LRU by prompt)", type=float, metavar="G"
    )
    cache_shards: int = option(
        "--reuse.cache_shards", 1, "draft cache actors; 4-8 for 1024 x 8 x 4096-token steps", type=int, metavar="N"
    )
    cache_dir: str | None = option(
        "--reuse.cache_dir",
        None,
        "start from the drafts saved here (default: the resumed checkpoint's, with --ckpt.load_enable)",
        shown="none",
        metavar="DIR",
    )
    plugins: tuple[str, ...] = option(
        "--reuse.plugin",
        tuple,
        "load the rules a file registers (repeatable); see policies/template.py",
        shown="none",
        action="append",
        metavar="FILE.py",
    )
    trace_dir: str | None = option(
        "--reuse.trace_dir",
        None,
        "record every cut draft here for `python -m specrl_openrlhf replay` (drafts are then scored whole)",
        shown="none",
        cell=True,
        metavar="DIR",
    )
    update_every: int | None = option(
        "--reuse.update_every",
        None,
        "samples per update of a rule that adapts (default: one step, rollout.batch_size x n_samples_per_prompt)",
        shown="one step",
        type=int,
        metavar="SAMPLES",
    )
    checkpoint_poll_s: float = option(
        "--reuse.checkpoint_poll_s",
        10.0,
        "how often the driver looks for a new checkpoint to save the drafts into",
        type=float,
        metavar="S",
    )
    max_num_seqs: int | None = option(
        "--vllm.max_num_seqs",
        None,
        "rows each vLLM engine decodes at a step (vLLM's max_num_seqs), for every engine OpenRLHF starts",
        shown="vLLM's (128 on OpenRLHF's engines)",
        type=int,
        metavar="N",
    )
    max_num_batched_tokens: int | None = option(
        "--vllm.max_num_batched_tokens",
        None,
        "tokens each vLLM engine computes at a step, draft tokens included (vLLM's max_num_batched_tokens), for "
        "every engine OpenRLHF starts: a rule verified in the engine drafting k tokens needs rows x (1 + k)",
        shown="vLLM's (2048 on OpenRLHF's engines)",
        type=int,
        metavar="N",
    )
    dry_run: bool = option(
        "--reuse.dry_run",
        False,
        "print the resolved configuration, OpenRLHF's arguments included, then exit before Ray starts",
        shown="off",
        action="store_true",
    )

    def __post_init__(self):
        if not isinstance(self.policy, str) or not self.policy:
            raise TypeError(f"--rollout_reuse must be a policy name or path/to/rule.py:ClassName, got {self.policy!r}")
        object.__setattr__(self, "policy", absolute_reference(self.policy))
        if self.lenience is not None:
            check_lenience("--lenience", self.lenience)
        if not isinstance(self.params, dict) or not all(isinstance(k, str) for k in self.params):
            raise TypeError(f"--reuse.params must be a JSON object of parameter names, got {self.params!r}")
        check_value("--reuse.logprobs", self.reused_logprobs, Literal[REUSED_LOGPROBS])
        check_value("--reuse.scoring", self.scoring, Literal[SCORING_MODES])
        check_value("--reuse.seed", self.seed, int, at_least=0)
        if self.update_every is not None:
            check_value("--reuse.update_every", self.update_every, int, at_least=1)
        check_value("--reuse.cache_max_gb", self.cache_max_gb, float, above=0, means="GiB")
        check_value("--reuse.cache_shards", self.cache_shards, int, at_least=1)
        check_value("--reuse.checkpoint_poll_s", self.checkpoint_poll_s, float, above=0, means="seconds")
        size = self.engine_size_arguments  # OpenRLHF's engines: our flags are `--vllm.` and vLLM's name
        for name, value in size.items():
            check_value(f"--vllm.{name}", value, int, at_least=1)
        if len(size) == 2 and size["max_num_batched_tokens"] < size["max_num_seqs"]:
            raise ValueError(
                f"--vllm.max_num_batched_tokens {self.max_num_batched_tokens} is below --vllm.max_num_seqs "
                f"{self.max_num_seqs}: vLLM refuses a step budget smaller than its rows; raise the first or lower the "
                "second"
            )
        object.__setattr__(self, "plugins", tuple(str(p) for p in self.plugins))

    @property
    def enabled(self) -> bool:
        return self.build_policy().draft_age > 0

    @property
    def engine_size_arguments(self) -> dict:
        """The engine arguments the `--vllm.*` flags of ours set (those given; vLLM's defaults for the others)."""
        named = {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens}
        return {name: value for name, value in named.items() if value is not None}

    @property
    def cache_max_bytes(self) -> int:
        return int(self.cache_max_gb * (1 << 30))

    def build_policy(self) -> ReusePolicy:
        """Load the plugins, then build the policy (unknown names and bad parameters raise here). A lenience given
        to a rule that has none is an error: it would be silently ignored."""
        from .policies import load_plugin, make

        for path in self.plugins:
            load_plugin(path)
        params = dict(self.params)
        if self.lenience is not None:
            params["lenience"] = self.lenience
        return make(self.policy, **params)

    def resolved(self, policy: ReusePolicy | None = None) -> ReuseConfig:
        """This config with the rule's parameters as the rule read them (`policy`: its rule, if built): a file a
        parameter names (`cost_curve`) is read once, where the run starts, and the processes the config is sent to
        get its data, not its path."""
        read = getattr(self.build_policy() if policy is None else policy, "params", None)
        if not dataclasses.is_dataclass(read):
            return self
        return dataclasses.replace(self, params={k: getattr(read, k, v) for k, v in self.params.items()})

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReuseConfig:
        data = json.loads(text)
        data["plugins"] = tuple(data.get("plugins", ()))
        return cls(**data)


# ---- a rule in one word: NAME[@LENIENCE][,key=value ...] (`references.spelled_rule`) ------------------------------


def parse_rule(text: str, lenience: float | None = None, flag: str = "--rollout_reuse") -> ReusePolicy:
    """A rule's spelling (`references.spelled_rule`: `spec@1.65`, `rules.py:Mine@2,decay=0.25`) -> a policy (the
    config validates it). A default `lenience` goes to the rules that take one. Errors name `flag` and the spelling."""
    from .policies import takes_lenience

    name, given, params = spelled_rule(text, flag)
    if given is not None:
        lenience = given
    elif lenience is not None and not takes_lenience(name):
        lenience = None
    return ReuseConfig(policy=name, lenience=lenience, params=params).build_policy()


def check_writable_folder(flag: str, folder) -> None:
    """Create `folder` if needed and write a probe file in it; a ValueError names the flag and the fix otherwise.
    Permission bits can't tell (root may "write" under /proc), so it writes."""
    from pathlib import Path

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".specrl-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise ValueError(
            f"{flag} {folder}: not a writable folder ({error.strerror or error}); pass another {flag}"
        ) from None


# ---- the flags, generated from the fields ------------------------------------------------------------------------


def flag_fields(names=None) -> list[dataclasses.Field]:
    """The fields of `ReuseConfig` (those named in `names`, in field order, when given)."""
    fields = dataclasses.fields(ReuseConfig)
    if names is None:
        return list(fields)
    unknown = set(names) - {f.name for f in fields}
    if unknown:
        raise ValueError(f"no ReuseConfig fields {sorted(unknown)}")
    return [f for f in fields if f.name in names]


def dest(field: dataclasses.Field) -> str:
    """The attribute argparse stores the flag under ('rollout_reuse', 'reuse.seed', ...)."""
    return field.metadata["flag"].removeprefix("--")


def help_text(field: dataclasses.Field, names=None) -> str:
    """A flag's help; the rule names it lists are those registered now (the docs list the built-ins only)."""
    from .policies import lenient_builtins, registered

    text = field.metadata["help"].replace("{lenient}", ", ".join(lenient_builtins()))
    return text.replace("{policies}", ", ".join(registered() if names is None else names))


def add_arguments(parser: argparse.ArgumentParser, names=None) -> argparse._ArgumentGroup:
    """Our argument group, generated from the fields (all of them, or those named)."""
    group = parser.add_argument_group(GROUP_TITLE)
    for field in flag_fields(names):
        kwargs = dict(field.metadata["argparse"])
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        if kwargs.get("action") == "append":
            default = []
        group.add_argument(field.metadata["flag"], dest=dest(field), default=default, help=help_text(field), **kwargs)
    return group


def from_namespace(namespace, names=None, **overrides) -> ReuseConfig:
    """The config of a parsed command line: argparse's flat namespace or OpenRLHF's hierarchized one."""
    values = {}
    for field in flag_fields(names):
        value = _lookup(namespace, dest(field))
        if field.name == "params":
            value = _plain(value or {})  # OpenRLHF's hierarchize turns dict values into namespaces
        if field.name == "plugins":
            value = tuple(value or ())
        values[field.name] = value
    return ReuseConfig(**{**values, **overrides})


def cell_flags(**values) -> list[str]:
    """The command-line words that set the per-cell fields given (policy, lenience, params, trace_dir)."""
    words = []
    for field in dataclasses.fields(ReuseConfig):
        value = values.pop(field.name, None)
        if value is None or (field.name == "params" and not value):
            continue
        if not field.metadata["cell"]:
            raise ValueError(f"{field.name} is not set per grid cell")
        text = (
            json.dumps(value) if isinstance(value, dict) else repr(value) if isinstance(value, float) else str(value)
        )
        words += [field.metadata["flag"], text]
    if values:
        raise ValueError(f"no ReuseConfig fields {sorted(values)}")
    return words


def cell_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(ReuseConfig) if f.metadata["cell"])


def flags_markdown() -> str:
    """The flag table of docs/usage.md."""
    from .policies import builtin_names

    rows = []
    for field in dataclasses.fields(ReuseConfig):
        kwargs = field.metadata["argparse"]
        value = f" {kwargs['metavar']}" if "metavar" in kwargs else ""
        if "choices" in kwargs:
            value = " " + "|".join(kwargs["choices"])  # the table escapes the bars
        shown = field.metadata["shown"] or (f"`{field.default}`" if isinstance(field.default, str) else field.default)
        rows.append([f"`{field.metadata['flag']}{value}`", shown, help_text(field, builtin_names())])
    return table(["flag", "default", "meaning"], rows)


def _lookup(namespace, dotted: str):
    if hasattr(namespace, dotted):
        return getattr(namespace, dotted)
    node = namespace
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _plain(value):
    if isinstance(value, (types.SimpleNamespace, argparse.Namespace)):
        return {k: _plain(v) for k, v in vars(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
