"""vLLM 0.34's GPU suffix speculator's kernels (`SuffixSpeculator`, `vllm/v1/worker/gpu/spec_decode/suffix/
speculator.py`) re-implemented on the CPU: its Triton kernels as numba kernels of the same arithmetic, a row (or a
document) a call where Triton runs a program each; `suffix_v2.SuffixV2` drives them as vLLM's V2 model runner does.

Terminology (vLLM's):
- *corpus*: one ring of `corpus_tokens` tokens (int32, -1 where empty) holding finished responses, each a *document*:
  its prompt's last `PROMPT_CONTEXT` tokens and its response, then a -1 separator. A document that does not fit
  before the ring's end goes to its start; the oldest are overwritten first. It is filled when requests finish, in
  their sorted id order (`ingest`); the rows in flight are not in it;
- *index* (`table`, [2, buckets, SLOTS] int64): each position of a document under the hash of the 4 tokens before it
  (row 0) and of the 2 before it (row 1), in slot `doc_seq % SLOTS` of its bucket, as `doc_seq << 32 | position`,
  the greatest kept (the newest document of that slot's residue, its last position);
- *local match* (`local_match`): the longest earlier occurrence (up to `depth` tokens) of a row's suffix in its own
  prompt and output, the latest of equal length; its draft is what followed it;
- *corpus match* (`corpus_draft`): the 16 candidates of the row's 4-token and 2-token buckets, each verified and
  extended against the corpus; for each distinct match length L the candidates matching at least L vote token by
  token, and the chain of the best sum of vote counts over the candidates wins (ties: the longer L). The longer of
  the local and the corpus match drafts (ties: the local);
- *draft*: K = `num_speculative_tokens` tokens every row (default min(8, depth)); slots past the match hold the row's
  last token (*fillers*), verified as ordinary drafts;
- *confidences* (adaptive verification only): per slot, the acceptance observed for drafts of the same source (local
  or corpus), match-length bucket (`len_bucket`) and position, Laplace-smoothed, 0 for fillers; the counts are halved
  every `STATS_HALF_LIFE` steps.

The kernels are compiled with numba on first use (`compile_kernels`: numba, which vLLM depends on, is imported there,
not with the module), and run as plain Python, slowly, where it is missing.
"""

from __future__ import annotations

import numpy as np

HASH_MUL = np.uint64(0x9E3779B97F4A7C15)  # vLLM's _HASH_MUL, an odd 64-bit multiplier (its int64 bits)
SLOTS = 8  # vLLM's _BUCKET_SLOTS
PROMPT_CONTEXT = 3  # vLLM's _PROMPT_CONTEXT
LEN_BUCKETS = 9  # vLLM's _NUM_LEN_BUCKETS
STATS_HALF_LIFE = 1024  # vLLM's _STATS_HALF_LIFE
CORPUS_TOKENS = 1 << 20  # vLLM's suffix_decoding_corpus_tokens default
DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth default
MAX_K = 8  # vLLM 0.34's default num_speculative_tokens for suffix: min(8, depth)


def _mix(hv, token):
    return (hv ^ np.uint64(token)) * HASH_MUL  # modulo 2^64, as the GPU's int64 product


def _bucket(hv, num_buckets):
    return np.int64(((hv >> np.uint64(29)) ^ hv) & np.uint64(num_buckets - 1))


def len_bucket(length):
    """vLLM's `_len_bucket`: match lengths 1-6 their own bucket, then 7-10, 11-20, 21 and more."""
    return length - 1 if length <= 6 else (6 if length <= 10 else (7 if length <= 20 else 8))


