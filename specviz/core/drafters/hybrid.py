"""The hybrid drafter (SuffixDecoding's hybrid): each round the memory drafts when its match is confident, the draft model otherwise.

The memory is asked first because asking it costs next to nothing. It drafts when its match is
confident: at least `min_match` tokens of the text's end were seen before, and it expects at least
`threshold` accepted tokens by its own counts (a match of a few tokens in the datastore looks sure
by its counts, one occurrence, yet is mostly rejected: measured on the presets). Otherwise the
round is a draft-model chain round of γ tokens. The lookup's time counts as drafting time of the
round either way. Both helpers hear every verdict, so the
draft model's cache follows the text whichever helper drafted, and each trace says which one did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from specviz.core import clock
from specviz.core.clock import ms_since
from specviz.core.drafters import Parts
from specviz.core.drafters.model import ModelDrafter
from specviz.core.drafters.model import from_parts as model_from_parts
from specviz.core.drafters.suffix import MemoryDraft, Ranked, SuffixConfig, SuffixSession, as_draft, with_source
from specviz.core.memory import Memory
from specviz.core.rounds import Draft, Kept, Round, RunTools, Session, Steps, chain_round, tree_round
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import MEMORY_HELPER, MODEL_HELPER, RoundTrace
from specviz.core.tree_rule import DraftTree

# the memory drafts when it expects at least this many accepted tokens (about what a γ = 4 model chain
# gets on the presets) from a match at least MIN_MATCH tokens long (README, "Why these defaults")
THRESHOLD = 3.0
MIN_MATCH = 8


class HybridSession(Session):
    """One run's hybrid: a memory session and a draft-model session, one of them drafting each round."""

    def __init__(self, memory: SuffixSession, model: Session, threshold: float, min_match: int) -> None:
        self.memory = memory
        self.model = model
        self.threshold = threshold
        self.min_match = min_match
        self.features = model.features
        self._tree: MemoryDraft | None = None

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        yield from self.model.prefill(ids)
        yield from self.memory.prefill(ids)

    def hear(self, kept: Kept) -> None:
        self.model.hear(kept)
        self.memory.hear(kept)

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        return self.model.propose_steps(ids, gamma, generator)

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]:
        yield from ()
        assert self._tree is not None, "a memory round is chosen only after the memory answered"
        return self._tree.tree

    def confident(self, found: Ranked) -> bool:
        """Whether the memory drafts this round."""
        return found.match_length >= self.min_match and found.score >= self.threshold

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        self._tree = None
        lookup_ms = 0.0
        if min(r.gamma, r.budget - 1) > 0:
            t = clock.now()
            # only matches as long as the bar are searched for, and q rows are made only for a tree that drafts: a
            # round the model drafts pays one suffix-array search per source
            ranked = self.memory.rank(r.ids, r.budget - 1, min_length=self.min_match)
            found = as_draft(ranked, self.memory.vocab_size) if self.confident(ranked) else None
            lookup_ms = ms_since(t)
            if found is not None:
                self._tree = found
                trace = yield from tree_round(self, r, tools)
                return replace(with_source(trace, found), helper=MEMORY_HELPER, draft_ms=trace.draft_ms + lookup_ms)
        trace = yield from chain_round(self, r, tools)
        return replace(trace, helper=MODEL_HELPER, draft_ms=trace.draft_ms + lookup_ms)


@dataclass(frozen=True, eq=False)
class HybridDrafter:
    """Memory when it is confident, the draft model otherwise."""

    memory: Memory
    model: ModelDrafter
    config: SuffixConfig = SuffixConfig()
    threshold: float = THRESHOLD
    min_match: int = MIN_MATCH
    name: str = "hybrid"

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> HybridSession:
        return HybridSession(SuffixSession(self.memory, self.config, vocab_size),
                             self.model.start(prompt_ids, sampling, vocab_size), self.threshold, self.min_match)


def from_parts(parts: Parts) -> HybridDrafter:
    """The registry's "hybrid" drafter: the run's memory and the pair's draft model (adaptive when asked)."""
    return HybridDrafter(parts.memory if parts.memory is not None else Memory(), model_from_parts(parts))
