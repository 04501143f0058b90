"""Background model loading and model jobs for a server: thread-safe, bounded; generation runs share passes in one batch, timing labs run alone."""

from __future__ import annotations

import gc
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from specviz.core.progress import Progress
from specviz.host import CpuSample, cpu_sample
from specviz.serve.batch import MAX_RUNS, Batch, Outcome, SharedRun, Sharing

LoadStatus = Literal["loading", "ready", "failed"]
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
T = TypeVar("T")


@dataclass(frozen=True)
class LoadView(Generic[T]):
    """A snapshot of one pair's loading: what a page draws (progress bar, error or the pair)."""

    status: LoadStatus
    fraction: float  # 0..1, for the progress bar
    message: str  # what the loader is doing now
    pair: T | None  # the loaded pair once ready
    error: str | None  # one-line, user-facing, when failed


class _Load:
    def __init__(self) -> None:
        self.view: LoadView[Any] = LoadView("loading", 0.0, "starting…", None, None)


class PairStore(Generic[T]):
    """Loads each named pair once, in a background thread, so a page rerun never interrupts a load.

    `loader(name, progress)` returns the pair or raises; `user_error(exc)` turns an exception into
    a one-line message. A failed load stays failed until `forget(name)` allows a retry.
    At most `max_ready` pairs are held: starting another load releases the longest-unused ready
    ones (the default pair alone is 4-10 GB; a long-running server must not collect every pair a
    pupil tried). A released pair's memory returns once the runs still using it finish.
    """

    def __init__(self, loader: Callable[[str, Callable[[float, str], None]], T],
                 user_error: Callable[[BaseException], str], max_ready: int = 1) -> None:
        self._loader = loader
        self._user_error = user_error
        self._max_ready = max_ready
        self._lock = threading.Lock()
        self._loads: dict[str, _Load] = {}  # in order of last request: the first ready ones are released first

    def request(self, name: str) -> LoadView[T]:
        """Start loading `name` if needed (releasing pairs beyond max_ready); return its current state."""
        with self._lock:
            load = self._loads.pop(name, None)
            if load is None:
                load = _Load()
                self._release_for_one_more()
                threading.Thread(target=self._run, args=(name, load), daemon=True, name=f"load-{name}").start()
            self._loads[name] = load  # most recently requested last
            return load.view

    def ready(self) -> dict[str, T]:
        """The pairs held now, by name."""
        with self._lock:
            return {n: ld.view.pair for n, ld in self._loads.items() if ld.view.status == "ready" and ld.view.pair is not None}

    def _release_for_one_more(self) -> None:
        """Drop the longest-unused ready pairs so that one more fits under max_ready (called with the lock held)."""
        ready = [n for n, ld in self._loads.items() if ld.view.status == "ready"]
        for n in ready[: max(0, len(ready) - self._max_ready + 1)]:
            del self._loads[n]

    def forget(self, name: str) -> None:
        """Drop a failed load so the next request tries again (a loaded pair is kept)."""
        with self._lock:
            load = self._loads.get(name)
            if load is not None and load.view.status == "failed":
                del self._loads[name]

    def peek(self, name: str) -> LoadView[T] | None:
        """The state of `name` without starting anything."""
        with self._lock:
            load = self._loads.get(name)
            return load.view if load else None

    def _run(self, name: str, load: _Load) -> None:
        def progress(fraction: float, message: str) -> None:
            load.view = LoadView("loading", max(0.0, min(1.0, float(fraction))), str(message), None, None)

        try:
            pair = self._loader(name, progress)
        except BaseException as exc:  # noqa: BLE001 - any failure becomes a friendly message
            load.view = LoadView("failed", 1.0, "failed", None, self._user_error(exc))
            del exc
            gc.collect()  # a load that failed half-way leaves nothing behind (its tensors go now, not later)
        else:
            load.view = LoadView("ready", 1.0, "ready", pair, None)


class RunnerBusy(RuntimeError):
    """The queue is full: the page asks the pupil to try again in a moment instead of piling up work."""


class OwnerBusy(RunnerBusy):
    """This browser already has its share of waiting runs: ten tabs cannot push a class back ten places."""

    @classmethod
    def waiting(cls, n: int) -> OwnerBusy:
        return cls(f"this browser already has {n} runs waiting for the model; they go first, then press again "
                   "(other tabs count too)")


@dataclass(frozen=True)
class JobView:
    """A snapshot of one job: the items it yielded so far (rounds) and, when done, its result."""

    state: JobState
    rounds: tuple[Any, ...]  # every yielded item: RoundTraces of a generation, Progress of a lab job
    generation: Any  # the returned result (a Generation for generation jobs) once done
    error: str | None
    sharing: Sharing | None = None  # a shared run, once done: how many runs its target passes served
    cpu: tuple[CpuSample, CpuSample] | None = None  # a shared run, once done: the machine's CPU at its start and end
    timed: tuple[float, float] | None = None  # once done: wall-clock start and end (time.time()), when it was computed

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    @property
    def result(self) -> Any:
        return self.generation

    @property
    def progress(self) -> Progress | None:
        """The last Progress the job yielded, if it yields any."""
        last = self.rounds[-1] if self.rounds else None
        return last if isinstance(last, Progress) else None


