"""The Watch page's state and tick policy: its run and replay cursor in session state, the control callbacks, and how often the live view redraws."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from specviz.app import jobs
from specviz.app.settings import shown
from specviz.app.sidebar import current_policy, read_query
from specviz.core import drafters, memory
from specviz.core.memory import Memory
from specviz.labs import watch
from specviz.labs.watch import RoundTrace, RunRef
from specviz.presets import DEFAULT_PRESET, PRESETS, get_preset
from specviz.serve.worker import JobView
from specviz.settings import MAX_PROMPT_CHARS, Settings
from specviz.viz import playback as pb

P = "watch."  # session_state prefix of the page
# name -> (seconds per tick, frames per tick). Ticks stay at 2-3 per second at most: the browser redraws the page at
# each. The replay starts once both runs are measured (the page stays still while they are timed), so it no longer
# slows them; "normal" replays a 64-token run (about 130 frames: each drafted token, each verdict, each round's end)
# in about 26 s.
SPEEDS: dict[str, tuple[float, int]] = {
    "slow": (0.6, 1), "normal": (0.4, 2), "fast": (0.35, 3), "fastest": (0.35, 6),
}
WAIT_TICK = 1.0  # seconds between redraws while the runs are measured (a progress line only) or paused
# While a run waits in the queue the page draws only its place in it, every 2 s: measured with
# `loadtest --sessions 30 --pair qwen-coder --class-mix`, 30 pages redrawing the whole live view at the
# playback tick while they waited made the class's 18 runs and baselines take 603 s instead of 358 s.
QUEUE_TICK = 2.0
# ... except the run that is next in line: on a free server every run is "queued" for a moment after Play, and
# a 2 s tick there put the first round on screen 2.5 s after Play (loadtest --sessions 1, qwen-coder fp16w)
NEXT_UP_TICK = 0.25
ss = st.session_state

Status = tuple[bool, bool, bool]  # (still being timed, playing, run still queued)


def init_state() -> None:
    """A session's first visit: the prompt, speed and autoplay from the link (bad values become notes)."""
    if P + "prompt" in ss:
        return
    url_prompt, url_preset = read_query("prompt"), read_query("preset")
    preset = get_preset(url_preset or "") or get_preset(DEFAULT_PRESET)
    notes: list[str] = []
    if url_preset and not get_preset(url_preset):
        notes.append(f"Unknown preset `{shown(url_preset)}` in the link; showing the code example.")
    ss[P + "prompt"] = url_prompt[:MAX_PROMPT_CHARS] if url_prompt is not None else preset.prompt
    if url_prompt is not None and len(url_prompt) > MAX_PROMPT_CHARS:
        notes.append(f"The prompt in the link had {len(url_prompt):,} characters; only the first "
                     f"{MAX_PROMPT_CHARS:,} were kept (the prompt box holds at most that many).")
    ss.setdefault(P + "frame", 0)
    ss.setdefault(P + "playing", False)
    speed = read_query("speed")
    if speed is not None and speed not in SPEEDS:
        notes.append(f"Ignored `speed={shown(speed)}` in the link: choose one of {', '.join(SPEEDS)}.")
    ss[P + "speed"] = speed if speed in SPEEDS else "normal"
    if read_query("autoplay") == "1":  # a link that starts the demo by itself (once per session)
        request_play()
    ss[P + "notes"] = notes


def ref() -> RunRef | None:
    """The run on screen (None before the first Play)."""
    return ss.get(P + "run")


def views(run: RunRef | None) -> tuple[JobView | None, JobView | None]:
    """The run's and its baseline's jobs as they stand now."""
    if run is None:
        return None, None
    spec, plain = jobs.job(run.spec_key), jobs.job(run.plain_key)
    return (spec.view() if spec else None), (plain.view() if plain else None)


def previous() -> RunRef | None:
    """The run this visitor made before the one on screen, with the same settings and a drafter that remembers."""
    return ss.get(P + "previous")


def before() -> RunRef | None:
    """The run this visitor made before the one on screen, whatever its settings."""
    return ss.get(P + "before")


