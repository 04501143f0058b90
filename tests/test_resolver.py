"""The one way in to a drafter (models.drafting): a drafter that needs a new kind of resource, defined in this file
alone, runs in every lab; a pair without the resource is refused in one sentence, the same everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from specviz.core import drafters
from specviz.core.drafters import DrafterSpec, Parts
from specviz.core.drafters.ngram import find_ngram_continuation
from specviz.core.progress import drain
from specviz.core.rounds import Session, Draft, Steps
from specviz.core.sampling import SamplingConfig
from specviz.core.tree import ChainAsTree
from specviz.models import drafting
from specviz.settings import Settings
from tests.test_drafters import LABS

RESOURCE = "phrase book"  # a kind of part no built-in drafter uses
CHAIN, TREE = "phrasebook", "phrasebook-tree"
PROMPT = "the cat sat on the mat and the cat sat"


@dataclass(frozen=True)
class PhraseBook:
    """The new resource: ids to propose when the text itself offers no match."""

    fallback: tuple[int, ...]


class _PhraseSession(Session):
    def __init__(self, book: PhraseBook, vocab: int) -> None:
        self.book, self.vocab = book, vocab

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()
        tokens = find_ngram_continuation(ids, 3, 1, gamma) or list(self.book.fallback[:gamma])
        q = torch.zeros(len(tokens), self.vocab)
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return Draft(tuple(tokens), q)


@dataclass(frozen=True)
class PhraseDrafter:
    book: PhraseBook
    shape: str
    name: str

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int):
        session = _PhraseSession(self.book, vocab_size)
        return session if self.shape == "chain" else ChainAsTree(session, gamma=3)


def _make(shape: str, name: str):
    def make(parts: Parts) -> PhraseDrafter:
        return PhraseDrafter(parts.extra[RESOURCE], shape, name)  # filled by the resolver from the resource's provider
    return make


@pytest.fixture
def phrasebook():
    """The resource and its two drafters registered from this file; everything removed afterwards."""
    provided: list[object] = []

    def provide(pair: object) -> PhraseBook | None:
        if getattr(pair, "no_phrase_book", False):
            return None
        provided.append(pair)
        return PhraseBook((5, 6, 7))

    drafting.register_resource(drafting.Resource(RESOURCE, provide, "it has no phrase book"))
    common = dict(needs_draft_model=False, needs_features=False, length="variable", leviathan=False,
                  resources=(RESOURCE,))
    drafters.register(DrafterSpec(name=CHAIN, title="phrase book", words="It looks words up.", shape="chain",
                                  make=_make("chain", CHAIN), **common))  # type: ignore[arg-type]
    drafters.register(DrafterSpec(name=TREE, title="phrase book tree", words="It looks words up, as a tree.",
                                  shape="tree", make=_make("tree", TREE), tree_of=CHAIN, **common))  # type: ignore[arg-type]
    yield provided
    drafters.unregister(CHAIN)
    drafters.unregister(TREE)
    drafting.unregister_resource(RESOURCE)


@pytest.fixture(scope="module")
def tiny_pair():
    from specviz import models

    return models.load_pair("tiny-random")


@pytest.mark.parametrize("drafter", [CHAIN, TREE])
@pytest.mark.parametrize("lab", LABS)
def test_a_drafter_with_a_new_resource_runs_in_every_lab(tiny_pair, phrasebook, lab, drafter):
    s = Settings(pair="tiny-random", drafter=drafter, max_new_tokens=10, gamma=3)
    ids = list(tiny_pair.tokenizer(PROMPT)["input_ids"])
    LABS[lab](tiny_pair, ids, s, PROMPT)
    from specviz.labs import how_far

    if not (lab == "how_far" and how_far.unsuited(drafter)):  # a tree has no γ curve: the lab says so and runs nothing
        assert phrasebook, "the resolver never asked the resource's provider"


def test_the_helpers_lab_and_chain_or_tree_take_it_too(tiny_pair, phrasebook):
    from specviz.labs import chain_or_tree, helpers

    cfg = helpers.HelpersConfig("tiny-random", SamplingConfig("greedy"), helpers=(CHAIN, TREE), max_new_tokens=6)
    found = drain(helpers.helpers_steps(tiny_pair, cfg))
    assert {p.helper for p in found.points} == {CHAIN, TREE} and all(p.identical for p in found.points)
    assert chain_or_tree.helper_for(TREE) == CHAIN and drafters.chain_and_tree(CHAIN) == (CHAIN, TREE)
    shapes = drain(chain_or_tree.shape_steps(tiny_pair, chain_or_tree.make_config("tiny-random", [3], SamplingConfig(),
                                                                                  helper=CHAIN)))
    assert {p.shape for p in shapes.points} == {"chain", "tree"} and all(p.identical for p in shapes.points)


def test_a_pair_without_the_resource_is_refused_in_one_sentence_everywhere(tiny_pair, phrasebook):
    from specviz.labs import helpers

    bare = SimpleNamespace(target=tiny_pair.target, draft=None, head=None, head_problem="", no_phrase_book=True)
    said = drafting.why_not(CHAIN, bare)
    assert said == "This pair cannot run the phrase book: it has no phrase book."
    with pytest.raises(ValueError, match="no phrase book"):
        drafting.resolve(CHAIN, bare)
    assert helpers.available(bare, (CHAIN, "ngram")) == (("ngram",), (said,))
    assert drafting.why_not(CHAIN, tiny_pair) is None and drafting.can_run(TREE, tiny_pair)
    with pytest.raises(ValueError, match="resolve it through models.drafting"):
        drafters.build(CHAIN)  # built by hand, the part is missing: the registry says where to get it


def test_why_not_says_what_a_built_in_drafter_lacks():
    bare = SimpleNamespace(target=None, draft=None, head=None, head_problem="")
    assert drafting.why_not("model", bare) == "This pair cannot run the small draft model: it has no small draft model."
    assert "trained head" in drafting.why_not("eagle", bare) and drafting.why_not("ngram", bare) is None
