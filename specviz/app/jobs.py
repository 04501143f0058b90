"""One way every page runs model work: keyed jobs on the shared runner, their place in the queue, progress, result or error.

A job's key holds every setting that changes its result, so a view change never re-runs a model
and two pupils asking for the same measurement share one run. Pages keep only keys in
session_state; the runner keeps the jobs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from specviz.app import policy as policy_rules
from specviz.app.pairs import user_error
from specviz.core.memory import Memories
from specviz.serve.worker import Job, JobView, OwnerBusy, Runner, RunnerBusy
from specviz.app.sidebar import current_policy

Key = tuple[Any, ...]
Make = Callable[[], Any]  # JobSteps, or a SharedRun for a shared job
POLL_S = 1.0  # seconds between status redraws while a job waits or runs


@st.cache_resource(show_spinner=False)
def runner() -> Runner:
    """One model worker per server: runs are queued and shared by key; Watch runs and their baselines share the
    target's passes in one batch (each timed by the passes it took part in), timing labs run alone.

    The GIL switch interval is shortened so page redraws delay the worker's torch calls less
    (the worker needs the GIL between ops; timings stay closer to an idle server's).
    """
    sys.setswitchinterval(0.001)
    return Runner(user_error)


@st.cache_resource(show_spinner=False)
def memories() -> Memories:
    """Every visitor's run memory on this server, and the class's (drafted from only when the operator turned it on)."""
    return Memories()


def job(key: Key) -> Job | None:
    """The job for `key` if the runner still holds one (starts nothing)."""
    return runner().get(key)


def views(keys: Sequence[Key]) -> tuple[JobView, ...] | None:
    """Snapshots of the jobs, or None when one of them is gone from the runner (evicted: ask again)."""
    found = [job(k) for k in keys]
    if any(j is None for j in found):
        return None
    return tuple(j.view() for j in found if j is not None)


def owner_id() -> str:
    """Who asks for a run: one browser (all its tabs share Streamlit's XSRF cookie), else this session."""
    browser = policy_rules.browser_id(st.context.cookies.get(policy_rules.XSRF_COOKIE))
    if browser:
        return "browser:" + browser
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return "session:" + (ctx.session_id if ctx is not None else "none")


def _room_for(keys: Iterable[Key], owner: str, limit: int) -> None:
    """Raise OwnerBusy unless this browser may queue all of `keys` (so a run never waits without its baseline)."""
    new = sum(1 for k in keys if (j := job(k)) is None or j.view().state in ("failed", "cancelled"))
    if new and (waiting := runner().waiting(owner)) + new > limit:
        raise OwnerBusy.waiting(waiting)


def submit(tasks: Mapping[Key, Make], shared: bool = False) -> str | None:
    """Queue all tasks or none, as this browser and within its share of waiting runs (an existing job for a
    key is reused, a failed or stopped one queued again). `shared`: the tasks make SharedRuns, advanced in the
    server's batch with other pupils' runs (else each runs alone).

    Returns None, or the sentence to show when the queue (or this browser's share of it) is full.
    """
    owner, limit = owner_id(), current_policy().waiting_per_browser
    try:
        _room_for(tasks, owner, limit)
        for key, make in tasks.items():
            runner().submit(key, make, owner=owner, owner_limit=limit, shared=shared)
    except RunnerBusy as exc:
        return f"The server is busy: {exc}."
    return None


def cancel_unshared(old: Iterable[Key], new: Iterable[Key]) -> None:
    """Stop a session's earlier unfinished jobs when it asks for others (keys the new ones share are kept)."""
    keep = set(new)
    for key in old:
        if key not in keep and (j := job(key)) is not None and not j.view().finished:
            j.cancel()


def wait_line(j: Job) -> str | None:
    """"3 runs ahead of you" while a job waits its turn; None once it runs or is done."""
    ahead = runner().ahead(j)
    if ahead <= 0 or j.view().state != "queued":
        return None
    return f"Waiting for the model: {ahead} {'run' if ahead == 1 else 'runs'} ahead of you."


def show_status(key: Key, view: JobView, what: str, button: str) -> None:
    """Queue position, progress bar, or one-line error of a job (nothing once it is done).

    `what` names the job in the sentence ("Measuring γ"); `button` is the one that runs it again.
    """
    if view.state == "failed":
        st.error(f"{what} failed: {view.error}", icon=":material/error:")
    elif view.state == "cancelled":
        st.warning(f"{what} was stopped. Press **{button}** to run it again.", icon=":material/stop_circle:")
    elif view.state == "queued":
        j = job(key)
        st.info((wait_line(j) if j else None) or f"{what}: starting…", icon=":material/hourglass_top:")
    elif view.state == "running":
        prog = view.progress
        st.progress(prog.fraction if prog else 0.0, text=f"{what}: {prog.message if prog else 'working…'}")


def poll(keys: Sequence[Key], what: Sequence[str], button: str, every: float = POLL_S) -> None:
    """Redraw the jobs' status every `every` seconds; rerun the whole page once all are finished."""

    @st.fragment(run_every=every)
    def status() -> None:
        found = [job(k) for k in keys]
        if all(j is None or j.view().finished for j in found):
            st.rerun(scope="app")
        for key, j, name in zip(keys, found, what):
            if j is not None and not j.view().finished:
                show_status(key, j.view(), name, button)

    status()


# ------------------------------------------------------------------------------------------
# A page section that shows one measurement: press, wait, see it (the labs' whole life cycle)
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A page section's measurement: where its job keys live in session_state, and the words around it."""

    state_key: str  # session_state key of the keys on screen, prefixed by the page ("how_far.key")
    what: tuple[str, ...]  # what each job does, for its progress bar and its error line
    button: str  # the button that (re)runs the jobs, named in the notes
    changed: str = ("The settings changed since this measurement. Press **{button}** to run them; "
                    "until then the previous measurement stays on screen.")
    gone: str = "This measurement is no longer in memory. Press **{button}** to run it again."
    adopt: bool = True  # show a job already on record for the current settings (measured by anyone) unasked
    group: bool = False  # session_state holds the tuple of keys even for one job (else the lone key)

    def shown(self) -> tuple[Key, ...] | None:
        """The keys of the jobs this session has on screen, if any."""
        held = st.session_state.get(self.state_key)
        if held is None:
            return None
        return tuple(held) if self.group else (held,)

    def remember(self, keys: tuple[Key, ...]) -> None:
        """Show these jobs from now on (their keys only: the runner keeps the jobs)."""
        if not self.group and len(keys) != 1:
            raise ValueError(f"slot {self.state_key} holds one job, got {len(keys)}: make it a group")
        st.session_state[self.state_key] = keys if self.group else keys[0]


def start(slot: Slot, tasks: Mapping[Key, Make]) -> bool:
    """Queue a section's jobs, stop its earlier unfinished ones, and show the new ones from now on.

    False, with a note, when the queue is full (what was on screen stays there).
    """
    busy = submit(tasks)
    if busy:
        st.warning(busy, icon=":material/hourglass_top:")
        return False
    new = tuple(tasks)
    cancel_unshared(slot.shown() or (), new)
    slot.remember(new)
    return True


def _on_record(keys: Sequence[Key]) -> bool:
    """Every job of `keys` exists and is queued, running or done (not failed or stopped)."""
    found = [job(k) for k in keys]
    return all(j is not None and j.view().state not in ("failed", "cancelled") for j in found)


def results(slot: Slot, current: tuple[Key, ...] | None, adopt: bool = True) -> tuple[Any, ...] | None:
    """Draw where a section's jobs stand; their results once every one is done, else None.

    `current` are the keys the section's settings ask for now (None when they cannot run): when
    they differ from the keys on screen, the old result stays with a note until the button is pressed.
    `adopt`: whether this visitor may be shown someone else's job for these settings now (a lab passes
    False until the visitor has made their own prediction: a shared answer must not come before it).
    """
    shown = slot.shown()
    if slot.adopt and adopt and current is not None and shown != current and _on_record(current):
        slot.remember(current)
        shown = current
    if shown is None:
        return None
    snapshots = views(shown)
    if snapshots is None:
        st.warning(slot.gone.format(button=slot.button), icon=":material/history:")
        return None
    if current is not None and shown != current:
        st.info(slot.changed.format(button=slot.button), icon=":material/sync:")
    if not all(v.finished for v in snapshots):
        poll(shown, slot.what, slot.button)
        return None
    for key, view, what in zip(shown, snapshots, slot.what):
        if view.state != "done":
            show_status(key, view, what, slot.button)
            return None
    return tuple(v.result for v in snapshots)