def rounds() -> tuple[RoundTrace, ...]:
    spec, _ = views(ref())
    return spec.rounds if spec else ()


# ------------------------------------------------------------------------------------------
# Control callbacks (no model work here: only moving the replay cursor)
# ------------------------------------------------------------------------------------------


def use_preset(preset_id: str) -> None:
    ss[P + "prompt"] = get_preset(preset_id).prompt


def request_play() -> None:
    ss[P + "play_request"] = True
    ss[P + "playing"] = True  # optimistic, so the button already reads "Pause"; undone if the prompt cannot run


def drop_play_request() -> None:
    """A Play that cannot run (no pair, a bad prompt): undo the optimistic Pause button on the next run."""
    if ss.pop(P + "play_request", False):
        ss[P + "playing"] = False
        st.rerun()


def pause() -> None:
    ss[P + "playing"] = False


def step() -> None:
    found = rounds()
    ss[P + "playing"] = False
    cur = pb.locate(found, ss[P + "frame"])
    if cur is None:
        return
    target = cur.round if not cur.complete(found) else min(cur.round + 1, len(found) - 1)
    ss[P + "frame"] = pb.round_end_frame(found, target)


def back() -> None:
    found = rounds()
    ss[P + "playing"] = False
    cur = pb.locate(found, ss[P + "frame"])
    if cur is None:
        return
    ss[P + "frame"] = pb.round_end_frame(found, cur.round - 1) if cur.round > 0 else 0


def to_end() -> None:
    """Show the result now: the replay jumps to its last frame (the runs are measured already)."""
    ss[P + "frame"] = pb.total_frames(rounds())
    ss[P + "playing"] = False


def measuring(spec: JobView | None, plain: JobView | None) -> bool:
    """The run or its baseline is still being timed: the live view then keeps still but for one progress line, so
    that the page redrawing beside them cannot slow them (on 2 cores a redrawing page used 0.76 of a core)."""
    return bool(spec is not None and not spec.finished or plain is not None and not plain.finished)


def replay() -> None:
    ss[P + "frame"] = 0
    ss[P + "playing"] = ref() is not None
    ss[P + "race_t0"] = None


def start_race() -> None:
    ss[P + "race_t0"] = time.time()


def handle_play(pair: Any, prompt: Any, s: Settings) -> None:
    """Start a run for the current prompt and settings, or resume/replay the one on screen.

    Submitting is idempotent: a run that exists (queued, running or done) is reused, and a
    failed or stopped one is queued again, so Play never repeats model work that is on record.
    A drafter that remembers is the exception: Play at the end of its replay starts a new run,
    which drafts from the one before (the lesson's "second time").
    """
    if not ss.pop(P + "play_request", False):
        return
    old, new = ref(), _asked_run(pair.spec.name, prompt.text, s)
    make_memory = _memory_maker(pair, s)
    if drafters.spec(s.drafter).needs_head:
        # the head is built on first use (1.6 s on qwen-coder): here, before both runs are timed, not in the middle
        # of the speculative run while its baseline steps beside it (a first Play then read as a busy machine)
        getattr(pair, "head", None)
    busy = jobs.submit({new.spec_key: lambda: watch.speculative_run(pair, prompt.ids, s, make_memory()),
                        new.plain_key: lambda: watch.baseline_run(pair, prompt.ids, s)}, shared=True)
    if busy:
        ss[P + "busy"] = busy  # shown after the rerun that puts the Play button back
        ss[P + "playing"] = False
        st.rerun()
    if old is None or old.spec_key != new.spec_key:
        if old is not None:
            jobs.cancel_unshared(old.keys, new.keys)
        # a remembering run after one with the same settings: the page compares the two (the lesson's "second time")
        ss[P + "previous"] = old if old is not None and watch.remembers(s) and old.asks == new.asks else None
        ss[P + "before"] = old  # whatever ran before: the head's D5 table sets it beside this run on the same prompt
        ss[P + "run"] = new
        ss[P + "frame"] = 0
        ss[P + "race_t0"] = None
        ss[P + "playing"] = True
        # the page's controls were drawn before this run existed: draw them again for it (Step, Replay and "Show the
        # result now" stayed disabled until the replay's end had redrawn the page, 40 s for a run already on record)
        st.rerun()
    elif _replayed_to_end(new):
        ss[P + "frame"] = 0  # at the end: play again from the start
    ss[P + "playing"] = True


