"""The batched executor: many runs of one pair advance together, every pass they ask for in a tick served by one forward per model.

Continuous batching as the serving engines do it, on this project's round seam: each run is a
program (`core.engine.run_program`) that yields Feeds and RoundTraces. A tick first serves the
drafts — every run that wants the draft model gets its rows in one draft forward, again and
again until no run is drafting — then every run that wants the target gets its rows in one
target forward. So a class's γ-token drafts cost γ shared draft passes and one shared verify
pass, and target-only baselines ride along one token per tick. Runs join and leave between
ticks. Each run keeps its own caches and attends over its own positions only (core.forward),
and is timed by its own clock (core.clock: the passes it took part in, not the wait for others');
the target packs runs only where `serve.exact` measured that this changes no bit, and never more
than the rows it checked; elsewhere each run gets a forward of its own (`serve.exact` says why).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from specviz.core.clock import run_clock
from specviz.core.engine import Program
from specviz.core.forward import Feed, Pass, forward
from specviz.core.trace import Generation, RoundTrace
from specviz.serve.exact import MAX_ROWS, Exactness, batch_exactness

# Runs advancing together at most; more wait their turn (first come, first served). The one limit of the executor,
# the server's included: a class of 30 pressing Play at once brings 60 runs (each with its target-only baseline),
# and 40 of them advance together. How many rows one target forward packs is serve.exact's MAX_ROWS, a separate
# bound: a tick packs runs up to it and serves the rest in further forwards.
MAX_RUNS = 40


@dataclass(frozen=True)
class SharedRun:
    """What a server job hands the batch: a run's program and the target it verifies with."""

    program: Program
    target: torch.nn.Module


@dataclass(frozen=True)
class Sharing:
    """How a run's target passes were shared: what its page says ("8 runs shared its passes")."""

    passes: int  # target forwards that scored this run's rows
    runs_total: int  # the runs in those forwards, summed (so mean = runs_total / passes)
    most: int  # the most runs one of them served

    @property
    def mean(self) -> float:
        return self.runs_total / self.passes if self.passes else 1.0


@dataclass
class _Run:
    """One admitted run (mutable scratch of the executor)."""

    key: Hashable
    program: Program
    target: torch.nn.Module
    on_round: Callable[[RoundTrace], None]
    pending: Feed | None = None  # the pass it waits for
    answer: Pass | BaseException | None = None  # the pass's answer to send it next (or the error its pass raised)
    busy_s: float = 0.0  # its clock: its own code and the passes that included its rows (core.clock)
    passes: int = 0
    runs_total: int = 0
    most: int = 0

    def sharing(self) -> Sharing:
        return Sharing(self.passes, self.runs_total, self.most)


@dataclass(frozen=True)
class Outcome:
    """How one run ended: its Generation, or the error that stopped it (it stopped nobody else)."""

    key: Hashable
    generation: Generation | None
    error: BaseException | None
    sharing: Sharing


