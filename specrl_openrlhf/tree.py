"""The prefix tree of a prompt's previous responses, and the exact walk `lossless` takes through it (`draft="tree"`).

A fixed proposal need not be one path. The previous responses of a prompt (the last visit's n samples, and the visit's
before when the cache keeps it) form a tree of token prefixes. A sample walks it from the root with one uniform u_d per
position d. At a node whose children C (the next tokens some previous response takes from there) have p_curr known:

- if u_d <= sum of p_curr(c) over C, it takes the child whose interval of the cumulative sum holds u_d, and goes on;
- otherwise it leaves the tree: position d is drawn from p_curr with all of C removed (renormalised), and the
  continuation goes on from there.

A child c then comes out with probability p_curr(c), and a token x outside C with (1 - p(C)) p(x) / (1 - p(C)) = p(x):
every position follows p_curr exactly, however the tree was built, so also when the policy was trained on its branches.
The order of C inside the cumulative sum does not change that; putting the child on the sample's own branch first makes
the walk keep, for the same uniforms, at least what the sample's own draft would keep (u_d <= p(own child) is the own
draft's rule). A child whose p_curr is unknown (its scoring failed) is left out of C, which stays exact.

Core module: numpy only. On the request path the planner (`rollout.SpeculativePlanner`) builds a tree per visit, has
its branches scored once for all the visit's samples (`scoring.DraftScorer.visit_rounds`, `take_visit_scores`) and
walks it once per sample (`walk`). Verified in the engine, the same tree is proposed from at every step
(`proposal.HistoryIndex`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import Draft

ROOT = 0


@dataclass(frozen=True)
class Walk:
    """Where a walk through a `DraftTree` went.

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


class DraftTree:
    """The prefix tree (trie) of `responses`: node 0 is the root, every other node one token after its parent.

    Responses are given in priority order (the latest visit's, slot by slot, then older ones): a node's `source` is
    the first response through it, which supplies its p_prev, p_gen and age. A response that ended by a stop condition
    marks its last node `stop`. `logprobs` holds log p_curr of each node's token after its parent's prefix, NaN until
    scored.

    >>> d = lambda *t: Draft(np.array(t), np.zeros(len(t)), "stop")
    >>> tree = DraftTree([d(1, 2, 3), d(1, 2, 4), d(1, 5)])
    >>> tree.num_nodes, tree.token[tree.children(ROOT)].tolist(), tree.token[tree.children(2)].tolist()
    (6, [1], [3, 4])
    >>> [tree.token[tree.paths[leaf_response]].tolist() for leaf_response in tree.branches]
    [[1, 2, 3], [1, 2, 4], [1, 5]]
    """

    def __init__(self, responses: list[Draft]):
        self.responses = list(responses)
        tokens_of, parents_of, sources_of = [np.array([-1])], [np.array([-1])], [np.array([-1])]
        count = 1  # nodes so far, the root included
        self.paths: list[np.ndarray] = []  # [L_r] int64 node ids of each response's tokens
        for r, response in enumerate(self.responses):
            tokens = response.token_ids
            shared, along = 0, None  # the longest prefix shared with an earlier response, and that response's path
            for q in range(r):
                other = self.responses[q].token_ids
                width = min(len(other), len(tokens))
                differs = np.flatnonzero(other[:width] != tokens[:width])
                common = int(differs[0]) if len(differs) else width
                if common > shared:
                    shared, along = common, self.paths[q]
            new = np.arange(count, count + len(tokens) - shared, dtype=np.int64)
            path = np.concatenate([along[:shared] if shared else np.zeros(0, np.int64), new])
            if len(new):
                tokens_of.append(tokens[shared:])
                parents_of.append(np.concatenate([[path[shared - 1] if shared else ROOT], new[:-1]]))
                sources_of.append(np.full(len(new), r))
            count += len(new)
            self.paths.append(path)
        self.token = np.concatenate(tokens_of).astype(np.int64)  # [N]
        self.parent = np.concatenate(parents_of).astype(np.int64)  # [N]
        self.source = np.concatenate(sources_of).astype(np.int64)  # [N], response index (root: -1)
        self.depth = np.zeros(count, np.int64)  # [N], tokens from the root (root 0, its children 1)
        for path in self.paths:
            self.depth[path] = np.arange(1, len(path) + 1)
        self.stop = np.zeros(count, bool)  # [N]
        for response, path in zip(self.responses, self.paths):
            if response.finish_reason == "stop" and len(path):
                self.stop[path[-1]] = True
        order = np.argsort(self.parent[1:], kind="stable") + 1  # children grouped by parent, in creation order
        self._children = order
        self._child_ptr = np.searchsorted(self.parent[order], np.arange(count + 1))  # [N + 1]
        self.logprobs = np.full(count, np.nan, np.float32)  # [N], log p_curr; root stays NaN
        self.scored = False  # every node that will be scored is (`scoring.DraftScorer.visit_rounds`)
        self.own_count = len(self.responses)  # responses [own_count:] are no sample's own (the visit before)
        self.traced = False  # its responses of the visit before were recorded (`--reuse.trace_dir`)
        has_children = np.zeros(count, bool)
        has_children[self.parent[1:]] = True
        leaves = {}  # one branch per leaf: the first response that ends there
        for r, path in enumerate(self.paths):
            if len(path) and not has_children[path[-1]]:
                leaves.setdefault(int(path[-1]), r)
        self.branches = list(leaves.values())  # response indices

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return len(self.token)

    @property
    def max_depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    def children(self, node: int) -> np.ndarray:
        """[c] int64 node ids of `node`'s children, in the order their responses came."""
        return self._children[self._child_ptr[node] : self._child_ptr[node + 1]]

    def path_tokens(self, response: int) -> np.ndarray:
        return self.responses[response].token_ids

    def unknown(self) -> np.ndarray:
        """[k] int64 nodes (root excluded) whose p_curr is not known."""
        return np.flatnonzero(np.isnan(self.logprobs[1:])) + 1

    def draft_along(self, nodes: np.ndarray) -> Draft:
        """The walked path as a draft: its tokens, and each node's p_prev, p_gen and age from its source response,
        ages counted as of the newest response's visit (a token of the visit before is one visit older)."""
        sources, positions = self.source[nodes], self.depth[nodes] - 1

        def column(name):
            arrays = [getattr(r, name) for r in self.responses]
            return np.array([arrays[s][p] for s, p in zip(sources.tolist(), positions.tolist())])

        newest = max(r.visit for r in self.responses)
        older = np.array([newest - self.responses[s].visit for s in sources.tolist()], np.int64)
        first = self.responses[int(sources[0])] if len(nodes) else self.responses[0]
        return Draft(
            self.token[nodes].astype(np.int32),
            column("logprobs").astype(np.float32),
            "stop" if len(nodes) and self.stop[nodes[-1]] else "length",
            first.visit,
            first.index,
            gen_logprobs=column("gen_logprobs").astype(np.float32),
            ages=(column("ages").astype(np.int64) + older) if len(nodes) else None,
        )


