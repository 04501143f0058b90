"""The drafter registry: every kind of helper described once (what it needs, its shape, its words) and built by name.

The sidebar, the command line, the checks, the metrics, every lab, the benchmark and the pages
read these entries; none of them spells a drafter's name. Adding a drafter is one module (its
session: a chain proposer for `rounds.chain_round` or a tree proposer for `rounds.tree_round`) and
one `register(DrafterSpec(...))`, here for the built-in kinds or in the new module itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the registry itself imports no torch: the CLI's help and checks read it before any model code loads
    import torch

    from specviz.core.drafters.model import QMemo
    from specviz.core.drafters.tree import TreeConfig
    from specviz.core.head import EagleHead
    from specviz.core.memory import Memory
    from specviz.core.rounds import Drafter

Shape = Literal["chain", "tree"]
Length = Literal["fixed", "variable"]


@dataclass(frozen=True)
class Parts:
    """What a drafter may be built from: the pair's models and the run's drafting options."""

    draft: torch.nn.Module | None = None  # the small draft model (None: the pair has none, or it is not loaded)
    target: torch.nn.Module | None = None  # the target (a drafter that reads the target's features, or shares its weights)
    adaptive: bool = False  # stop an unsure chain early (the sidebar's "adaptive γ")
    tree: TreeConfig | None = None  # a tree's shape (None: TreeConfig's defaults)
    q_memo: QMemo | None = None  # the draft's q rows per prefix, shared by many samples of one prompt (the Same answer lab)
    memory: Memory | None = None  # what a remembering drafter drafts from besides the text (earlier runs, a datastore)
    head: EagleHead | None = None  # the pair's trained draft head (None: the pair ships none, or it was refused)
    extra: Mapping[str, Any] = field(default_factory=dict)  # any further part the kind declares (`DrafterSpec.resources`)


@dataclass(frozen=True)
class DrafterSpec:
    """One kind of helper, described once."""

    name: str  # the id in URLs, the CLI's --drafter, traces and bench files
    title: str  # the sidebar's words for it
    words: str  # one sentence for lessons and help: what it does, for a beginner
    needs_draft_model: bool  # a second, small model must be loaded
    needs_features: bool  # it reads the target's hidden states (Kept.hidden)
    shape: Shape  # chains (γ tokens in a row) or trees (a budget of nodes)
    length: Length  # "fixed": it drafts the γ asked whenever it can; "variable": it decides per round (a lookup finds fewer)
    leviathan: bool  # Leviathan's formula E[tokens per round] = (1 - α^(γ+1)) / (1 - α) describes its rounds
    # builds one from the pair's models (what it needs is checked by `build`): a function, or "module:function",
    # imported on first use, so that reading the registry loads no model code
    make: Callable[[Parts], Drafter] | str
    remembers: bool = False  # it drafts from a memory (earlier runs, a datastore): a run passes it `Parts.memory`
    needs_head: bool = False  # it drafts with the pair's trained head (`Parts.head`; the pair must ship one)
    # further parts by name, each provided by a resource registered with models.drafting (`Parts.extra[name]`)
    resources: tuple[str, ...] = ()
    tree_of: str | None = None  # a tree kind: the chain kind whose guesses it grows into a tree (chain or tree compares them)

    @property
    def gamma_applies(self) -> bool:
        """Whether γ sets how far it guesses (a tree's size is its budget: γ only says whether to draft at all)."""
        return self.shape == "chain"


_REGISTRY: dict[str, DrafterSpec] = {}


def register(spec: DrafterSpec) -> DrafterSpec:
    """Add a kind (or replace one of the same name, so re-importing a module is harmless); returns it."""
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a kind (a test that registered one of its own cleans up with this)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered kind, in registration order (the built-in ones first)."""
    return tuple(_REGISTRY)


def spec(name: str) -> DrafterSpec:
    """A kind's description; a clear error for a name nobody registered."""
    found = _REGISTRY.get(name)
    if found is None:
        raise ValueError(f"unknown drafter {name!r} (choose from {', '.join(_REGISTRY)})")
    return found


def specs() -> tuple[DrafterSpec, ...]:
    return tuple(_REGISTRY.values())


DEFAULT = "model"  # the drafter a run uses unless told otherwise (the sidebar's, the CLI's, every lab's)
NONE = "none"  # a trace's drafter when no drafter ran: the target alone


def is_drafter(name: str) -> bool:
    """A registered kind (False for NONE, the target alone)."""
    return name in _REGISTRY


def chain_and_tree(name: str) -> tuple[str, str] | None:
    """The chain kind and the tree kind of the helper `name` belongs to (either form given), or None where its helper
    drafts only one shape."""
    chain = spec(name).tree_of or name
    tree = next((s.name for s in _REGISTRY.values() if s.tree_of == chain), None)
    return (chain, tree) if tree is not None else None


def shape_pairs() -> tuple[tuple[str, str], ...]:
    """Every helper that drafts both shapes, as (chain kind, tree kind), in registration order."""
    return tuple((s.tree_of, s.name) for s in _REGISTRY.values() if s.tree_of is not None)


def build(name: str, draft: torch.nn.Module | None = None, target: torch.nn.Module | None = None,
          adaptive: bool = False, tree: TreeConfig | None = None, q_memo: QMemo | None = None,
          memory: Memory | None = None, head: EagleHead | None = None, extra: Mapping[str, Any] | None = None) -> Drafter:
    """A drafter by name from the parts given (a kind takes only what it needs).

    Callers with a loaded pair use models.drafting.resolve, which fills the parts from the pair.
    """
    kind = spec(name)
    if kind.needs_draft_model and draft is None:
        raise ValueError(f"the {kind.title} needs a draft model, and this pair has none loaded")
    if kind.needs_features and target is None:
        raise ValueError(f"the {kind.title} reads the target's features: pass the target")
    if kind.needs_head and head is None:
        raise ValueError(f"the {kind.title} needs a trained draft head, and this pair has none loaded "
                         f"(train one with `python -m specviz train-head`)")
    missing = [r for r in kind.resources if (extra or {}).get(r) is None]
    if missing:
        raise ValueError(f"the {kind.title} needs {', '.join(missing)}: resolve it through models.drafting")
    return _maker(kind)(Parts(draft, target, adaptive, tree, q_memo, memory, head, dict(extra or {})))


def _maker(kind: DrafterSpec) -> Callable[[Parts], Drafter]:
    if callable(kind.make):
        return kind.make
    module, _, function = kind.make.partition(":")
    return getattr(importlib.import_module(module), function)


register(DrafterSpec(
    name="model", title="small draft model",
    words="A small, fast model of the same family guesses the next few tokens one after another.",
    needs_draft_model=True, needs_features=False, shape="chain", length="fixed", leviathan=True, make="specviz.core.drafters.model:from_parts"))
register(DrafterSpec(
    name="ngram", title="prompt lookup (n-gram, no second model)",
    words="No second model: it copies what followed the same few tokens earlier in the text, and guesses nothing when "
          "it finds no match.",
    needs_draft_model=False, needs_features=False, shape="chain", length="variable", leviathan=True,
    make="specviz.core.drafters.ngram:from_parts"))
register(DrafterSpec(
    name="tree", title="tree of guesses (small draft model)",
    words="The small draft model guesses several possible continuations at once, as a tree; the big model checks "
          "every branch in one pass and keeps the longest one it agrees with.",
    needs_draft_model=True, needs_features=False, shape="tree", length="variable", leviathan=False, make="specviz.core.drafters.tree:from_parts", tree_of="model"))
register(DrafterSpec(
    name="suffix", title="memory (suffix match, no second model)",
    words="No second model: it remembers. It finds the longest stretch of text that ends like this one, in this text, "
          "your earlier runs or a store of code, and proposes what came next there.",
    needs_draft_model=False, needs_features=False, shape="tree", length="variable", leviathan=False,
    make="specviz.core.drafters.suffix:from_parts", remembers=True))
register(DrafterSpec(
    name="hybrid", title="memory, else the small draft model",
    words="Each round the memory guesses when it has seen this text before; otherwise the small draft model guesses.",
    needs_draft_model=True, needs_features=False, shape="chain", length="variable", leviathan=False,
    make="specviz.core.drafters.hybrid:from_parts", remembers=True))
register(DrafterSpec(
    name="eagle", title="the big model's own notes (EAGLE-style head)",
    words="No second model: one small layer reads the big model's own notes (its last hidden state) and guesses the "
          "next few tokens from them.",
    needs_draft_model=False, needs_features=True, shape="chain", length="fixed", leviathan=True,
    make="specviz.core.drafters.eagle:from_parts", needs_head=True))
register(DrafterSpec(
    name="eagle-tree", title="tree from the big model's own notes (EAGLE-2 style)",
    words="The same small layer on the big model's notes, but it grows a tree of guesses where it is most sure; the "
          "big model checks every branch in one pass.",
    needs_draft_model=False, needs_features=True, shape="tree", length="variable", leviathan=False,
    make="specviz.core.drafters.eagle:tree_from_parts", needs_head=True, tree_of="eagle"))