class Job:
    """One job of the worker thread; its yielded items appear here as they are made.

    A job made with `shared=True` builds a SharedRun (a generation's program and its target): the
    worker advances it in one batch with the other shared runs. Any other job runs alone, drained.
    """

    def __init__(self, key: Hashable, make: Callable[[], Any], owner: Hashable | None = None,
                 shared: bool = False) -> None:
        self.key = key
        self.owner = owner  # who asked first (a browser id): counts towards that browser's waiting runs
        self.shared = shared
        self._make = make
        self._lock = threading.Lock()
        self._rounds: list[Any] = []
        self._state: JobState = "queued"
        self._generation: Any = None
        self._error: str | None = None
        self._sharing: Sharing | None = None
        self._cpu_start: CpuSample | None = None
        self._cpu: tuple[CpuSample, CpuSample] | None = None
        self._began: float | None = None
        self._timed: tuple[float, float] | None = None
        self._cancel = threading.Event()

    def view(self) -> JobView:
        with self._lock:
            return JobView(self._state, tuple(self._rounds), self._generation, self._error, self._sharing, self._cpu,
                           self._timed)

    def cancel(self) -> None:
        """Stop after the current round (a queued job never starts)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        """Asked to stop (a queued one will never start, so it no longer counts as waiting)."""
        return self._cancel.is_set()

    def run(self, user_error: Callable[[BaseException], str]) -> None:
        """Drain the generator, publishing each round; never raises."""
        if self._cancel.is_set():
            self._set_state("cancelled")
            return
        self._set_state("running")
        self._began = time.time()
        try:
            steps = self._make()
            self._make = None  # type: ignore[assignment]  # its closure holds the models: a released pair must be freeable
            while True:
                if self._cancel.is_set():
                    steps.close()
                    self._set_state("cancelled")
                    return
                try:
                    trace = next(steps)
                except StopIteration as done:
                    with self._lock:
                        self._generation, self._state = done.value, "done"
                        self._timed = (self._began, time.time())
                    return
                with self._lock:
                    self._rounds.append(trace)
        except BaseException as exc:  # noqa: BLE001 - shown to the user as one line
            with self._lock:
                self._error, self._state = user_error(exc), "failed"

    def _set_state(self, state: JobState) -> None:
        with self._lock:
            self._state = state

    def start_shared(self, user_error: Callable[[BaseException], str]) -> SharedRun | None:
        """Build the run for the batch (None, with the job marked, if it was stopped or could not be built)."""
        if self._cancel.is_set():
            self._set_state("cancelled")
            return None
        try:
            run = self._make()
        except BaseException as exc:  # noqa: BLE001 - shown to the user as one line
            with self._lock:
                self._error, self._state = user_error(exc), "failed"
            return None
        finally:
            self._make = None  # type: ignore[assignment]  # its closure holds the models: a released pair must be freeable
        self._cpu_start = cpu_sample()  # with the one at its end: what other programs took while it was timed
        self._began = time.time()
        self._set_state("running")
        return run

    def publish(self, item: Any) -> None:
        with self._lock:
            self._rounds.append(item)

    def end(self, outcome: Outcome | None, user_error: Callable[[BaseException], str]) -> None:
        """A shared run left the batch: done, failed, or (outcome None) stopped."""
        end = cpu_sample() if self._cpu_start is not None and outcome is not None else None
        with self._lock:
            if outcome is None:
                self._state = "cancelled"
            elif outcome.error is not None:
                self._error, self._state = user_error(outcome.error), "failed"
            else:
                self._generation, self._sharing, self._state = outcome.generation, outcome.sharing, "done"
                self._cpu = (self._cpu_start, end) if self._cpu_start is not None and end is not None else None
                self._timed = (self._began, time.time()) if self._began is not None else None


_IDLE: Any = object()  # what _next_alone answers when the worker has nothing to do


class Runner:
    """One worker thread: generation runs advance together in one batch (continuous batching), other jobs run alone.

    Jobs are keyed: submitting a key that is queued, running or done returns the same job,
    so a view change or a second viewer never re-runs a model. Jobs start first come, first
    served: shared runs join the batch between ticks while it has room; a job that must run alone
    (a timing lab) waits until the batch has drained, then has the models to itself. At most
    `max_queued` jobs wait (more raise RunnerBusy, so a crowd cannot pile up hours of work) and at
    most `max_jobs` are kept, finished ones evicted oldest first.

    The worker thread ends whenever nothing is queued or running, and the next job starts a new one. Why:
    torch's OpenMP runtime (libgomp) keeps a team of threads for every thread that ran a parallel op, and
    while more of them exist than the machine has cores, every team stops spinning and sleeps between ops,
    so each parallel op in any thread pays a wake-up (measured on the 2-core EPYC: a small linear 6 µs ->
    100 µs beside one idle thread that had run torch). An idle worker that stays alive slows every other
    thread's torch work that way; one that ends takes its team with it.
    """

    # A class of 30 pressing Play at once queues 60 jobs (each run brings its target-only baseline).
    def __init__(self, user_error: Callable[[BaseException], str], max_jobs: int = 160, max_queued: int = 72,
                 max_batch: int = MAX_RUNS) -> None:
        self._user_error = user_error
        self._max_jobs = max_jobs
        self._max_queued = max_queued
        self._lock = threading.Condition()
        self._jobs: OrderedDict[Hashable, Job] = OrderedDict()
        self._pending: deque[Job] = deque()
        self._running: Job | None = None
        self._batch = Batch(max_runs=max_batch)
        self._members: dict[int, Job] = {}  # the shared runs in the batch, by id(job)
        self._working = False  # a worker thread is running (it ends when idle; `submit` starts the next)

    def submit(self, key: Hashable, make: Callable[[], Any], owner: Hashable | None = None,
               owner_limit: int | None = None, shared: bool = False) -> Job:
        """The job for `key`, created and queued if there is none (or the last one failed or was stopped).

        With an `owner`, at most `owner_limit` of its new jobs wait at once (OwnerBusy beyond that);
        a job that exists already is shared and costs nobody a place.
        """
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.view().state not in ("failed", "cancelled"):
                self._jobs.move_to_end(key)
                return job
            if len(self._pending) >= self._max_queued:
                raise RunnerBusy(f"{len(self._pending)} runs are already waiting for the model; "
                                 "please try again in a minute")
            if owner is not None and owner_limit is not None and self._waiting(owner) >= owner_limit:
                raise OwnerBusy.waiting(self._waiting(owner))
            job = self._jobs[key] = Job(key, make, owner, shared)
            self._evict()
            self._pending.append(job)
            if not self._working:
                self._working = True
                threading.Thread(target=self._work, daemon=True, name="specviz-runner").start()
        return job

    def get(self, key: Hashable) -> Job | None:
        """The job for `key` if one exists (starts nothing)."""
        with self._lock:
            return self._jobs.get(key)

    def ahead(self, job: Job) -> int:
        """How many jobs will run before `job` starts (0 once it runs or has finished)."""
        with self._lock:
            if job not in self._pending:
                return 0
            return self._pending.index(job) + (self._running is not None or bool(self._members))

    def sharing_now(self) -> int:
        """Runs advancing together in the batch at this moment."""
        with self._lock:
            return len(self._members)

    def queued(self) -> int:
        """Jobs waiting, not counting the one running."""
        with self._lock:
            return len(self._pending)

    def waiting(self, owner: Hashable) -> int:
        """Jobs of `owner` waiting to start (stopped ones never start, so they do not count)."""
        with self._lock:
            return self._waiting(owner)

    def _waiting(self, owner: Hashable) -> int:
        return sum(1 for j in self._pending if j.owner == owner and not j.cancelled)

    def _evict(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.view().finished]
        while len(self._jobs) > self._max_jobs and finished:
            del self._jobs[finished.pop(0)]

    def _work(self) -> None:
        try:
            while True:
                job = self._next_alone()
                if job is _IDLE:
                    return  # nothing queued or running: the thread ends (see the class's docstring)
                if job is None:
                    self._tick()
                    continue
                try:
                    job.run(self._user_error)
                finally:
                    with self._lock:
                        self._running = None
        except BaseException:  # a bug above: the next submit starts a worker again instead of none ever running
            with self._lock:
                self._working = False
            raise

    def _next_alone(self) -> Job | None:
        """Admit the shared runs at the head of the queue into the batch; the job to run alone once the batch is empty
        and such a job is next (None: tick the batch; _IDLE: nothing to do, and the worker is marked as ended)."""
        with self._lock:
            while self._pending and self._pending[0].shared and self._batch.room > 0:
                self._admit(self._pending.popleft())
            if self._members:
                return None
            if self._pending:
                job = self._running = self._pending.popleft()
                return job
            self._working = False  # under the lock: a submit from now on starts a new worker
            return _IDLE

    def _admit(self, job: Job) -> None:
        """Build a shared run and put it in the batch (called with the lock held; building runs no model)."""
        run = job.start_shared(self._user_error)
        if run is not None:
            self._batch.add(id(job), run.program, run.target, job.publish)
            self._members[id(job)] = job

    def _tick(self) -> None:
        """One batch tick; stopped runs leave first, finished ones after."""
        for key, job in list(self._members.items()):
            if job.cancelled:
                self._batch.cancel(key)
                job.end(None, self._user_error)
                with self._lock:
                    del self._members[key]
        try:
            outcomes = self._batch.tick()
        except BaseException as exc:  # noqa: BLE001 - a bug in the executor itself: fail its runs, keep the server
            outcomes = [Outcome(key, None, exc, Sharing(0, 0, 0)) for key in self._members]
            self._batch.runs.clear()
        for outcome in outcomes:
            with self._lock:
                job = self._members.pop(outcome.key)  # type: ignore[call-overload]
            job.end(outcome, self._user_error)
