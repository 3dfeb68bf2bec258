"""The rejection sampler's recovered-token noise, drawn only for requests with drafts
(`integration.vllm.v1.sampler_fix`): against vLLM's own function on the same inputs, with a reference kernel
standing in for the platform's."""

import types

import pytest
import torch

vllm = pytest.importorskip("vllm")

rejection_sampler = pytest.importorskip("vllm.v1.sample.rejection_sampler")  # vLLM <= 0.33: the V1 sampler

from specrl_openrlhf.integration.vllm.v1 import sampler_fix  # noqa: E402

VOCAB = 50


def reference_kernel(recovered, cu, draft_ids, draft_probs, target_probs, inv_q, *args, **kwargs):
    """What vLLM's kernels compute for a model-free proposal: at each draft position of request i, argmax over the
    vocabulary of p without the draft token, times request i's 1/q."""
    start = 0
    for i, end in enumerate(cu.tolist()):
        for position in range(start, end):
            p = target_probs[position].clone()
            p[draft_ids[position]] = 0.0
            recovered[position] = int(torch.argmax(p * inv_q[i]))
        start = end


@pytest.fixture
def kernel(monkeypatch):
    """vLLM's kernel replaced by `reference_kernel`, launched as the version at hand launches it."""
    if hasattr(rejection_sampler, "_sample_recovered_tokens"):  # 0.32
        monkeypatch.setattr(
            rejection_sampler, "_sample_recovered_tokens", lambda *a, max_spec_len: reference_kernel(*a)
        )
    else:  # 0.29
        launcher = type("Launch", (), {"__getitem__": lambda self, grid: reference_kernel})()
        monkeypatch.setattr(rejection_sampler, "sample_recovered_tokens_kernel", launcher)


def inputs(num_draft_tokens, seeded):
    torch.manual_seed(0)
    cu = torch.tensor(num_draft_tokens, dtype=torch.int32).cumsum(0).to(torch.int32)
    n = int(cu[-1])
    target = torch.softmax(torch.randn(n, VOCAB), dim=-1)
    draft_ids = torch.randint(0, VOCAB, (n,), dtype=torch.int32)
    generators = {i: torch.Generator().manual_seed(100 + i) for i in seeded}
    metadata = types.SimpleNamespace(generators=generators)
    return [max(num_draft_tokens), list(num_draft_tokens), cu, draft_ids, None, target, metadata, torch.device("cpu")]


def original():
    return sampler_fix._ORIGINAL.get("function", rejection_sampler.sample_recovered_tokens)


def test_the_signature_is_the_one_replaced():
    assert sampler_fix.supported() is None


def test_seeded_requests_with_drafts_get_vllms_tokens_and_their_generators_move_alike(kernel):
    drafts, seeded = [3, 0, 2, 0, 4], [0, 1, 4]  # request 1 is seeded but has no draft
    ours_args, theirs_args = inputs(drafts, seeded), inputs(drafts, seeded)
    ours = sampler_fix.sample_recovered_tokens(*ours_args)
    theirs = original()(*theirs_args)
    assert ours[:3].tolist() == theirs[:3].tolist() and ours[5:].tolist() == theirs[5:].tolist()
    for i in seeded:  # the same draws from each request's own generator (none for request 1)
        assert torch.equal(ours_args[6].generators[i].get_state(), theirs_args[6].generators[i].get_state())


def test_with_nothing_drafted_nothing_is_drawn(kernel):
    args = inputs([0, 0, 0], seeded=[1])
    args[0], args[2] = 0, torch.zeros(3, dtype=torch.int32)
    state, generator = torch.get_rng_state(), args[6].generators[1].get_state()
    out = sampler_fix.sample_recovered_tokens(*args)
    assert out.numel() == 0 and torch.equal(torch.get_rng_state(), state)
    assert torch.equal(args[6].generators[1].get_state(), generator)


def test_unseeded_rows_follow_the_same_law(kernel):
    """Recovered tokens of an unseeded request are argmax p / q with q ~ Exp(1): each token x with probability
    p(x) / (1 - p(draft)). Both functions, 4000 draws each, against that law."""
    from tests.helpers import chi2_passes

    args = inputs([1, 0], seeded=[])
    p = args[5][0].clone()
    p[args[3][0]] = 0.0
    law = (p / p.sum()).numpy()
    for function in (sampler_fix.sample_recovered_tokens, original()):
        counts = torch.zeros(VOCAB)
        for _ in range(4000):
            counts[int(function(*args)[0])] += 1
        assert chi2_passes(counts.numpy(), law)


def test_the_switch_and_the_platform_decide(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setenv(sampler_fix.SWITCH, "0")
    assert not sampler_fix.wanted()
    monkeypatch.setenv(sampler_fix.SWITCH, "auto")
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)  # a GPU: untested there, so off
    assert not sampler_fix.wanted()
    monkeypatch.setenv(sampler_fix.SWITCH, "1")
    assert sampler_fix.wanted()
