"""The one way in to a drafter: `resolve` makes it for a loaded pair from its name, `why_not` says why it cannot.

A drafter's registry entry (core.drafters.DrafterSpec) declares what it drafts from: the small
draft model, the pair's trained head, a memory, and any further resource by name. Here those
declarations meet a loaded pair: each part is filled from the pair, and a missing one becomes
one sentence for the page, the lab and the command line alike. A new kind of resource is one
`register_resource` call beside the drafter that needs it; no caller changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specviz.core import drafters
from specviz.core import memory as memories

if TYPE_CHECKING:
    from specviz.core.drafters.model import QMemo
    from specviz.core.drafters.tree import TreeConfig
    from specviz.core.memory import Memory
    from specviz.core.rounds import Drafter


@dataclass(frozen=True)
class Resource:
    """A kind of part a drafter may declare (`DrafterSpec.resources`), and how a pair provides it."""

    name: str
    provide: Callable[[Any], Any]  # the pair -> the part, or None where this pair has none
    missing: str  # why a pair without it cannot run the drafter, in a visitor's words ("it has no phrase book")


_RESOURCES: dict[str, Resource] = {}


def register_resource(resource: Resource) -> Resource:
    """Add a kind of part (or replace one of the same name); returns it."""
    _RESOURCES[resource.name] = resource
    return resource


def unregister_resource(name: str) -> None:
    _RESOURCES.pop(name, None)


@dataclass(frozen=True)
class Models:
    """A pair's parts held directly (a lab or a test with models of its own, no LoadedPair around them)."""

    target: Any
    draft: Any = None
    head: Any = None
    head_problem: str | None = None


def why_not(name: str, pair: Any) -> str | None:
    """Why this pair cannot run the named drafter (one sentence), or None when it can.

    Reading the head builds it on first use: it is asked only of a drafter that drafts with it.
    """
    kind = drafters.spec(name)
    reason = _missing(kind, pair)
    return None if reason is None else f"This pair cannot run the {kind.title}: {reason.rstrip('.')}."


def _missing(kind: drafters.DrafterSpec, pair: Any) -> str | None:
    if kind.needs_draft_model and getattr(pair, "draft", None) is None:
        return "it has no small draft model"
    if kind.needs_head and getattr(pair, "head", None) is None:
        return getattr(pair, "head_problem", None) or "it ships no trained head (train one: python -m specviz train-head)"
    for wanted in kind.resources:
        resource = _RESOURCES.get(wanted)
        if resource is None:
            return f"it needs a {wanted}, and nothing on this server provides one"
        if resource.provide(pair) is None:
            return resource.missing
    return None


def can_run(name: str, pair: Any) -> bool:
    return why_not(name, pair) is None


def resolve(name: str, pair: Any, *, adaptive: bool = False, tree: TreeConfig | None = None,
            q_memo: QMemo | None = None, memory: Memory | None = None) -> Drafter:
    """The named drafter for this pair, every part it declares filled from the pair.

    `memory` is what a remembering drafter drafts from; left out, it is the shared memory (the pair's
    datastore only, so that no visitor's text reaches another's screen: the privacy rule in core.memory).
    Raises ValueError with `why_not`'s sentence where the pair lacks a part.
    """
    problem = why_not(name, pair)
    if problem is not None:
        raise ValueError(problem)
    kind = drafters.spec(name)
    if kind.remembers and memory is None and hasattr(pair, "spec"):  # a bare Models has no datastore of its own
        memory = memories.shared_memory(name, pair)
    extra = {wanted: _RESOURCES[wanted].provide(pair) for wanted in kind.resources}
    return drafters.build(name, getattr(pair, "draft", None), pair.target, adaptive=adaptive, tree=tree, q_memo=q_memo,
                          memory=memory if kind.remembers else None,
                          head=pair.head if kind.needs_head else None, extra=extra)
