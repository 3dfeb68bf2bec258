import random

import numpy as np
import pytest

from specrl_openrlhf.cache import DraftCache, prompt_key, shard_of
from specrl_openrlhf.draft import Draft


def draft(tokens, finish="stop"):
    return Draft(np.asarray(tokens, np.int32), -np.ones(len(tokens), np.float32), finish)


def run_visit(cache, key, visit_id, n, rng, age=1, tag=0):
    """n samples of one visit with shuffled interleaving of claims and commits; returns the drafts claimed."""
    events = [("claim", i) for i in range(n)] + [("commit", i) for i in range(n)]
    rng.shuffle(events)
    claimed, done = {}, set()
    pending = list(events)
    while pending:  # a sample commits only after its own claim
        for event in list(pending):
            kind, i = event
            if kind == "commit" and i not in claimed:
                continue
            pending.remove(event)
            if kind == "claim":
                claimed[i] = cache.claim(key, visit_id, age)[0]
            else:
                cache.commit(key, visit_id, draft([tag, i]))
                done.add(i)
            break
    return claimed


@pytest.mark.parametrize("seed", range(20))
def test_shuffled_visits_never_serve_their_own_samples(seed):
    rng = random.Random(seed)
    cache = DraftCache()
    keys = [prompt_key([p, 1, 2]) for p in range(5)]
    for visit in range(4):
        order = list(keys)
        rng.shuffle(order)
        for key in order:
            claimed = run_visit(cache, key, f"{key.hex()}-{visit}", 4, rng, tag=visit)
            got = [d for d in claimed.values() if d is not None]
            if visit == 0:
                assert got == []
                continue
            assert len(got) == 4
            assert all(int(d.token_ids[0]) == visit - 1 for d in got)  # from the previous visit only
            assert len({id(d) for d in got}) == 4  # each sample its own draft
            assert sorted(int(d.token_ids[1]) for d in got) == [0, 1, 2, 3]
            assert {d.visit for d in got} == {visit - 1}


def test_delayed_age_two_and_more_samples_than_drafts():
    cache, key = DraftCache(keep_visits=2), prompt_key([9])
    for visit in range(3):
        for i in range(2):
            cache.claim(key, f"v{visit}", 2)
            cache.commit(key, f"v{visit}", draft([visit, i]))
    claims = cache.claim(key, "v3", 2, count=3)
    assert [int(c.token_ids[0]) for c in claims[:2]] == [1, 1] and claims[2] is None
    assert cache.claim(prompt_key([10]), "x", 1) == [None]


def test_memory_cap_evicts_least_recently_used():
    cache = DraftCache(max_bytes=4000)
    for p in range(10):
        cache.claim(prompt_key([p]), "v", 1)
        cache.commit(prompt_key([p]), "v", draft(list(range(100))))
    assert cache.nbytes <= 4000 and cache.evicted_prompts > 0
    assert cache.claim(prompt_key([9]), "w", 1)[0] is not None  # the newest survived
    assert cache.claim(prompt_key([0]), "w", 1) == [None]


def test_the_cap_holds_after_claims_whose_commits_never_come():
    """A full cache, then a step of new prompts that claim and never commit (their rollout was killed): each claim's
    entry counts at once, so the cap holds after every claim; the prompt just claimed stays."""
    cache = DraftCache(max_bytes=4000)
    for p in range(10):
        cache.claim(prompt_key([p]), "v", 1)
        cache.commit(prompt_key([p]), "v", draft(list(range(100))))
    full, evicted = cache.nbytes, cache.evicted_prompts
    entry_bytes = _entry_bytes()
    assert full > cache.max_bytes - 3 * entry_bytes  # the claims below would overrun the cap without eviction
    for p in range(100, 110):
        cache.claim(prompt_key([p]), "killed", 1, count=4)
        assert cache.nbytes <= cache.max_bytes, (p, cache.nbytes)
        assert cache.drafts(prompt_key([p])) == [] and len(cache) > 1  # kept, empty, beside older prompts
    assert cache.evicted_prompts > evicted