@dataclass
class Batch:
    """Runs advancing together. `add` between ticks; `tick` until `active` is empty; each finished run comes back as an Outcome."""

    max_runs: int = MAX_RUNS
    max_rows: int = MAX_ROWS
    exactness: Callable[[torch.nn.Module, int], Exactness] = batch_exactness
    runs: list[_Run] = field(default_factory=list)
    ticks: int = 0

    @property
    def active(self) -> int:
        return len(self.runs)

    @property
    def room(self) -> int:
        return self.max_runs - len(self.runs)

    def add(self, key: Hashable, program: Program, target: torch.nn.Module,
            on_round: Callable[[RoundTrace], None] = lambda _: None) -> None:
        """Admit a run (it starts at the next tick); `target` is the model it verifies with."""
        if self.room <= 0:
            raise RuntimeError(f"the batch is full ({self.max_runs} runs)")
        self.runs.append(_Run(key, program, target, on_round))

    def cancel(self, key: Hashable) -> None:
        """Drop a run between ticks (its program is closed; nobody else notices)."""
        for run in [r for r in self.runs if r.key == key]:
            run.program.close()
            self.runs.remove(run)

    def tick(self) -> list[Outcome]:
        """Advance every run by one round's worth of passes: drafts until none is drafting, then one target forward."""
        self.ticks += 1
        done = self._advance(self.runs)
        targets = {id(r.target) for r in self.runs}
        while drafting := [r for r in self.runs if r.pending is not None and id(r.pending.model) not in targets]:
            self._serve(drafting, shared=True)
            done += self._advance(drafting)
        waiting = [r for r in self.runs if r.pending is not None]
        by_target: dict[int, list[_Run]] = {}
        for r in waiting:
            by_target.setdefault(id(r.pending.model), []).append(r)  # type: ignore[union-attr]
        for group in by_target.values():
            exact = self.exactness(group[0].pending.model, self.max_rows).exact  # type: ignore[union-attr]
            self._serve(group, shared=exact)
        return done + self._advance(waiting)

    def _serve(self, runs: list[_Run], shared: bool) -> None:
        """Answer the runs' pending feeds: packed up to max_rows a forward where shared, else one run a forward.

        Runs whose pass is the same first pass (a class pressing Play on one preset) ride on one of them: its rows
        are computed once and its keys/values and answer copied to its twins (see `_twin_key`). That holds where
        runs are not packed too: a twin's own pass would be the same rows alone, the same computation bit for bit."""
        firsts, twins = _twins(runs)
        for chunk in _chunks(firsts, self.max_rows if shared else 0):
            feeds: list[Feed] = [r.pending for r in chunk]  # type: ignore[misc]
            before = [_lengths(f.cache) for f in feeds] if len(feeds) > 1 else []
            t0 = time.perf_counter()
            try:
                answers: list[Any] = forward(feeds[0].model, feeds)
            except Exception as exc:  # noqa: BLE001 - one run's bad pass must not fail the others: undo, then each alone
                answers = _one_by_one(feeds, before) if before else [exc]
            target_pass = chunk[0].pending.model is chunk[0].target  # type: ignore[union-attr]
            members = [(r, a) for r, a in zip(chunk, answers)]
            members += [(t, _copy_pass(r.pending, t.pending, a)) for r, a in members for t in twins.get(id(r), ())]
            wall = time.perf_counter() - t0
            for r, a in members:
                r.answer, r.pending = a, None
                r.busy_s += wall  # a shared pass counts in full for every run in it
                if target_pass:
                    r.passes, r.runs_total, r.most = r.passes + 1, r.runs_total + len(members), max(r.most, len(members))

    def _advance(self, runs: Sequence[_Run]) -> list[Outcome]:
        """Send each run what it waits for and run it to its next pass (publishing rounds); finished runs leave."""
        done: list[Outcome] = []
        for r in list(runs):
            if r.pending is not None:
                continue
            try:
                while True:
                    answer, r.answer = r.answer, None
                    if isinstance(answer, BaseException):
                        raise answer
                    item = _resume(r, answer)
                    if isinstance(item, Feed):
                        r.pending = item
                        break
                    r.on_round(item)
            except StopIteration as stop:
                done.append(Outcome(r.key, stop.value, None, r.sharing()))
                self.runs.remove(r)
            except Exception as exc:  # noqa: BLE001 - reported as this run's failure only
                done.append(Outcome(r.key, None, exc, r.sharing()))
                self.runs.remove(r)
        return done


def _resume(r: _Run, answer: Any) -> Any:
    """Run r's program to its next item, with r's clock running meanwhile."""
    start, base = time.perf_counter(), r.busy_s
    try:
        with run_clock(lambda: base + time.perf_counter() - start):
            return r.program.send(answer)
    finally:
        r.busy_s = base + time.perf_counter() - start


def _chunks(runs: list[_Run], max_rows: int) -> list[list[_Run]]:
    """Consecutive runs whose rows fit in max_rows together (a bigger pass, or max_rows 0, goes alone)."""
    out: list[list[_Run]] = []
    rows = 0
    for r in runs:
        n = r.pending.rows  # type: ignore[union-attr]
        if out and rows + n <= max_rows:
            out[-1].append(r)
            rows += n
        else:
            out.append([r])
            rows = n
    return out


