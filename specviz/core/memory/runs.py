"""Whose earlier runs a remembering drafter may draft from on a shared server: each visitor's own, and the class's only when the operator allows it.

The drafted tokens are drawn on screen, so a memory of other visitors' runs would show one pupil's
text to another. By default each visitor (one browser) gets a run memory of their own per pair;
a class-wide memory of every pupil's runs is added only when the operator turned it on. Both are
bounded: a visitor's memory by runs and tokens, the number of visitors kept per server (the least
recently seen goes first), and the class's memory per pair.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from specviz.core.memory.index import RunMemory

# A visitor's memory: a lesson's worth of runs (a run is at most a 2,000-character prompt and 256 new tokens,
# under 1,000 tokens). As Python tuples of ints that is at most about 0.6 MB per visitor, 40 MB for 64 visitors.
VISITOR_RUNS = 16
VISITOR_TOKENS = 16_000
MAX_VISITORS = 64  # per server; a class of 30 fits twice
CLASS_RUNS = 128  # the class-wide memory of one pair (only when the operator turned it on)
CLASS_TOKENS = 100_000


@dataclass(frozen=True)
class MemoryUse:
    """What the server's run memories hold now (for the soak and load tests, and an operator's log)."""

    visitors: int  # visitor memories kept (one per visitor and pair)
    runs: int  # runs held in them and in the class memories
    tokens: int  # tokens held in them and in the class memories


class Memories:
    """Every run memory of one server: one per visitor and pair, one per pair for the class."""

    def __init__(self, max_visitors: int = MAX_VISITORS, visitor_runs: int = VISITOR_RUNS,
                 visitor_tokens: int = VISITOR_TOKENS, class_runs: int = CLASS_RUNS,
                 class_tokens: int = CLASS_TOKENS) -> None:
        if max_visitors < 1:
            raise ValueError("a server keeps at least one visitor's memory")
        self.max_visitors = max_visitors
        self._visitor_bounds = (visitor_runs, visitor_tokens)
        self._class_bounds = (class_runs, class_tokens)
        self._visitors: OrderedDict[tuple[str, str], RunMemory] = OrderedDict()
        self._classes: dict[str, RunMemory] = {}
        self._runs_started = 0  # one count for the server: a run's number is never reused, even after its visitor went
        self._lock = threading.Lock()  # pages of many visitors ask at once

    def visitor(self, owner: str, pair: str, vocab_size: int) -> RunMemory:
        """This visitor's memory on this pair (a new, empty one on first use; the least recently seen visitor's goes)."""
        key = (owner, pair)
        with self._lock:
            memory = self._visitors.get(key)
            if memory is None or memory.vocab_size != vocab_size:
                memory = RunMemory(vocab_size, *self._visitor_bounds)
                self._visitors[key] = memory
            self._visitors.move_to_end(key)
            while len(self._visitors) > self.max_visitors:
                self._visitors.popitem(last=False)
            return memory

    def class_wide(self, pair: str, vocab_size: int) -> RunMemory:
        """The class's memory on this pair: every pupil's runs (use only when the operator turned it on)."""
        with self._lock:
            memory = self._classes.get(pair)
            if memory is None or memory.vocab_size != vocab_size:
                memory = self._classes[pair] = RunMemory(vocab_size, *self._class_bounds)
            return memory

    def next_run(self) -> int:
        """A number no run of this server had: a Play that starts a new remembering run (which drafts from the ones before)."""
        with self._lock:
            self._runs_started += 1
            return self._runs_started

    def use(self) -> MemoryUse:
        with self._lock:
            held = [*self._visitors.values(), *self._classes.values()]
            return MemoryUse(len(self._visitors), sum(m.runs for m in held), sum(m.tokens for m in held))
