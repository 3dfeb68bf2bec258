"""Proposals: what a sample drafts from its prompt's `History`, as functions over it.

Terminology (`history` has the rest):
- *proposal*: the draft tokens put forward for verification. A *fixed* proposal depends on the history and on the
  sample's own tokens so far, never on its randomness to come; keeping a draft token y with probability p(y) and
  otherwise sampling p without y is then exact, whatever produced the history (docs/design.md).
- *own*: the sample's own previous response (`History.paths[r]`): SPEC-RL's draft.
- *majority path*: from the root, the child most responses through the node take, while most continue
  (`majority_path`).
- *walk*: the request path's exact walk through the whole tree with p_curr of every node (`walk`).

Core module: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .history import ROOT, History


def majority_path(history: History) -> np.ndarray:
    """[k] int64 nodes of the majority path: from the root, the child that most of the responses through the node
    continue with (ties: the earliest), while most of them continue. `History.draft_along` makes it a draft.

    >>> from specrl_openrlhf.draft import Draft
    >>> d = lambda *t: Draft(np.array(t), np.zeros(len(t)), "stop")
    >>> history = History.of_drafts([d(1, 2, 3), d(1, 2, 4), d(1, 5), d(1, 2, 4, 6)])
    >>> history.token_of(majority_path(history)).tolist()
    [1, 2, 4]
    """
    count, kids, nodes, node = history.count, history.kids, [], ROOT
    while kids[node]:
        children = list(kids[node].values())
        going = sum(count[c] for c in children)
        through = count[node] if node != ROOT else going  # empty responses take no part
        if 2 * going <= through:  # most responses end here
            break
        node = max(children, key=count.__getitem__)  # the first of the likeliest: they came in response order
        nodes.append(node)
    return np.array(nodes, np.int64)


@dataclass(frozen=True)
class Walk:
    """Where a walk through a visit's tree went.

    `nodes` are the kept tokens' nodes (the verified prefix). If the walk left the tree at a node with known children,
    `excluded` holds their tokens, which the next position must not be, and `excluded_mass` their summed p_curr.
    """

    nodes: np.ndarray  # [k] int64, node ids of the kept tokens, root excluded
    excluded: tuple[int, ...]  # tokens the continuation's first step must not sample
    excluded_mass: float  # sum of p_curr over `excluded`
    rejected: bool  # left the tree at a node with children (not at a leaf, the budget or a stop)
    complete: bool  # ended at a node where a response ended by a stop condition: nothing left to generate
    switches: int  # times the walk left the branch it was on for another child
    branch: int  # the response whose branch the walk ended on


def walk(history: History, logprobs: np.ndarray, uniforms: np.ndarray, own: int | None, max_depth: int) -> Walk:
    """A sample's exact walk through the tree of `history` with one uniform u_d per position d. At a node whose
    children C have p_curr known (`logprobs`: [N] log p_curr per node, NaN where unknown):

    - if u_d <= sum of p_curr(c) over C, it takes the child whose interval of the cumulative sum holds u_d, and goes
      on;
    - otherwise it leaves the tree: position d is drawn from p_curr with all of C removed (renormalised).

    A child c then comes out with probability p_curr(c), and a token x outside C with (1 - p(C)) p(x) / (1 - p(C)) =
    p(x): every position follows p_curr exactly, however the tree was built, so also when the policy was trained on
    its branches. The order of C does not change that; putting the child on the sample's own branch first makes the
    walk keep, for the same uniforms, at least what the sample's own draft would keep (u_d <= p(own child) is the own
    draft's rule). A child whose p_curr is unknown is left out of C, which stays exact.

    `uniforms`: [>= min(history.max_depth, max_depth) + 1] float64; `own`: the sample's own previous response (its
    branch's children come first), or None; `max_depth`: the sample's token budget.
    """
    nodes = history.arrays
    probs = np.exp(logprobs.astype(np.float64))  # [N], NaN where unknown
    branch = own if own is not None and 0 <= own < len(history.paths) else 0
    depth, switches = 0, 0
    while True:
        path = history.paths[branch]
        end = min(len(path), max_depth)
        segment = path[depth:end]
        stops = np.flatnonzero(nodes.stop[segment])
        if len(stops):  # a response ended here: nothing follows (the stop node itself can be kept)
            end = depth + int(stops[0]) + 1
            segment = path[depth:end]
        leaves = np.flatnonzero(~(uniforms[depth:end] <= probs[segment]))  # NaN p: not kept on this branch
        if len(leaves) == 0:
            depth = end
            node = int(path[depth - 1]) if depth else ROOT
            if depth >= max_depth or nodes.stop[node]:
                complete = bool(nodes.stop[node]) and depth > 0
                return Walk(path[:depth].copy(), (), 0.0, False, complete, switches, branch)
            on_branch = None  # past the branch's end: the node's other children, if any
        else:
            depth += int(leaves[0])
            node = int(path[depth - 1]) if depth else ROOT
            on_branch = int(path[depth])
        children = history.children(node)
        known = children[np.isfinite(probs[children])]
        others = known[known != on_branch]
        first = probs[on_branch] if on_branch is not None and np.isfinite(probs[on_branch]) else 0.0
        cumulative = first + np.cumsum(probs[others])  # [c]
        pick = int(np.searchsorted(cumulative, uniforms[depth], side="left"))  # first with u <= cumulative
        if pick < len(others):
            branch = int(nodes.source[others[pick]])
            depth += 1
            switches += 1
            continue
        mass = float(min(probs[known].sum(), 1.0)) if len(known) else 0.0
        excluded = tuple(int(t) for t in nodes.token[known])
        return Walk(path[:depth].copy(), excluded, mass, bool(len(known)), False, switches, branch)