def _twin_key(feed: Feed) -> tuple | None:
    """What makes two runs' passes one pass: the first pass of one model (empty cache, plain causal rows) over the same rows.

    Only a first pass qualifies: two caches that hold the same ids hold the same keys/values only if both
    were filled by passes of the same rows, which nothing here tracks; an empty cache holds nothing to differ."""
    if feed.mask is not None or feed.cache.get_seq_length() != 0:
        return None
    if any(type(layer) is not DynamicLayer for layer in feed.cache.layers):  # a sliding layer keeps a count of its own
        return None
    return id(feed.model), feed.ids, feed.positions, feed.first_logit, feed.layers, feed.first_hidden


def _twins(runs: list[_Run]) -> tuple[list[_Run], dict[int, list[_Run]]]:
    """The runs whose passes are computed (one of each set of twins), and each one's twins by id."""
    firsts: list[_Run] = []
    first_of: dict[tuple, _Run] = {}
    twins: dict[int, list[_Run]] = {}
    for r in runs:
        key = _twin_key(r.pending)  # type: ignore[arg-type]
        if key is not None and key in first_of:
            twins.setdefault(id(first_of[key]), []).append(r)
            continue
        if key is not None:
            first_of[key] = r
        firsts.append(r)
    return firsts, twins


def _copy_pass(done: Feed | None, twin: Feed | None, answer: Any) -> Any:
    """Give a twin's cache the keys/values its first run's pass stored, and a copy of that pass's answer."""
    if isinstance(answer, BaseException):
        return answer  # the same rows fail the same way
    assert done is not None and twin is not None
    for layer_idx, layer in enumerate(done.cache.layers):
        if layer.is_initialized:  # copied by the cache's own update (a concatenation onto its empty tensors)
            twin.cache.update(layer.keys, layer.values, layer_idx)
    return Pass(answer.logits.clone(), tuple(h.clone() for h in answer.hidden))


def _lengths(cache: Any) -> list[int]:
    return [layer.get_seq_length() if layer.is_initialized else 0 for layer in cache.layers]


def _one_by_one(feeds: list[Feed], before: list[list[int]]) -> list[Any]:
    """After a failed packed pass: crop each run's cache back to where it was, then answer each alone (an error becomes that run's answer)."""
    answers: list[Any] = []
    for f, lengths in zip(feeds, before):
        for layer, was, now in zip(f.cache.layers, lengths, _lengths(f.cache)):
            if now > was:
                layer.crop(was - now)
        try:
            answers.append(forward(f.model, [f])[0])
        except Exception as exc:  # noqa: BLE001
            answers.append(exc)
    return answers


def run_together(programs: Sequence[Program], target: torch.nn.Module, max_rows: int = MAX_ROWS,
                 max_runs: int = MAX_RUNS, exactness: Callable[[torch.nn.Module, int], Exactness] = batch_exactness,
                 ) -> tuple[list[Generation], list[Sharing], float]:
    """Run programs to the end together, all admitted at once up to max_runs, the rest as room frees (first come, first served).

    Returns their Generations in order, how each one's target passes were shared, and the wall time in seconds.
    A failing run raises here (the command line and tests want to know). `exactness` decides whether runs may share
    a pass (default: only where the model's rows are bit-independent of what shares their pass).
    """
    batch = Batch(max_runs=max_runs, max_rows=max_rows, exactness=exactness)
    waiting = list(enumerate(programs))
    results: dict[int, Outcome] = {}
    t0 = time.perf_counter()
    while waiting or batch.active:
        while waiting and batch.room > 0:
            i, program = waiting.pop(0)
            batch.add(i, program, target)
        for outcome in batch.tick():
            if outcome.error is not None:
                raise outcome.error
            results[outcome.key] = outcome  # type: ignore[index]
    wall = time.perf_counter() - t0
    order = sorted(results)
    return [results[i].generation for i in order], [results[i].sharing for i in order], wall  # type: ignore[misc]
