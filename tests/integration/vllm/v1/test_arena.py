"""The arena (`vllm.arena`): paths share their prefixes and count, the greedy child is the most taken, re-entries
score by expected accepted tokens, growth keeps every node and the index, and without numba the same kernels run as
plain Python."""

import os
import subprocess
import sys
import textwrap

import numpy as np

from specrl_openrlhf.integration.vllm.v1 import arena as arena_module
from specrl_openrlhf.integration.vllm.v1.arena import (
    BELOW,
    BEST,
    COUNT,
    DEPTH,
    NONE,
    TOKEN,
    Arena,
    path_score,
    reentry,
)


def tokens(*values):
    return np.array(values, np.int32)


def test_paths_share_their_prefixes_and_the_greedy_child_is_the_most_taken():
    arena = Arena(8)
    root = arena.new_root(0)
    for path in ([5, 6, 7], [5, 6, 8], [5, 6, 8], [9]):
        arena.insert(root, tokens(*path), 0, 2)
    nodes = arena.nodes
    five = nodes[root, BEST]
    six = nodes[five, BEST]
    assert nodes[five, TOKEN] == 5 and nodes[five, COUNT] == 3 and nodes[root, BELOW] == 4
    assert nodes[nodes[six, BEST], TOKEN] == 8 and nodes[six, BELOW] == 3
    assert path_score(nodes, root, 4) == 0.75 + 0.75 + 0.75 * 2 / 3  # 5, then 6, then 8
    assert arena.size == 1 + 5 and arena.capacity == 8  # the nodes 5, 6, 7, 8, 9


def test_a_re_entry_takes_the_match_whose_path_scores_best_not_the_longest():
    arena = Arena(16)
    a, b = arena.new_root(0), arena.new_root(2)
    arena.insert(a, tokens(1, 2, 3, 4, 40), 0, 2)  # after [1, 2, 3]: 4, 40 (score 2)
    arena.insert(b, tokens(2, 3, 50, 51, 52, 53), 2, 2)  # after [2, 3]: 50, 51, 52, 53 (score 4)
    row, nodes = tokens(1, 2, 3), arena.nodes
    node, match = reentry(*arena.arrays, row, 3, 2, NONE, 4, 32, 0, True)
    assert nodes[nodes[node, BEST], TOKEN] == 50 and match == 2  # the shorter match, whose path scores more
    node, match = reentry(*arena.arrays, row, 3, 2, NONE, 4, 32, 0, False)  # its own slot only (slot 0)
    assert nodes[nodes[node, BEST], TOKEN] == 4 and match == 3
    assert reentry(*arena.arrays, tokens(7, 8), 2, 2, NONE, 4, 32, 0, True) == (NONE, 0)


def test_growth_keeps_every_node_and_the_index():
    arena = Arena(4)
    root = arena.new_root(0)
    last = arena.insert(root, np.arange(100, 140, dtype=np.int32), 0, 3)
    assert arena.capacity >= 41 and arena.size == 41 and arena.nodes[last, DEPTH] == 40
    node, match = reentry(*arena.arrays, np.array([7, 120, 121, 122], np.int32), 4, 3, NONE, 4, 32, 0, True)
    assert arena.nodes[node, TOKEN] == 122 and match == 3


FALLBACK = textwrap.dedent(
    """
    import sys
    sys.modules["numba"] = None  # as where numba is missing: the kernels run as plain Python
    import numpy as np
    from specrl_openrlhf.integration.vllm.v1 import arena
    assert not arena.COMPILED
    a = arena.Arena(8)
    root = a.new_root(0)
    a.insert(root, np.array([5, 6, 7, 8], np.int32), 0, 2)
    node, match = arena.reentry(*a.arrays, np.array([9, 6, 7], np.int32), 3, 2, arena.NONE, 4, 32, 0, True)
    print(int(a.nodes[a.nodes[node, arena.BEST], arena.TOKEN]), int(match), a.size)
    """
)


def test_without_numba_the_kernels_run_as_plain_python_and_agree():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", FALLBACK], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    a = Arena(8)
    root = a.new_root(0)
    a.insert(root, tokens(5, 6, 7, 8), 0, 2)
    node, match = reentry(*a.arrays, tokens(9, 6, 7), 3, 2, NONE, 4, 32, 0, True)
    assert result.stdout.split() == [str(a.nodes[a.nodes[node, BEST], TOKEN]), str(match), str(a.size)]
    assert arena_module.COMPILED