def _entry_bytes() -> int:
    """What a prompt's entry costs before any draft (by the cache's own accounting)."""
    cache = DraftCache()
    cache.claim(prompt_key([0]), "v", 1)
    return cache.nbytes


def test_a_prompt_larger_than_the_cap_is_not_kept():
    cache, small, large = DraftCache(max_bytes=3000), prompt_key([1]), prompt_key([2])
    cache.commit(small, "v", draft(list(range(10))))
    cache.commit(large, "v", draft(list(range(100))))
    assert cache.nbytes <= 3000 and cache.drafts(large) and cache.drafts(small)
    for i in range(3):
        cache.commit(large, "v", draft(list(range(100 + i))))
        assert cache.nbytes <= 3000
    assert cache.drafts(small) == [] and len(cache.drafts(large)) < 4 and cache.evicted_prompts >= 2
    cache.claim(large, "w", 1, count=4, history=2)
    assert cache.nbytes <= 3000


def test_a_restarted_shard_loads_within_its_cap(tmp_path):
    """A shard restarted with a smaller cap than the run that saved (or several files for one shard) keeps the most
    recently used prompts that fit."""
    cache, keys = DraftCache(), [prompt_key([p]) for p in range(20)]
    for key in keys:
        cache.claim(key, "v", 1)
        cache.commit(key, "v", draft(list(range(50))))
    path = cache.save(tmp_path / "drafts.npz")
    restarted = DraftCache(max_bytes=cache.nbytes // 4)
    assert restarted.load(path) and restarted.load(path)  # twice: a second file of the same prompts
    assert 0 < restarted.nbytes <= restarted.max_bytes and len(restarted) < 20
    assert all(restarted.drafts(key) for key in keys[-len(restarted) :])  # the newest survive


@pytest.mark.parametrize("keep", [1, 2])
def test_only_the_completed_visits_a_policy_reads_are_kept(keep):
    cache, key = DraftCache(keep_visits=keep), prompt_key([1])
    for visit in range(5):
        cache.claim(key, f"v{visit}", keep)
        cache.commit(key, f"v{visit}", draft([visit] * 50))
    one_visit = draft([0] * 50).nbytes
    assert (keep + 1) * one_visit <= cache.nbytes < (keep + 1) * one_visit + 1000  # the open visit too
    assert [d.token_ids[0] for d in cache.drafts(key)] == list(range(4 - keep, 5))
    with pytest.raises(ValueError, match="keep_visits"):
        DraftCache(keep_visits=3)


def test_save_load_roundtrip_and_shards(tmp_path):
    cache = DraftCache()
    keys = [prompt_key([p]) for p in range(20)]
    for key in keys:
        for visit in range(2):
            cache.claim(key, f"v{visit}", 1)
            cache.commit(key, f"v{visit}", draft([visit, 7, 8], "length" if visit else "stop"))
    path = cache.save(tmp_path / "drafts.npz")
    restored = DraftCache()
    assert restored.load(path)
    got = restored.claim(keys[3], "next", 1)[0]
    assert got.token_ids.tolist() == [1, 7, 8] and got.finish_reason == "length" and got.visit == 1
    delayed = DraftCache(keep_visits=2)
    delayed.load(path)
    assert delayed.claim(keys[3], "next", 2)[0].token_ids.tolist() == [0, 7, 8]
    halves = [DraftCache(), DraftCache()]
    for i, half in enumerate(halves):
        half.load(path, shard=(i, 2))
    assert len(halves[0]) + len(halves[1]) == 20
    assert all(len(h) == sum(shard_of(k, 2) == i for k in keys) for i, h in enumerate(halves))


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage" * 10, b"PK\x03\x04truncated zip"],
    ids=["empty", "garbage", "truncated"],
)
def test_corrupt_file_warns_and_starts_cold(tmp_path, caplog, content):
    path = tmp_path / "drafts.npz"
    path.write_bytes(content)
    cache = DraftCache()
    assert cache.load(path) is False
    assert len(cache) == 0 and "starting cold" in caplog.text


