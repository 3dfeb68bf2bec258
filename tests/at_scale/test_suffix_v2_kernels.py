"""vLLM 0.34's suffix speculator's kernels re-implemented (`at_scale.suffix_v2_kernels`): hand-built cases read from
its source, and, where vLLM 0.34 and Triton import (`vllm034`), the same random cases through its own Triton kernels
in Triton's interpreter (`TRITON_INTERPRET=1`, on CPU tensors), every output compared.

Run the comparison with vLLM 0.34's wheel unzipped into a folder ahead of the venv, e.g.
`PYTHONPATH=/path/to/vllm034/site pytest -m vllm034 tests/at_scale/test_suffix_v2_kernels.py`: the test starts one
process with the interpreter on (`CUDA_VISIBLE_DEVICES=""`, so that vLLM keeps Triton without a GPU driver) and this
file's `__main__` drives both sides there.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from specrl_openrlhf.at_scale import suffix_v2_kernels as kernels

NB = 64  # buckets of a 256-token corpus (vLLM: next power of 2 of max(16, 256 // 4))
kernels.compile_kernels()  # as the simulator runs them


def ring(cap=256):
    return np.full(cap, -1, np.int32), np.full(2 * max(16, cap // 4) * kernels.SLOTS, -1, np.int64)


def draft(rows, corpus=None, table=None, k=8, depth=24, sampled=None, stats=None):
    """Every row's draft, one call: rows are token lists (a row a request)."""
    width = max(len(r) for r in rows) + 1
    tokens = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    has_corpus = corpus is not None
    corpus, table = (corpus, table) if has_corpus else (np.full(1, -1, np.int32), np.full(16, -1, np.int64))
    sampled = np.ones(len(rows), np.int64) if sampled is None else np.asarray(sampled, np.int64)
    adaptive = stats is not None
    stats = np.zeros((18, k, 2), np.int64) if stats is None else stats
    lengths = np.array([len(r) for r in rows], np.int64)
    return kernels.propose_rows(tokens, lengths, sampled, corpus, table, NB, depth, k, stats, adaptive, has_corpus)


def test_a_row_drafts_what_followed_the_longest_latest_earlier_occurrence_of_its_suffix():
    # 5 6 ends the row; 5 6 occurred twice before (each matched 2 tokens back): the later one (7 10 11 ...) drafts
    drafts, valid, _, _ = draft([[5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 5, 6]])
    assert drafts[0].tolist() == [7, 10, 11, 5, 6, 6, 6, 6] and valid.tolist() == [5]  # its end, then fillers
    # a longer match wins over a later one: 9 5 6 matches 3 tokens at the first occurrence
    drafts, valid, _, _ = draft([[9, 5, 6, 1, 2, 5, 6, 3, 9, 5, 6]])
    assert drafts[0, :4].tolist() == [1, 2, 5, 6]
    assert kernels.local_match(np.array([1, 2, 3]), 3, 24) == (0, 0)  # nothing repeats: no draft, all fillers
    drafts, valid, _, _ = draft([[1, 2, 3]])
    assert valid.tolist() == [0] and drafts[0].tolist() == [3] * 8
    # a row that sampled nothing this step (a prefill chunk) drafts fillers only
    assert draft([[5, 6, 5, 6]], sampled=[0])[1].tolist() == [0]
    # the match is at most `depth` tokens: with depth 2 both occurrences tie at 2, the later wins
    assert kernels.local_match(np.array([7, 5, 6, 1, 7, 5, 6, 2, 9, 5, 6]), 11, 2) == (2, 7)
    assert kernels.local_match(np.array([7, 5, 6, 1, 8, 5, 6, 2, 7, 5, 6]), 11, 24) == (3, 3)


def test_finished_documents_fill_the_ring_oldest_overwritten_and_each_position_is_indexed_by_its_last_2_and_4():
    corpus, table = ring(32)
    start, head = kernels.ingest(corpus, table, 0, 0, np.arange(1, 11), 16)  # 10 tokens and a separator
    assert (start, head) == (0, 11) and corpus[:11].tolist() == [*range(1, 11), -1]
    start, head = kernels.ingest(corpus, table, head, 1, np.arange(20, 35), 16)  # 15 + 1 fit in 32
    assert (start, head) == (11, 27)
    start, head = kernels.ingest(corpus, table, head, 2, np.arange(40, 50), 16)  # 27 + 11 > 32: back to the start
    assert (start, head) == (0, 11) and corpus[:11].tolist() == [*range(40, 50), -1]
    assert corpus[11:27].tolist() == [*range(20, 35), -1]  # the second document is intact
    entries = table[table >= 0]
    assert set((entries >> 32).tolist()) == {0, 1, 2}  # document numbers, in the high bits
    # document 2's 8 positions past its first 2 tokens under their 2-token key, 6 past its first 4 under the 4-token
    assert ((entries >> 32) == 2).sum() <= 8 + 6
    long_start, _ = kernels.ingest(corpus, table, 11, 3, np.arange(100, 140), 16)  # longer than the ring
    assert long_start == 0 and corpus[:31].tolist() == list(range(109, 140)) and corpus[31] == -1  # its newest 31