def _replayed_to_end(run: RunRef) -> bool:
    """The run is done and its replay stands at its last frame."""
    spec, _ = views(run)
    return bool(spec and spec.finished and ss[P + "frame"] >= pb.total_frames(spec.rounds) - 1)


def _asked_run(pair_name: str, text: str, s: Settings) -> RunRef:
    """The run a Play asks for: shared by settings, or, for a drafter that remembers, this visitor's own.

    A remembering run on screen with the same settings is resumed while it computes or replays; once replayed to
    its end (or gone from the runner), Play makes the visitor's next run, numbered anew so it is never shared.
    """
    owner = None if is_preset(text) or current_policy().classroom else jobs.owner_id()
    asked = watch.run_ref(pair_name, text, s, owner=owner)
    if not watch.remembers(s):
        return asked
    old = ref()
    if old is not None and old.asks == asked.asks and jobs.job(old.spec_key) is not None and not _replayed_to_end(old):
        return old
    return watch.run_ref(pair_name, text, s, run=(jobs.owner_id(), jobs.memories().next_run()), owner=owner)


def is_preset(text: str) -> bool:
    """Whether a prompt is one of the app's presets (their runs are shared by every visitor)."""
    return any(p.prompt == text for p in PRESETS)


def _memory_maker(pair: Any, s: Settings) -> Callable[[], Memory | None]:
    """What the run's drafter remembers, built in the worker (the datastore may load there): this visitor's own runs
    on the pair, the class's only when the operator turned class-wide memory on, and the datastore."""
    if not watch.remembers(s):
        return lambda: None
    owner, class_wide, store = jobs.owner_id(), current_policy().class_memory, jobs.memories()

    def make() -> Memory:
        return memory.visitor_memory(pair, store, owner, class_wide)

    return make


# ------------------------------------------------------------------------------------------
# The replay cursor and the tick
# ------------------------------------------------------------------------------------------


def advance(spec: JobView) -> tuple[pb.Cursor | None, bool]:
    """One tick of the replay: move the cursor if playing, stop at the end of a finished run; (cursor, at its end)."""
    found = spec.rounds
    total = pb.total_frames(found)
    if ss[P + "playing"] and total:
        ss[P + "frame"] = min(ss[P + "frame"] + SPEEDS[ss[P + "speed"]][1], total - 1)
    ss[P + "frame"] = max(0, min(ss[P + "frame"], max(total - 1, 0)))
    cur = pb.locate(found, ss[P + "frame"])
    at_end = cur is not None and ss[P + "frame"] >= total - 1 and cur.complete(found)
    if spec.finished and (at_end or not found):
        if ss[P + "playing"]:
            ss[P + "playing"] = False
        ss[P + "seen_end"] = True
    return cur, at_end


def tick_status(spec: JobView | None, plain: JobView | None) -> Status:
    """What sets the live view's redraw rate, and whose change redraws the whole page: (still being timed, playing,
    run still queued). The run ending while its plain twin is still timed changes nothing: a whole-page redraw then
    held the server's Python for a second in the middle of the plain run's steps (a 1.8× spread, a false "busy")."""
    return (measuring(spec, plain), bool(ss[P + "playing"]), bool(spec is not None and spec.state == "queued"))


def next_up(run: RunRef) -> bool:
    """Whether the run waits for nothing but the worker to pick it up (no job runs or waits before it)."""
    j = jobs.job(run.spec_key)
    return j is not None and jobs.runner().ahead(j) == 0


def tick_seconds(run: RunRef, status: Status) -> float | None:
    """Seconds between redraws of the live view (None: it does not redraw by itself)."""
    timing, playing, queued = status
    if queued:  # nothing moves but a place in the queue
        return NEXT_UP_TICK if next_up(run) else QUEUE_TICK
    if timing:  # being measured: one progress line a second
        return WAIT_TICK
    return SPEEDS[ss[P + "speed"]][0] if playing else None