def test_foreign_and_future_files(tmp_path, caplog):
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, header=np.frombuffer(b'{"format": "other", "version": 1}', np.uint8))
    future = tmp_path / "future.npz"
    cache = DraftCache()
    cache.commit(prompt_key([1]), "v", draft([1]))
    cache.save(future)
    data = dict(np.load(future))
    data["header"] = np.frombuffer(b'{"format": "specrl-draft-cache", "version": 99}', np.uint8)
    np.savez(future, **data)
    fresh = DraftCache()
    assert not fresh.load(foreign) and not fresh.load(future) and not fresh.load(tmp_path / "missing.npz")
    assert "not a draft cache" in caplog.text and "version 99" in caplog.text


def test_inconsistent_arrays_are_rejected(tmp_path):
    cache = DraftCache()
    cache.commit(prompt_key([1]), "v", draft([1, 2, 3]))
    path = cache.save(tmp_path / "d.npz")
    data = dict(np.load(path))
    data["response_length"] = data["response_length"] + 5
    np.savez(path, **data)
    assert DraftCache().load(path) is False


def test_save_is_atomic(tmp_path, monkeypatch):
    cache = DraftCache()
    cache.commit(prompt_key([1]), "v", draft([1]))
    path = cache.save(tmp_path / "d.npz")
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", fail)
    with pytest.raises(OSError):
        cache.save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["d.npz"]


def test_version_1_files_still_load(tmp_path):
    """A cache saved by the previous format (token ids and logprobs only) loads, with p_gen = p_prev and age 0."""
    import json

    key = prompt_key([1, 2])
    header = json.dumps({"format": "specrl-draft-cache", "version": 1}).encode()
    arrays = {
        "header": np.frombuffer(header, np.uint8),
        "keys": np.frombuffer(key, np.uint8)[None, :],
        "visit_entry": np.array([0]),
        "visit_number": np.array([3]),
        "response_visit": np.array([0, 0]),
        "response_length": np.array([2, 1]),
        "response_finish": np.array([0, 1], np.uint8),
        "tokens": np.array([5, 6, 7], np.int32),
        "logprobs": np.array([-1.0, -2.0, -3.0], np.float32),
    }
    path = tmp_path / "v1.npz"
    np.savez(path, **arrays)
    cache = DraftCache()
    assert cache.load(path)
    drafts = cache.drafts(key)
    assert [d.token_ids.tolist() for d in drafts] == [[5, 6], [7]] and drafts[1].finish_reason == "length"
    assert drafts[0].gen_logprobs.tolist() == [-1.0, -2.0] and drafts[0].ages.tolist() == [0, 0]


def test_the_new_per_token_arrays_survive_a_save(tmp_path):
    key = prompt_key([4])
    cache = DraftCache()
    cache.claim(key, "v", 1)
    top_ids, top_lp = np.array([[5, 1], [6, 2]], np.int32), np.array([[-0.1, -2.0], [-0.2, -3.0]], np.float32)
    draft = Draft(
        np.array([5, 6]),
        np.array([-0.1, -0.2]),
        "stop",
        gen_logprobs=np.array([-0.5, -0.6]),
        ages=np.array([3, 0]),
        top_ids=top_ids,
        top_logprobs=top_lp,
    )
    cache.commit(key, "v", draft)
    restored = DraftCache()
    assert restored.load(cache.save(tmp_path / "c.npz"))
    [back] = restored.drafts(key)
    assert back.gen_logprobs.tolist() == pytest.approx([-0.5, -0.6]) and back.ages.tolist() == [3, 0]
    assert np.array_equal(back.top_ids, top_ids) and np.allclose(back.top_logprobs, top_lp)