def test_the_corpus_votes_token_by_token_and_the_longer_match_of_corpus_and_row_drafts():
    corpus, table = ring()
    head = 0
    for seq, doc in enumerate(([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7], [9, 2, 3, 4, 5, 7])):
        _, head = kernels.ingest(corpus, table, head, seq, np.array(doc), NB)
    # the row ends 2 3 4: all three documents match it 3 tokens back (4 for the first two, whose 1 matches too)
    drafts, valid, buckets, confidences = draft([[8, 1, 2, 3, 4]], corpus, table, stats=np.zeros((18, 8, 2), np.int64))
    # the two that match 4 tokens vote 5 (2 of 2) then 6 or 7 (1 each, the newest wins: 7); score 3/2. Matching 3
    # tokens, all three vote 5 (3 of 3) then 7 (2 of 3): score 5/3, the best: 5 7
    assert drafts[0, :2].tolist() == [5, 7] and valid.tolist() == [2]
    assert buckets.tolist() == [1 * kernels.LEN_BUCKETS + kernels.len_bucket(3)]  # from the corpus, 3 tokens matched
    assert confidences[0].tolist() == [0.5, 0.5] + [0.0] * 6  # Laplace on no counts; fillers 0
    # the row's own text matches longer: it drafts from itself
    drafts, _, _, _ = draft([[2, 3, 4, 8, 8, 8, 2, 3, 4]], corpus, table)
    assert drafts[0, :3].tolist() == [8, 8, 8]