def walk(tree: DraftTree, uniforms: np.ndarray, own: int | None, max_depth: int) -> Walk:
    """One sample's walk (see the module docstring). `uniforms`: [>= min(tree.max_depth, max_depth) + 1] float64, one
    per position; `own`: the sample's own previous response (its branch's children come first), or None; `max_depth`:
    the sample's token budget."""
    probs = np.exp(tree.logprobs.astype(np.float64))  # [N], NaN where unknown
    branch = own if own is not None and 0 <= own < len(tree.paths) else 0
    depth, switches = 0, 0
    while True:
        path = tree.paths[branch]
        end = min(len(path), max_depth)
        segment = path[depth:end]
        stops = np.flatnonzero(tree.stop[segment])
        if len(stops):  # a response ended here: nothing follows (the stop node itself can be kept)
            end = depth + int(stops[0]) + 1
            segment = path[depth:end]
        leaves = np.flatnonzero(~(uniforms[depth:end] <= probs[segment]))  # NaN p: not kept on this branch
        if len(leaves) == 0:
            depth = end
            node = int(path[depth - 1]) if depth else ROOT
            if depth >= max_depth or tree.stop[node]:
                return Walk(path[:depth].copy(), (), 0.0, False, bool(tree.stop[node]) and depth > 0, switches, branch)
            on_branch = None  # past the branch's end: the node's other children, if any
        else:
            depth += int(leaves[0])
            node = int(path[depth - 1]) if depth else ROOT
            on_branch = int(path[depth])
        children = tree.children(node)
        known = children[np.isfinite(probs[children])]
        others = known[known != on_branch]
        first = probs[on_branch] if on_branch is not None and np.isfinite(probs[on_branch]) else 0.0
        cumulative = first + np.cumsum(probs[others])  # [c]
        pick = int(np.searchsorted(cumulative, uniforms[depth], side="left"))  # first with u <= cumulative
        if pick < len(others):
            branch = int(tree.source[others[pick]])
            depth += 1
            switches += 1
            continue
        mass = float(min(probs[known].sum(), 1.0)) if len(known) else 0.0
        excluded = tuple(int(t) for t in tree.token[known])
        return Walk(path[:depth].copy(), excluded, mass, bool(len(known)), False, switches, branch)
