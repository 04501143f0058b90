"""What a suffix drafter remembers: token texts indexed by a suffix array, one visitor's earlier runs, and where a match came from.

A `SuffixIndex` holds some token sequences (documents) and answers one question fast: the longest
suffix of the current text that occurs in them, and what followed each occurrence. The suffix array
is built by pydivsufsort (libdivsufsort), not by hand. A `RunMemory` keeps the texts of earlier runs,
bounded (the least recently used run goes first), and re-indexes them only when a new run starts.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pydivsufsort

# where a drafted continuation was found: the words a page shows beside a memory draft
SOURCE_WORDS = {
    "text": "earlier in this text (the prompt and what was written so far)",
    "visitor": "your earlier run",
    "class": "the class's earlier runs",
    "datastore": "the datastore",
}


@dataclass(frozen=True)
class Match:
    """The longest suffix of the current text found in one index, and the tokens that followed it there."""

    source: str  # a key of SOURCE_WORDS
    length: int  # tokens matched (0: nothing matched)
    continuations: tuple[tuple[int, ...], ...]  # what followed each occurrence (most recent first), cut at a document's end


class SuffixIndex:
    """Token documents joined into one array, with its suffix array (documents never run into each other)."""

    def __init__(self, docs: Sequence[Sequence[int]], vocab_size: int) -> None:
        self.vocab_size = vocab_size
        parts: list[np.ndarray] = []
        for i, doc in enumerate(docs):
            arr = np.asarray(doc, dtype=np.int64)
            if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
                raise ValueError(f"document {i} holds ids outside the vocabulary (0..{vocab_size - 1})")
            # each document ends with a separator of its own (an id past the vocabulary), so no match crosses two
            parts.extend((arr, np.array([vocab_size + i], dtype=np.int64)))
        self.text = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.sa = pydivsufsort.divsufsort(self.text) if self.text.size else np.zeros(0, dtype=np.int64)
        self.tokens = int(self.text.size - len(docs))

    def documents(self) -> list[np.ndarray]:
        """The documents as they were given, each without its separator."""
        ends = np.flatnonzero(self.text >= self.vocab_size)
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        return [self.text[a:b] for a, b in zip(starts.tolist(), ends.tolist())]

    def _range(self, pattern: list[int]) -> tuple[int, int]:
        """The suffix array's rows whose suffixes start with pattern (binary search; each key is a short slice)."""
        m, text = len(pattern), self.text
        lo = bisect.bisect_left(self.sa, pattern, key=lambda i: text[i:i + m].tolist())
        hi = bisect.bisect_right(self.sa, pattern, key=lambda i: text[i:i + m].tolist(), lo=lo)
        return lo, hi

    def _occurs(self, pattern: list[int]) -> np.ndarray:
        """Start positions of pattern that have a token after them in the same document."""
        lo, hi = self._range(pattern)
        starts = np.asarray(self.sa[lo:hi])
        # every document ends with a separator, so starts + len(pattern) stays inside the text; a separator is not
        # a continuation
        return starts[self.text[starts + len(pattern)] < self.vocab_size]

    def longest_match(self, ids: Sequence[int], max_length: int, min_length: int = 1) -> tuple[int, np.ndarray]:
        """The longest m in min_length..max_length with ids[-m:] followed by something here, and the start positions
        of ids[-m:] (m = 0: none that long).

        Whether ids[-m:] occurs is monotone in m (an occurrence of a longer suffix holds one of every shorter one),
        so m is found by a binary search: a few suffix-array searches per round, one when not even min_length occurs.
        """
        tail = list(ids[-max_length:])
        best, starts = 0, np.zeros(0, dtype=np.int64)
        lo, hi = max(1, min_length), len(tail)
        if lo > 1 and lo <= hi:  # the shortest length asked for first: usually it is all a cold lookup has to try
            found = self._occurs(tail[len(tail) - lo:])
            if not found.size:
                return best, starts
            best, starts, lo = lo, found, lo + 1
        while lo <= hi:
            m = (lo + hi) // 2
            found = self._occurs(tail[len(tail) - m:])
            if found.size:
                best, starts, lo = m, found, m + 1
            else:
                hi = m - 1
        return best, starts

    def match(self, ids: Sequence[int], source: str, max_length: int, depth: int, max_occurrences: int,
              min_length: int = 1) -> Match:
        """The longest match of ids' suffix (at least min_length long), and up to `depth` tokens after each of its
        latest occurrences."""
        m, starts = self.longest_match(ids, max_length, min_length)
        if not m:
            return Match(source, 0, ())
        latest = np.sort(starts)[::-1][:max_occurrences]  # later in the store = more recent (runs are appended)
        conts = []
        for s in latest.tolist():
            follow = self.text[s + m: s + m + depth]
            cut = np.flatnonzero(follow >= self.vocab_size)
            conts.append(tuple((follow[: cut[0]] if cut.size else follow).tolist()))
        return Match(source, m, tuple(conts))


