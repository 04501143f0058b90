"""One request's KV cache over a shared, read-only causal LM: it says which rows a pass must feed (a Feed), and crops on rollback.

A cache never runs its model: it hands out a Feed (the rows to score after what it holds) and
whoever answers — `forward` alone, or a batched executor with other runs' feeds — extends it.
`logits` and `tree_logits` are the solo answers, for code that scores one request at a time.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specviz.core import profile
from specviz.core.forward import Feed, Pass, causal_mask, forward


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class CachedLM:
    """A per-request KV cache in front of a model that many requests share.

    The cache always holds the keys/values of `self.ids` once the last feed is answered. Asking for
    logits of a new sequence crops the cache back to the common prefix (this is the rollback after a
    rejected draft) and feeds only the rest, so callers never manage cache lengths.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = getattr(model, "device", torch.device("cpu"))  # HF models expose .device
        self.dtype = getattr(model, "dtype", torch.float32)
        self.cache = DynamicCache(config=model.config)
        self.ids: list[int] = []  # ids whose keys/values are in the cache

    def crop(self, length: int) -> None:
        """Forget every cached position from `length` on (DynamicCache.crop takes a negative count)."""
        extra = len(self.ids) - length
        if extra > 0:
            laps = profile.laps()
            laps.mark()
            self.cache.crop(-extra)
            del self.ids[length:]
            laps("kv cache roll-back")

    def feed(self, ids: Sequence[int], n_last: int, layers: tuple[int, ...] = (), hidden_last: int | None = None) -> Feed:
        """The pass that gives logits of the last n_last positions of `ids`, reusing the cache (the ids count as cached from now).

        `layers`: hidden states wanted too, at the last `hidden_last` positions (default n_last; never more than the rows fed).
        """
        keep = min(common_prefix_len(self.ids, ids), len(ids) - n_last)
        self.crop(keep)
        new = tuple(ids[keep:])
        self.ids.extend(new)
        mask = causal_mask(keep, len(new), self.dtype, self.device)
        first_hidden = max(0, len(new) - (n_last if hidden_last is None else hidden_last))
        return Feed(self.model, self.cache, new, tuple(range(keep, keep + len(new))), mask, len(new) - n_last,
                    layers, first_hidden)

    def logits(self, ids: Sequence[int], n_last: int) -> torch.Tensor:
        """Logits (n_last, V) of the last n_last positions of `ids`, from one pass of this request alone."""
        return forward(self.model, [self.feed(ids, n_last)])[0].logits

    def prefill_feed(self, ids: Sequence[int], layers: tuple[int, ...] = ()) -> Feed | None:
        """The pass that caches every id but the last, which the first step feeds itself (None: nothing to cache);
        with `layers`, their hidden states at every position it feeds."""
        return self.feed(list(ids[:-1]), 1, layers, hidden_last=len(ids) - 1) if len(ids) > 1 else None

    def prefill_steps(self, ids: Sequence[int], layers: tuple[int, ...] = ()) -> Generator[Feed, Pass, Pass | None]:
        """The prefill as a program's step: its one pass, if there is anything to cache (its answer is returned)."""
        feed = self.prefill_feed(ids, layers)
        if feed is None:
            return None
        return (yield feed)

    def prefill(self, ids: Sequence[int]) -> None:
        """The prefill, answered alone."""
        for feed in self.prefill_steps(ids):
            forward(self.model, [feed])


