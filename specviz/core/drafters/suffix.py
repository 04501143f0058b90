"""The suffix drafter (SuffixDecoding-style): a helper that remembers instead of a model.

Each round it matches the longest suffix of the text against this text so far, this visitor's
earlier runs, the class's (only when the operator turned that on) and a read-only datastore, and
proposes a tree of what followed the match there, each node scored by how often it followed.
How deep it drafts adapts to the match: at most `spec_factor` × the match's length, so a long,
often-seen match drafts far and a one-token match drafts little. Every node is a deterministic
pick, which the tree rule tries as a one-hot draft (accepted with probability p(x)), so the text
stays exact whatever the memory proposes; the q rows it records are its empirical frequencies.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from specviz.core.drafters import Parts
from specviz.core.memory import Match, Memory, SuffixIndex
from specviz.core.rounds import Kept, Round, RunTools, Session, Steps, tree_round
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import RoundTrace
from specviz.core.tree_rule import DraftTree


@dataclass(frozen=True)
class SuffixConfig:
    """How far and how wide the memory drafts (vLLM's suffix method has the same knobs and similar defaults)."""

    max_match: int = 32  # tokens of the text's end matched at most
    max_depth: int = 32  # tokens on one branch at most
    spec_factor: float = 1.0  # a branch goes at most match length × this deep (SuffixDecoding's max_spec_factor)
    min_prob: float = 0.1  # a node is drafted only if at least this share of the occurrences continue through it
    max_nodes: int = 32  # nodes the target verifies per round at most
    # On a CPU every verified node costs target time (a GPU verifies dozens nearly free), so a short match drafts
    # little: at most match length × spec_factor nodes in all, not only that deep; and a match in the datastore
    # (other people's code) shorter than this many tokens drafts nothing. Measured cold on the presets (qwen-coder,
    # 32 tokens): of the datastore's 1-2 token matches' drafts 4 of 98 were accepted while each drafted token
    # lengthened its verify pass by 3-6 ms of a 52-56 ms pass; of its 3-4 token matches', 8 of 45.
    datastore_min_match: int = 3
    max_occurrences: int = 32  # occurrences of the match read (the latest ones)

    def __post_init__(self) -> None:
        for name in ("max_match", "max_depth", "max_nodes", "max_occurrences", "datastore_min_match"):
            if getattr(self, name) < 1:
                raise ValueError(f"suffix {name} must be at least 1")
        if self.spec_factor <= 0 or not 0.0 <= self.min_prob <= 1.0:
            raise ValueError("suffix spec_factor must be > 0 and min_prob in [0, 1]")


@dataclass(frozen=True)
class MemoryDraft:
    """One round's proposal from memory: the tree, where it came from, and how sure the memory is."""

    tree: DraftTree
    source: str  # a key of memory.SOURCE_WORDS; "" when nothing matched
    match_length: int
    score: float  # the expected number of accepted tokens by the memory's own counts (the sum of its path probabilities)


@dataclass(frozen=True)
class Ranked:
    """A match's continuations ranked into tree nodes (no q yet: only the winning source's tree gets one)."""

    source: str
    match_length: int
    tokens: tuple[int, ...]  # node tokens, parents before children, siblings in try order
    parents: tuple[int, ...]  # parent node of each (-1 = the root)
    probs: tuple[float, ...]  # each node's path probability by the memory's counts

    @property
    def score(self) -> float:
        """The expected number of accepted tokens by the memory's own counts."""
        return sum(self.probs)


def rank_continuations(match: Match, config: SuffixConfig) -> Ranked:
    """The most frequent continuations of a match as tree nodes: best first by path probability."""
    length_cap = max(1, int(match.length * config.spec_factor))  # a short match drafts little: so deep, so many nodes
    depth_cap = min(config.max_depth, length_cap)
    total = len(match.continuations)
    counts = Counter(cont[:d] for cont in match.continuations for d in range(1, min(len(cont), depth_cap) + 1))
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for prefix in counts:
        children.setdefault(prefix[:-1], []).append(prefix)
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    node_of: dict[tuple[int, ...], int] = {(): -1}
    heap = [(-counts[c] / total, c) for c in children.get((), ())]
    heapq.heapify(heap)  # highest path probability first; a child never beats its parent, so parents come first
    node_cap = min(config.max_nodes, length_cap)
    while heap and len(tokens) < node_cap:
        neg, prefix = heapq.heappop(heap)
        if -neg < config.min_prob:
            break
        node_of[prefix] = len(tokens)
        tokens.append(prefix[-1])
        parents.append(node_of[prefix[:-1]])
        probs.append(-neg)
        for c in children.get(prefix, ()):
            heapq.heappush(heap, (-counts[c] / total, c))
    return Ranked(match.source if tokens else "", match.length, tuple(tokens), tuple(parents), tuple(probs))


def as_draft(ranked: Ranked, vocab: int) -> MemoryDraft:
    """The ranked nodes as a DraftTree whose q rows are the memory's own frequencies after the root and each node."""
    q = torch.zeros(len(ranked.tokens) + 1, vocab)  # (n+1, V)
    for i, (tok, par) in enumerate(zip(ranked.tokens, ranked.parents)):
        q[par + 1, tok] = ranked.probs[i] / (ranked.probs[par] if par >= 0 else 1.0)
    tree = DraftTree(tokens=ranked.tokens, parents=ranked.parents, sampled=(False,) * len(ranked.tokens), q=q)
    return MemoryDraft(tree, ranked.source, ranked.match_length, ranked.score)


def continuation_tree(match: Match, config: SuffixConfig, vocab: int) -> MemoryDraft:
    """The most frequent continuations of a match as a tree (ranked, then given its q rows)."""
    return as_draft(rank_continuations(match, config), vocab)


def with_source(trace: RoundTrace, draft: MemoryDraft | None) -> RoundTrace:
    """The round's trace with where its memory draft came from (unchanged when the memory drafted nothing)."""
    if draft is None or not draft.source:
        return trace
    return replace(trace, memory_source=draft.source, match_length=draft.match_length)


class SuffixSession(Session):
    """The suffix drafter bound to one run: it searches its sources each round and writes its run into memory."""

    def __init__(self, memory: Memory, config: SuffixConfig, vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.memory = memory
        self.sources = memory.sources()  # indexed once, at the run's start: the runs before this one
        self.keys = memory.new_keys()
        self.last: MemoryDraft | None = None  # the latest proposal (its round's trace reads where it came from)

    def rank(self, ids: Sequence[int], max_depth: int, min_length: int = 1) -> Ranked:
        """The most promising continuations over every source (by expected accepted tokens; this text first on a
        tie), from matches at least `min_length` long (the datastore's at least `datastore_min_match`); no q yet."""
        cfg = self.config
        depth = min(cfg.max_depth, max_depth)
        text = SuffixIndex([ids], self.vocab_size)
        found = [text.match(ids, "text", cfg.max_match, depth, cfg.max_occurrences, min_length)]
        found += [index.match(ids, source, cfg.max_match, depth, cfg.max_occurrences,
                              max(min_length, cfg.datastore_min_match) if source == "datastore" else min_length)
                  for source, index in self.sources]
        ranked = [rank_continuations(m, cfg) for m in found if m.length]
        return max(ranked, key=lambda r: r.score, default=Ranked("", 0, (), (), ()))  # max keeps the first of equals

    def best(self, ids: Sequence[int], max_depth: int) -> MemoryDraft:
        """The most promising tree over every source, with its q rows (made for the winner only: a vocabulary-wide
        row per node)."""
        self.last = as_draft(self.rank(ids, max_depth), self.vocab_size)
        return self.last

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]:
        yield from ()  # a memory needs no model pass
        return self.best(ids, max_depth).tree

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        yield from ()
        self.memory.note(self.keys, ids)

    def hear(self, kept: Kept) -> None:
        self.memory.note(self.keys, kept.ids)

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        self.last = None
        trace = yield from tree_round(self, r, tools)
        return with_source(trace, self.last)


@dataclass(frozen=True, eq=False)
class SuffixDrafter:
    """Drafts from memory: this text, earlier runs and a datastore (no model)."""

    memory: Memory
    config: SuffixConfig = SuffixConfig()
    name: str = "suffix"

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> SuffixSession:
        return SuffixSession(self.memory, self.config, vocab_size)


def from_parts(parts: Parts) -> SuffixDrafter:
    """The registry's "suffix" drafter: the run's memory (none given: this text only, remembered by nobody)."""
    return SuffixDrafter(parts.memory if parts.memory is not None else Memory())