class RunMemory:
    """Earlier runs on one pair (one visitor's, or a whole class's), bounded: the least recently used run goes first.

    A drafter session writes its run's text here as the run goes (`note`, cheap: a tuple kept under the run's key);
    the index is rebuilt only when a session starts and something changed, so a run drafts from every run noted
    before it and never from itself (its own text is searched separately, as "earlier in this text").
    """

    def __init__(self, vocab_size: int, max_runs: int = 64, max_tokens: int = 100_000) -> None:
        if max_runs < 1 or max_tokens < 1:
            raise ValueError("a run memory holds at least one run and one token")
        self.vocab_size = vocab_size
        self.max_runs = max_runs
        self.max_tokens = max_tokens
        self._runs: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._index: SuffixIndex | None = None
        self._lock = threading.Lock()  # the batched executor's sessions of one class share a memory
        self._next_key = 0

    def new_key(self) -> int:
        """A key for one run's text."""
        with self._lock:
            self._next_key += 1
            return self._next_key

    def note(self, key: int, ids: Sequence[int]) -> None:
        """Keep a run's text so far (the prompt and every kept token); it becomes the newest run."""
        with self._lock:
            self._runs[key] = tuple(ids)
            self._runs.move_to_end(key)
            self._index = None
            self._evict()

    def _evict(self) -> None:
        while len(self._runs) > self.max_runs or (len(self._runs) > 1 and self.tokens > self.max_tokens):
            self._runs.popitem(last=False)
        if self.tokens > self.max_tokens:  # one run longer than the whole memory: keep its latest tokens
            key, ids = next(iter(self._runs.items()))
            self._runs[key] = ids[-self.max_tokens:]

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self._runs.values())

    @property
    def runs(self) -> int:
        return len(self._runs)

    def index(self) -> SuffixIndex:
        """The index of every run noted so far (rebuilt when one changed)."""
        with self._lock:
            if self._index is None:
                self._index = SuffixIndex(list(self._runs.values()), self.vocab_size)
            return self._index


@dataclass(frozen=True, eq=False)
class Memory:
    """Everything a suffix drafter may draft from besides the current text: the visitor's runs, the class's, a datastore."""

    visitor: RunMemory | None = None  # this visitor's (or this command's) earlier runs on the pair
    shared: RunMemory | None = None  # every pupil's earlier runs: only when the operator turned class-wide memory on
    datastore: SuffixIndex | None = None  # read-only text built on this machine (`specviz build-datastore`)

    def sources(self) -> tuple[tuple[str, SuffixIndex], ...]:
        """The indexes to search and their sources, the visitor's own first (a tie goes to the nearest memory)."""
        out: list[tuple[str, SuffixIndex]] = []
        if self.visitor is not None:
            out.append(("visitor", self.visitor.index()))
        if self.shared is not None:
            out.append(("class", self.shared.index()))
        if self.datastore is not None:
            out.append(("datastore", self.datastore))
        return tuple(out)

    def note(self, keys: tuple[int, int], ids: Sequence[int]) -> None:
        """Write a run's text so far into every run memory it belongs to."""
        if self.visitor is not None:
            self.visitor.note(keys[0], ids)
        if self.shared is not None:
            self.shared.note(keys[1], ids)

    def new_keys(self) -> tuple[int, int]:
        return (self.visitor.new_key() if self.visitor is not None else 0,
                self.shared.new_key() if self.shared is not None else 0)