def ingest(corpus, table, head, doc_seq, doc, num_buckets):
    """One finished document `doc` [n] into the ring at `head` (`_suffix_ingest_kernel`, one document); returns
    (its start, the next head)."""
    cap = corpus.shape[0]
    start = max(len(doc) - (cap - 1), 0)  # the newest cap - 1 tokens of an over-long document
    n = len(doc) - start
    if head + n + 1 > cap:
        head = 0
    for j in range(n):
        corpus[head + j] = doc[start + j]
    corpus[head + n] = -1
    value = (np.int64(doc_seq) << 32) | np.int64(0)
    slot = doc_seq % SLOTS
    for j in range(n):
        hv = np.uint64(0)
        for d in range(4):
            token = doc[start + j - 1 - d] if j - 1 - d >= 0 else 0
            hv = _mix(hv, token)
            if d == 1 and j >= 2:
                index = (num_buckets + _bucket(hv, num_buckets)) * SLOTS + slot
                table[index] = max(table[index], value | np.int64(head + j))
            if d == 3 and j >= 4:
                index = _bucket(hv, num_buckets) * SLOTS + slot
                table[index] = max(table[index], value | np.int64(head + j))
    return head, head + n + 1


def local_match(row, seq_len, depth):
    """(match length, end) of the longest earlier occurrence of the row's suffix in itself
    (`_suffix_local_scan_kernel`): end is the exclusive end of the occurrence, where its draft starts; the latest of
    equal length; (0, 0): none."""
    best_len, best_pos = 0, 0
    for pos in range(1, seq_len):
        t = 0
        while t < depth and pos - 1 - t >= 0 and row[pos - 1 - t] == row[seq_len - 1 - t]:
            t += 1
        if t > 0 and (t > best_len or (t == best_len and pos > best_pos)):
            best_len, best_pos = t, pos
    return best_len, best_pos


def corpus_draft(row, seq_len, corpus, table, num_buckets, depth, k):
    """(match length, chain [k], tokens drafted) from the corpus for one row (`_corpus_draft`; see the module's
    terminology)."""
    candidates = 2 * SLOTS
    cap = corpus.shape[0]
    tail = np.full(depth, -2, np.int64)
    for d in range(min(depth, seq_len)):
        tail[d] = row[seq_len - 1 - d]
    hv, bucket2 = np.uint64(0), 0
    for d in range(4):
        hv = _mix(hv, row[seq_len - 1 - d] if seq_len - 1 - d >= 0 else 0)
        if d == 1:
            bucket2 = _bucket(hv, num_buckets)
    bucket4 = _bucket(hv, num_buckets)
    vals = np.empty(candidates, np.int64)
    cpos = np.empty(candidates, np.int64)
    c_len = np.zeros(candidates, np.int64)
    ok = np.zeros(candidates, np.bool_)
    for c in range(candidates):
        key_len = 4 if c < SLOTS else 2
        slot = bucket4 * SLOTS + c if c < SLOTS else (num_buckets + bucket2) * SLOTS + c - SLOTS
        vals[c] = table[slot]
        cpos[c] = vals[c] & 0xFFFFFFFF
        if vals[c] < 0:
            continue
        while c_len[c] < depth and cpos[c] - 1 - c_len[c] >= 0 and corpus[cpos[c] - 1 - c_len[c]] == tail[c_len[c]]:
            c_len[c] += 1
        following = corpus[cpos[c]] if cpos[c] < cap else -1
        ok[c] = following >= 0 and c_len[c] >= key_len and seq_len >= key_len
    kept = ok.copy()
    for j in range(candidates):  # both buckets often hold the same position: counted once
        for i in range(j):
            if ok[i] and cpos[i] == cpos[j]:
                kept[j] = False
    cont = np.full((candidates, k), -1, np.int64)
    for c in range(candidates):
        if kept[c]:
            for d in range(k):
                if cpos[c] + d >= cap or corpus[cpos[c] + d] < 0:
                    break  # cut at the first separator
                cont[c, d] = corpus[cpos[c] + d]
    best_num, best_den, best_len, best_n = -1, 1, 0, 0
    best_chain = np.zeros(k, np.int64)
    for i in range(candidates):
        first = kept[i]
        for j in range(i):
            if kept[j] and c_len[j] == c_len[i]:
                first = False
        if not first:
            continue
        length = c_len[i]
        alive = kept & (c_len >= length)
        den = max(alive.sum(), 1)
        go, num, emitted = length > 0, 0, 0
        chain = np.zeros(k, np.int64)
        for d in range(k):
            col = cont[:, d]
            has = alive & (col >= 0)
            cmax, newest = 0, -1
            for c in range(candidates):
                if has[c]:
                    count = 0
                    for e in range(candidates):
                        count += has[e] and col[e] == col[c]
                    if count > cmax or (count == cmax and vals[c] > newest):
                        cmax, newest = count, vals[c]
            next_tok = 0
            for c in range(candidates):
                if has[c] and vals[c] == newest:
                    next_tok = col[c]
            go = go and cmax > 0
            if go:
                num += cmax
                chain[d] = next_tok
                emitted += 1
            alive = alive & has & (col == next_tok)
        if num * best_den > best_num * den or (num * best_den == best_num * den and best_len < length):
            best_num, best_den, best_len, best_n, best_chain = num, den, length, emitted, chain
    return best_len, best_chain, best_n


