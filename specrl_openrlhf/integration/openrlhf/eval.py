"""Evaluation never reuses drafts: OpenRLHF's evaluation requests carry a mark that our executor obeys.

OpenRLHF evaluates through `SamplesGenerator.generate_eval_samples`, in its trainer's Ray actor (a different
process from the driver, in both the sync and the async trainer). `train_with_reuse` adds `install_in_worker` as
Ray's `worker_process_setup_hook`, so every worker process of the run patches `SamplesGenerator` when it imports
it: while `generate_eval_samples` runs, each `generate_responses` call it makes carries `EVAL_MARK` in
`SamplingParams.extra_args`. Marked requests go straight to the engine: they never claim a draft and never commit
one, whatever their sampling settings (the ProRLv2 example evaluates at the training temperature).
"""

from __future__ import annotations

import functools
import importlib.abc
import sys

EVAL_MARK = "specrl_openrlhf.eval"
SAMPLES_GENERATOR_MODULE = "openrlhf.trainer.ppo_utils.samples_generator"
WORKER_SETUP_HOOK = f"{__name__}.install_in_worker"


def mark_evaluation(params):
    """A copy of `params` (vLLM SamplingParams) that carries the evaluation mark."""
    marked = params.clone()
    marked.extra_args = {**(params.extra_args or {}), EVAL_MARK: True}
    return marked


def is_evaluation(params) -> bool:
    return bool((getattr(params, "extra_args", None) or {}).get(EVAL_MARK))


class _MarkedRemoteMethod:
    def __init__(self, method):
        self._method = method

    def remote(self, *args, **kwargs):
        if "sampling_params" in kwargs:
            kwargs["sampling_params"] = mark_evaluation(kwargs["sampling_params"])
        else:  # generate_responses(prompt, label, sampling_params, ...)
            args = (*args[:2], mark_evaluation(args[2]), *args[3:])
        return self._method.remote(*args, **kwargs)


class EvaluationEngine:
    """A rollout actor handle whose `generate_responses` calls carry the evaluation mark; all else is the actor's."""

    def __init__(self, handle):
        self._handle = handle

    def __getattr__(self, name):
        return getattr(self._handle, name)

    @property
    def generate_responses(self):
        return _MarkedRemoteMethod(self._handle.generate_responses)


def patch_samples_generator(cls) -> None:
    """Make `cls.generate_eval_samples` dispatch through `EvaluationEngine`s. Idempotent."""
    original = cls.generate_eval_samples
    if getattr(original, "_specrl_marks_evaluation", False):
        return

    @functools.wraps(original)
    def generate_eval_samples(self, **generate_kwargs):
        engines = self.vllm_engines
        self.vllm_engines = [EvaluationEngine(engine) for engine in engines]
        try:
            return original(self, **generate_kwargs)
        finally:
            self.vllm_engines = engines

    generate_eval_samples._specrl_marks_evaluation = True
    cls.generate_eval_samples = generate_eval_samples


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs the patch right after OpenRLHF's samples_generator module executes, without importing it early (it
    pulls in vLLM, which most worker processes of a run never need)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != SAMPLES_GENERATOR_MODULE:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch_samples_generator(module.SamplesGenerator)

        spec.loader.exec_module = exec_and_patch
        return spec


def install_in_worker() -> None:
    """Ray's `worker_process_setup_hook` for a run with reuse (also safe to call in any process, more than once)."""
    module = sys.modules.get(SAMPLES_GENERATOR_MODULE)
    if module is not None:
        patch_samples_generator(module.SamplesGenerator)
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
