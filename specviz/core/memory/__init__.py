"""Memory, in one place: what a remembering drafter (suffix, hybrid) may draft from, and who may see it.

- `index`: the suffix index (what followed the longest match, and how often), a run memory (earlier runs, bounded)
  and `Memory`, what one run drafts from (its own text first, then the visitor's runs, the class's, the datastore);
- `runs`: a server's run memories, one per visitor and pair and one per pair for the class, bounded;
- `datastore`: the read-only store of code (the Python standard library's sources), built once per pair.

The privacy rule, stated here once and enforced by the two functions below and nowhere else: drafted tokens are drawn
on screen, so a run drafts only from text that everyone who can see the run may see.
- A run whose result anyone may see (a job shared between visitors, a lab, the benchmark) drafts from the datastore
  only: `shared_memory`. Two visitors asking the same thing then get the same drafts.
- A visitor's own run drafts from that visitor's earlier runs on the pair, from the class's runs only where the
  operator turned class-wide memory on, and from the datastore: `visitor_memory`.
"""

from __future__ import annotations

from typing import Any

from specviz.core.memory import datastore
from specviz.core.memory.index import SOURCE_WORDS, Match, Memory, RunMemory, SuffixIndex
from specviz.core.memory.runs import Memories

__all__ = ["SOURCE_WORDS", "Match", "Memory", "Memories", "RunMemory", "SuffixIndex", "datastore", "memory_for",
           "shared_memory", "visitor_memory"]


def shared_memory(drafter: str, pair: Any) -> Memory | None:
    """The memory of a run whose result anyone may see: the datastore only (None for a drafter that does not remember)."""
    from specviz.core import drafters

    return Memory(datastore=datastore.for_pair(pair)) if drafters.spec(drafter).remembers else None


def visitor_memory(pair: Any, memories: Memories, owner: str, class_wide: bool) -> Memory:
    """The memory of one visitor's own run: their earlier runs on the pair, the class's where allowed, the datastore."""
    vocab, name = datastore.vocab_size(pair), pair.spec.name
    return memory_for(pair, visitor=memories.visitor(owner, name, vocab),
                      shared=memories.class_wide(name, vocab) if class_wide else None)


def memory_for(pair: Any, visitor: RunMemory | None = None, shared: RunMemory | None = None) -> Memory:
    """What a remembering drafter drafts from on this pair: the run memories given and the pair's datastore (a command
    line run's own memory; the server's runs go through `visitor_memory` and `shared_memory`)."""
    return Memory(visitor=visitor, shared=shared, datastore=datastore.for_pair(pair))