class TreeLM(CachedLM):
    """A CachedLM whose cache may end with uncommitted tree entries after the committed `ids`.

    `tree_feed` feeds tree nodes (each sees the committed ids and its ancestors) in one pass;
    `commit` keeps one branch of them by gathering its cached keys/values; a plain `feed` drops the
    tree first, so this class answers every CachedLM question the same way.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.tree_tokens: list[int] = []  # tokens of the cached tree entries, in cache order
        self.tree_parents: list[int] = []  # parent entry of each (-1 = the end of the committed ids)

    def drop_tree(self) -> None:
        """Forget every uncommitted tree entry."""
        if self.tree_tokens:
            self.cache.crop(-len(self.tree_tokens))
            self.tree_tokens, self.tree_parents = [], []

    def feed(self, ids: Sequence[int], n_last: int, layers: tuple[int, ...] = (), hidden_last: int | None = None) -> Feed:
        self.drop_tree()
        return super().feed(ids, n_last, layers, hidden_last)

    def tree_feed(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int], with_root: bool,
                  layers: tuple[int, ...] = ()) -> Feed:
        """The pass that gives logits of new tree nodes (n, V), preceded by the last id's row when with_root: (1+n, V).

        `parents` index the tree entries (those cached before this call come first); -1 hangs a
        node under the last committed id. Ids not yet cached are fed causally in the same pass.
        """
        keep = common_prefix_len(self.ids, ids)
        if with_root:
            keep = min(keep, len(ids) - 1)  # the root's own logits are wanted: feed it again
        if keep < len(self.ids) or keep < len(ids):
            self.drop_tree()  # the committed ids change: tree entries after them are stale
            self.crop(keep)
        chain = list(ids[keep:])
        old = len(self.tree_tokens)
        all_parents = self.tree_parents + list(parents)
        mask, positions = self._tree_mask(len(ids), len(chain), old, all_parents)
        self.ids.extend(chain)
        self.tree_tokens += list(tokens)
        self.tree_parents = all_parents
        first = len(chain) - 1 if with_root else len(chain)
        return Feed(self.model, self.cache, tuple(chain) + tuple(tokens), tuple(positions), mask, first, layers, first)

    def tree_logits(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int], with_root: bool) -> torch.Tensor:
        """`tree_feed`'s logits from one pass of this request alone."""
        return forward(self.model, [self.tree_feed(ids, tokens, parents, with_root)])[0].logits

    def _tree_mask(self, n_committed: int, n_chain: int, n_old: int, parents: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Additive 4-D mask (1, 1, c+n, kv) and position ids (c+n,) of the rows fed now.

        Float, not bool: sdpa takes a float mask as additive, as eager attention does.
        """
        n_tree = len(parents)
        n_new_tree = n_tree - n_old
        kv = n_committed + n_tree
        visible = torch.zeros(n_chain + n_new_tree, kv, dtype=torch.bool)
        start = n_committed - n_chain  # absolute position of the first chain row
        for r in range(n_chain):
            visible[r, : start + r + 1] = True  # causal over the committed ids
        anc = ancestor_matrix(parents)  # (n_tree, n_tree)
        visible[n_chain:, :n_committed] = True  # every node sees the whole committed prefix...
        visible[n_chain:, n_committed:] = anc[n_old:]  # ...and its own ancestors and itself only
        depth = anc.sum(dim=1)  # (n_tree,) ancestors-or-self = depth (1 under the root)
        pos = torch.cat([torch.arange(start, n_committed), n_committed - 1 + depth[n_old:]])  # (c+n,)
        mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, torch.finfo(self.dtype).min)
        return mask[None, None].to(self.device), pos.tolist()

    @torch.inference_mode()
    def commit(self, entries: Sequence[int]) -> None:
        """Keep the cached tree entries on one branch (root to leaf) as committed ids; drop the others.

        Their keys/values are moved into place from the cache itself: positions were already
        prefix length + depth, so the kept rows are exactly what a plain pass would have made.
        """
        entries = [e for e in entries if e < len(self.tree_tokens)]
        base = len(self.ids)
        if entries:
            idx = torch.tensor(entries, dtype=torch.long, device=self.device) + base  # (m,)
            for layer in self.cache.layers:
                if type(layer) is not DynamicLayer:
                    raise NotImplementedError("tree caches need full-attention layers (no sliding window)")
                # index on the right copies first, so overlapping source and destination are safe
                layer.keys[..., base : base + len(entries), :] = layer.keys[..., idx, :]
                layer.values[..., base : base + len(entries), :] = layer.values[..., idx, :]
        extra = len(self.tree_tokens) - len(entries)
        if extra:
            self.cache.crop(-extra)
        self.ids.extend(self.tree_tokens[e] for e in entries)
        self.tree_tokens, self.tree_parents = [], []


def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """(n, n) bool: entry [i, j] is True when node j is node i or one of its ancestors."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, par in enumerate(parents):
        if par >= 0:
            anc[i] = anc[par]
        anc[i, i] = True
    return anc