def propose_rows(tokens, lengths, num_sampled, corpus, table, num_buckets, depth, k, stats, adaptive, has_corpus):
    """Every row's draft (`_suffix_finalize_kernel`): (drafts [R, k] int64, valid tokens [R], the stats bucket of
    each row's draft [R] (-1: none), confidences [R, k] float32 (adaptive only))."""
    rows = tokens.shape[0]
    drafts = np.zeros((rows, k), np.int64)
    valid = np.zeros(rows, np.int32)
    buckets = np.full(rows, -1, np.int64)
    confidences = np.zeros((rows, k), np.float32)
    for b in range(rows):
        row, seq_len = tokens[b], lengths[b]
        l_len, l_pos = local_match(row, seq_len, depth) if num_sampled[b] > 0 else (0, 0)
        draft, n_ok, match, source = np.zeros(k, np.int64), 0, l_len, 0
        if l_len > 0:
            n_ok = min(k, seq_len - l_pos)
            draft[:n_ok] = row[l_pos : l_pos + n_ok]
        if has_corpus:
            g_len, chain, g_n = corpus_draft(row, seq_len, corpus, table, num_buckets, depth, k)
            if g_len > l_len:  # the longer match wins; ties go to the row's own history
                draft, n_ok, match, source = chain, g_n, g_len, 1
        if num_sampled[b] <= 0:
            n_ok = 0
        last = row[seq_len - 1] if seq_len > 0 else 0
        drafts[b, :n_ok] = draft[:n_ok]
        drafts[b, n_ok:] = last  # fillers: the row's last token
        valid[b] = n_ok
        if adaptive:
            bucket = source * LEN_BUCKETS + len_bucket(max(match, 1))
            for d in range(n_ok):
                accepted, observed = np.float32(stats[bucket, d, 0]), np.float32(stats[bucket, d, 1])
                confidences[b, d] = (accepted + np.float32(1.0)) / (observed + np.float32(2.0))
            buckets[b] = bucket if n_ok > 0 else -1
    return drafts, valid, buckets, confidences


def observe(stats, bucket, valid, num_sampled, num_rejected):
    """One row's verdict on its last draft into the stats (`_suffix_observe_kernel`): the accepted positions and the
    first rejected one were observed."""
    if bucket < 0 or num_sampled == 0:
        return
    accepted = num_sampled - 1
    verified = accepted + num_rejected
    for d in range(stats.shape[1]):
        if d <= accepted and d < verified and d < valid:
            stats[bucket, d, 0] += d < accepted
            stats[bucket, d, 1] += 1


_COMPILED: bool | None = None  # None: not tried yet


def compile_kernels() -> bool:
    """Compile every kernel of the module with numba (imported here), in place of its plain Python, once; returns
    whether they are compiled (False: numba is missing, the plain Python runs). Call it before the first kernel."""
    global _COMPILED
    if _COMPILED is None:
        try:
            from numba import njit
        except ImportError:
            _COMPILED = False
        else:
            names = (
                "_mix",
                "_bucket",
                "len_bucket",
                "ingest",
                "local_match",
                "corpus_draft",
                "propose_rows",
                "observe",
            )
            for name in names:  # each resolves the others by name when first compiled: all are compiled by then
                globals()[name] = njit(cache=True)(globals()[name])
            _COMPILED = True
    return _COMPILED