def test_each_verdict_counts_the_accepted_positions_and_the_first_rejected():
    stats = np.zeros((18, 8, 2), np.int64)
    kernels.observe(stats, 3, 5, 3, 2)  # 2 accepted of 4 verified of 5 drafted: positions 0, 1 kept, 2 rejected
    assert stats[3, :, 0].tolist() == [1, 1, 0, 0, 0, 0, 0, 0] and stats[3, :, 1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    kernels.observe(stats, 3, 5, 3, 0)  # all 2 verified accepted: position 2 not observed
    assert stats[3, :3, 1].tolist() == [2, 2, 1]
    kernels.observe(stats, -1, 5, 3, 2)  # no draft last step
    kernels.observe(stats, 3, 5, 0, 0)  # nothing sampled
    assert stats[3, :3, 1].tolist() == [2, 2, 1]
    _, _, _, confidences = draft([[5, 6, 5, 6]], stats=stats)  # a local match of 2 tokens: bucket 1
    assert confidences[0, 0] == pytest.approx(0.5)
    stats[1, 0] = [3, 4]
    assert draft([[5, 6, 5, 6]], stats=stats)[3][0, 0] == pytest.approx(4 / 6)


# ---- the same cases through vLLM 0.34's Triton kernels ---------------------------------------------------------


def vllm034_importable() -> bool:
    try:
        return importlib.util.find_spec("vllm.v1.worker.gpu.spec_decode.suffix.speculator") is not None and bool(
            importlib.util.find_spec("triton")
        )
    except (ImportError, ValueError):
        return False


@pytest.mark.vllm034
@pytest.mark.parametrize("seed", [0, 1])
def test_the_reimplementation_matches_vllm034s_triton_kernels(seed):
    if not vllm034_importable():
        pytest.skip(
            "vLLM 0.34 (its suffix speculator) or Triton is not importable: put vLLM 0.34's wheel on PYTHONPATH"
        )
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, __file__, str(seed)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "compared" in done.stdout, done.stdout


def compare_with_vllm034(seed: int) -> None:
    """Random requests over a small vocabulary (matches and hash collisions are frequent) through vLLM's
    `SuffixSpeculator` and ours: documents ingested (the ring wraps), drafts proposed with adaptive verification's
    confidences, and verdicts observed, every array compared."""
    from types import SimpleNamespace

    import torch
    import vllm.utils.torch_utils as torch_utils
    from triton.runtime import interpreter

    torch_utils.PIN_MEMORY = False  # no pinned memory without an accelerator
    builder = interpreter.InterpreterBuilder  # the interpreter leaves some masks int64 where a GPU kernel has i1
    as_bool = lambda h: interpreter.TensorHandle(h.data.astype(bool), h.dtype)  # noqa: E731
    load, store, rmw = builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw
    builder.create_masked_load = lambda self, p, m, o, c, v: load(self, p, as_bool(m), o, c, v)
    builder.create_masked_store = lambda self, p, v, m, c: store(self, p, v, as_bool(m), c)
    builder.create_atomic_rmw = lambda self, op, p, v, m, sem, scope: rmw(self, op, p, v, as_bool(m), sem, scope)
    from vllm.v1.worker.gpu.spec_decode.suffix.speculator import SuffixSpeculator

    rng = np.random.default_rng(seed)
    slots, width, k, depth, cap = 6, 64, 5 + 3 * seed, 24 - 18 * seed, 256
    spec = dict(num_speculative_tokens=k, suffix_decoding_max_tree_depth=depth, suffix_decoding_corpus_tokens=cap)
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            **spec, suffix_decoding_max_cached_requests=1, enable_adaptive_verification=1
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=slots),
        model_config=SimpleNamespace(max_model_len=width),
    )
    tokens, total = torch.zeros(slots, width, dtype=torch.int32), torch.zeros(slots, dtype=torch.int32)
    prompt_len = np.zeros(slots, np.int32)
    states = SimpleNamespace(
        all_token_ids=SimpleNamespace(gpu=tokens),
        total_len=SimpleNamespace(gpu=total),
        prompt_len=SimpleNamespace(np=prompt_len),
        req_id_to_index={},
    )
    theirs = SuffixSpeculator(config, torch.device("cpu"), states)
    assert theirs.num_buckets == NB and theirs.corpus_len == cap
    corpus, table = ring(cap)
    stats, head, doc_seq = np.zeros((18, k, 2), np.int64), 0, 0
    last_bucket, last_valid = np.full(slots, -1, np.int64), np.zeros(slots, np.int64)
    seen, texts = {"drafted tokens": 0, "rows drafting from the corpus": 0, "wrapped": 0}, []
    for step in range(8):
        for slot in range(slots):  # fresh text in every slot: a pattern repeated with noise, or an earlier text's
            pattern = rng.integers(0, 6, rng.integers(2, 7))  # piece after a head of its own
            text = np.resize(pattern, rng.integers(6, width - 1))
            text[rng.random(len(text)) < 0.15] = rng.integers(0, 6)
            if texts and rng.random() < 0.5:
                earlier = texts[rng.integers(len(texts))]
                cut = rng.integers(0, len(earlier) - 4)
                text = np.r_[rng.integers(20, 30, 3), earlier[cut : cut + rng.integers(4, 40)]]
            texts.append(text)
            tokens[slot].zero_()
            tokens[slot, : len(text)] = torch.from_numpy(text.astype(np.int32))
            total[slot], prompt_len[slot] = len(text), rng.integers(1, 8)
        states.req_id_to_index = {f"r{step}-{slot}": slot for slot in range(slots)}
        finished = sorted(rng.choice(list(states.req_id_to_index), 3, replace=False))
        theirs.on_requests_finished(finished)
        for request in finished:
            slot = states.req_id_to_index[request]
            doc = tokens[slot, max(prompt_len[slot] - 3, 0) : total[slot]].numpy().astype(np.int64)
            start, head = kernels.ingest(corpus, table, head, doc_seq, doc, NB)
            seen["wrapped"] += start == 0 and doc_seq > 0
            doc_seq += 1
        assert np.array_equal(theirs.corpus.numpy(), corpus) and np.array_equal(theirs.table.numpy().ravel(), table)
        assert int(theirs.corpus_head) == head and int(theirs.doc_seq) == doc_seq
        rows = rng.permutation(slots)[: rng.integers(2, slots + 1)]
        sampled = rng.integers(0, 4, len(rows))
        rejected = np.where(sampled > 0, rng.integers(0, 3, len(rows)), 0)
        batch = SimpleNamespace(num_reqs=len(rows), idx_mapping=torch.from_numpy(rows.astype(np.int32)))
        last = torch.from_numpy(np.array([int(tokens[s, total[s] - 1]) for s in range(slots)], np.int64))
        drafts = theirs.propose(
            batch, None, None, None, None, torch.from_numpy(sampled.astype(np.int32)),
            torch.from_numpy(rejected.astype(np.int32)), last, None, None, None,
        )  # fmt: skip
        for i, slot in enumerate(rows):
            kernels.observe(stats, last_bucket[slot], last_valid[slot], sampled[i], rejected[i])
            last_bucket[slot] = -1
        ours = kernels.propose_rows(
            tokens[rows].numpy(), total[rows].numpy().astype(np.int64), sampled, corpus, table, NB, depth, k,
            stats, True, True,
        )  # fmt: skip
        assert np.array_equal(theirs.accept_stats.numpy(), stats), step
        assert np.array_equal(drafts.numpy(), ours[0]), (step, drafts, ours[0])
        assert np.array_equal(theirs.num_valid[: len(rows)].numpy(), ours[1]), step
        assert np.array_equal(theirs.draft_token_confidence_probs[: len(rows)].numpy(), ours[3]), step
        last_bucket[rows], last_valid[rows] = ours[2], ours[1]
        seen["drafted tokens"] += int(ours[1].sum())
        seen["rows drafting from the corpus"] += int((ours[2] >= kernels.LEN_BUCKETS).sum())
        assert np.array_equal(theirs.last_bucket[rows].numpy(), ours[2]), step
    seen["observed"] = int(stats[..., 1].sum())
    assert all(seen.values()), seen  # every path was taken: the ring wrapped, both sources drafted, verdicts counted
    print(f"compared 8 steps of seed {seed}: corpus, index, drafts, valid tokens, confidences and stats equal; {seen}")


if __name__ == "__main__":
    compare_with_vllm034(int(sys.argv[1]))
