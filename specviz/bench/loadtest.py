"""Load test: many browser-like sessions on one real specviz server, over Streamlit's own websocket protocol.

Each session does what a pupil does on "Watch it work": open the page with a link (pair, prompt,
settings in the query string), press Play, let the page poll while the runs are computed, then
download the JSON trace. The client speaks the same protobuf messages as the browser, including
the fragment auto-reruns that drive the page's polling, so the server does all the work a class
would give it. Each session's greedy tokens are checked against a single-session reference.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specviz.core.limits import DEFAULT_GAMMA
from specviz.settings import encode_prompt
from specviz.presets import get_preset

REPO = Path(__file__).resolve().parents[2]
JSON_KEY = "watch.json"
RACE_KEY = "watch.race_go"  # drawn only once both runs (speculative and plain) are done
# What pupils type: different prompts, so every session queues its own runs (a shared prompt would
# share one cached run and test nothing). A realistic class (--class-mix) puts some pupils on the
# teacher's presets instead: those share one run per preset.
CLASS_PRESETS = ("code", "list", "story")
CLASS_PROMPTS = tuple(p.prompt for name in CLASS_PRESETS if (p := get_preset(name)) is not None)
PROMPT_STEMS = ("def add_{i}(a, b):", "Pupil {i} writes a list:\n1.", "Once upon a time, number {i}",
                "SELECT name FROM pupils WHERE id = {i}", "The {i}th planet is", "for i in range({i}):")


@dataclass(frozen=True)
class LoadConfig:
    """One load test: how many sessions, on which pair, how long each run is."""

    sessions: int = 8  # concurrent browser-like sessions
    pair: str = "tiny-random"  # the test pair keeps CI short; real pairs work too
    max_new_tokens: int = 24  # per run (each session queues a speculative and a plain run)
    gamma: int = DEFAULT_GAMMA  # draft length
    timeout_s: float = 600.0  # a session that has no result by then fails
    stagger_s: float = 0.05  # seconds between session starts (a class does not click in the same millisecond)
    preset_share: float = 0.0  # share of the sessions on CLASS_PRESETS (a realistic class: 0.5); the rest type their own
    drafter: str = "model"  # the Watch page's drafter for every session (a remembering one makes each session's run its own)
    class_memory: bool = False  # the server's operator turned class-wide memory on (SPECVIZ_CLASS_MEMORY=1)

    def __post_init__(self) -> None:
        if not 0.0 <= self.preset_share <= 1.0:
            raise ValueError(f"preset_share must be in [0, 1], got {self.preset_share}")

    def prompt(self, i: int) -> str:
        """Session i's prompt: on a preset for an evenly spread `preset_share` of the sessions, else its own."""
        if math.floor((i + 1) * self.preset_share) > math.floor(i * self.preset_share):
            return CLASS_PROMPTS[math.floor(i * self.preset_share) % len(CLASS_PROMPTS)]
        return session_prompt(i)


@dataclass(frozen=True)
class SessionResult:
    """What one session saw."""

    index: int
    prompt: str
    ok: bool  # finished, and its tokens equal the single-session reference
    latency_s: float | None  # Play pressed -> trace downloadable (both runs done)
    max_ahead: int  # the largest "N ahead of you" the page showed this session
    tokens: tuple[int, ...] = ()
    error: str | None = None
    refused: int = 0  # times the page said the queue was full (the session then reloaded)
    run_ms: float | None = None  # the speculative run's decode time in its trace: equal only for one shared run
    first_round_s: float | None = None  # Play pressed -> the first round's lane drawn


@dataclass(frozen=True)
class LoadReport:
    """The figures of a load test."""

    config: LoadConfig
    results: tuple[SessionResult, ...]
    wall_s: float
    server_peak_rss_mb: float
    server_start_rss_mb: float

    @property
    def passed(self) -> int:
        return sum(r.ok for r in self.results)

    def percentiles(self, field: str = "latency_s") -> dict[str, float]:
        """p50 / p90 / p99 / max of the sessions' latencies (or of another timing field), in seconds."""
        lat = sorted(v for r in self.results if (v := getattr(r, field)) is not None)
        if not lat:
            return {}
        cuts = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else [lat[0]] * 99
        return {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98], "max": lat[-1]}

    def shared_runs(self) -> dict[str, int]:
        """Per prompt asked by several sessions: how many distinct runs served them (1 = all shared one run)."""
        by_prompt: dict[str, list[float | None]] = {}
        for r in self.results:
            if r.ok:
                by_prompt.setdefault(r.prompt, []).append(r.run_ms)
        return {p[:24]: len(set(runs)) for p, runs in by_prompt.items() if len(runs) > 1}

    def as_dict(self) -> dict[str, object]:
        return {
            "sessions": self.config.sessions, "pair": self.config.pair, "max_new_tokens": self.config.max_new_tokens,
            "drafter": self.config.drafter, "class_memory": self.config.class_memory,
            "on_presets": sum(r.prompt in CLASS_PROMPTS for r in self.results),
            "distinct_prompts": len({r.prompt for r in self.results}),
            "runs_per_shared_prompt": self.shared_runs(),
            "passed": self.passed, "wall_s": round(self.wall_s, 2), "latency_s": {k: round(v, 2) for k, v in self.percentiles().items()},
            "first_round_s": {k: round(v, 2) for k, v in self.percentiles("first_round_s").items()},
            "max_queue_ahead_shown": max((r.max_ahead for r in self.results), default=0),
            "refused_then_retried": sum(r.refused for r in self.results),
            "server_rss_mb": {"start": round(self.server_start_rss_mb), "peak": round(self.server_peak_rss_mb)},
            "failures": [f"session {r.index}: {r.error}" for r in self.results if not r.ok],
        }


def session_prompt(i: int) -> str:
    return PROMPT_STEMS[i % len(PROMPT_STEMS)].format(i=i)


# ------------------------------------------------------------------------------------------
# The server under test
# ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`streamlit run app.py` in a child process, with the repo's .streamlit/config.toml (as the README starts it)."""

    def __init__(self, port: int | None = None, class_memory: bool = False) -> None:
        self.port = port or free_port()
        env = {**os.environ, "SPECVIZ_SHOW_TEST_PAIR": "1", "PYTHONUNBUFFERED": "1",
               "SPECVIZ_CLASS_MEMORY": "1" if class_memory else "0"}
        cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(self.port),
               "--server.address", "127.0.0.1"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited: " + " | ".join(self.log[-5:]))
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("the server did not start in time")

    def rss_mb(self) -> float:
        import psutil

        try:
            return psutil.Process(self.proc.pid).memory_info().rss / 2**20
        except psutil.Error:
            return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------
# One browser-like session
# ------------------------------------------------------------------------------------------


@dataclass
class _Seen:
    """What the client has seen of the page so far (element ids, the download URL, queue lines)."""

    json_url: str | None = None
    both_done: bool = False
    busy: bool = False
    max_ahead: int = 0
    page_hash: str = ""
    fragments: dict[str, float] = field(default_factory=dict)  # fragment id -> auto-rerun interval
    widgets: dict[str, object] = field(default_factory=dict)  # widget id -> WidgetState the browser would send
    exception: str | None = None
    first_round_at: float | None = None  # when the page first drew a round's lane (not the "thinking" placeholder)


ROUND_LANE = re.compile(r'class="sv-lane(?: sv-current)?"')  # a drawn round (strip.lane_html), not a placeholder


def _ahead_in(text: str) -> int:
    """The number in "Waiting for the model: 3 runs ahead of you." (0 if absent)."""
    if "ahead of you" not in text:
        return 0
    words = text.split("ahead of you")[0].split()
    nums = [w for w in words if w.isdigit()]
    return int(nums[-1]) if nums else 0


_VALUE_WIDGETS = ("radio", "selectbox", "slider", "text_area", "checkbox", "number_input")


def _widget_state(which: str, w: object) -> object | None:
    """The value a browser sends back for a newly drawn widget: what the server set, else the default.

    A browser sends every widget's value on every rerun; a client that sends none would have
    its keyed widgets (the sidebar's pair, γ, …) fall back to their defaults.
    """
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    state = WidgetState(id=w.id)  # type: ignore[attr-defined]
    if which in ("radio", "selectbox"):
        if w.set_value:  # type: ignore[attr-defined]
            state.string_value = w.raw_value  # type: ignore[attr-defined]
        elif w.HasField("default") and w.options:  # type: ignore[attr-defined]
            state.string_value = w.options[w.default]  # type: ignore[attr-defined]
        else:
            return None
    elif which == "slider":
        values = w.value if w.set_value else w.default  # type: ignore[attr-defined]
        if w.options:  # a select_slider: its values are indices into the options, sent as the option strings
            state.string_array_value.data.extend(w.options[int(v)] for v in values)  # type: ignore[attr-defined]
        else:
            state.double_array_value.data.extend(values)
    elif which == "text_area":
        state.string_value = w.value if w.set_value else w.default  # type: ignore[attr-defined]
    elif which == "checkbox":
        state.bool_value = w.value if w.set_value else w.default  # type: ignore[attr-defined]
    elif which == "number_input":
        state.double_value = w.value if w.set_value else w.default  # type: ignore[attr-defined]
    return state


def _read(msg: object, seen: _Seen) -> None:
    """Update `seen` from one ForwardMsg."""
    kind = msg.WhichOneof("type")  # type: ignore[attr-defined]
    if kind == "new_session":
        seen.page_hash = msg.new_session.page_script_hash  # type: ignore[attr-defined]
    elif kind == "auto_rerun":
        seen.fragments[msg.auto_rerun.fragment_id] = msg.auto_rerun.interval  # type: ignore[attr-defined]
    elif kind == "stop_auto_rerun":
        for fid in msg.stop_auto_rerun.fragment_ids:  # type: ignore[attr-defined]
            seen.fragments.pop(fid, None)
    elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":  # type: ignore[attr-defined]
        el = msg.delta.new_element  # type: ignore[attr-defined]
        which = el.WhichOneof("type")
        widget = getattr(el, which)
        # Like a browser: keep the value it holds unless the server sets one (set_value).
        if which in _VALUE_WIDGETS and (widget.set_value or widget.id not in seen.widgets):
            state = _widget_state(which, widget)
            if state is not None:
                seen.widgets[state.id] = state
        if which == "button" and el.button.id.endswith(RACE_KEY):
            seen.both_done = True
            seen.json_url = None  # the download drawn after this one carries the baseline too
        elif which == "download_button" and el.download_button.id.endswith(JSON_KEY) and seen.both_done:
            seen.json_url = el.download_button.url
        elif which == "alert":
            seen.max_ahead = max(seen.max_ahead, _ahead_in(el.alert.body))
            seen.busy = seen.busy or BUSY_TEXT in el.alert.body
        elif which == "exception":
            seen.exception = f"{el.exception.type}: {el.exception.message}"
        elif which == "html" and seen.first_round_at is None and ROUND_LANE.search(el.html.body):
            seen.first_round_at = time.time()


BUSY_TEXT = "The server is busy"  # the page's words when the run queue is full (live.RunnerBusy)
RETRY_AFTER_S = 2.0  # a refused pupil reloads the page after a moment


class _Busy(Exception):
    """The page said the queue was full."""


async def _visit(ws_url: str, query: str, seen: _Seen, end: float) -> None:
    """One page load: open the link (it starts the run by itself), poll like a browser until the trace is ready."""
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    def rerun(fragment: str | None = None) -> bytes:
        back = BackMsg()
        cs = back.rerun_script
        cs.query_string = query
        cs.page_script_hash = seen.page_hash
        cs.widget_states.widgets.extend(seen.widgets.values())
        if fragment:
            cs.fragment_id, cs.is_auto_rerun = fragment, True
        return back.SerializeToString()

    async with websockets.connect(ws_url, max_size=None, open_timeout=60) as ws:
        async def reader() -> None:
            async for raw in ws:
                msg = ForwardMsg()
                msg.ParseFromString(raw)
                _read(msg, seen)

        async def poller() -> None:  # the browser's side of st.fragment(run_every=…)
            while True:
                await asyncio.sleep(min(seen.fragments.values(), default=0.5))
                for fid in list(seen.fragments):
                    await ws.send(rerun(fid))

        read_task = asyncio.create_task(reader())
        await ws.send(rerun())
        poll_task = asyncio.create_task(poller())
        try:
            while seen.json_url is None:
                if seen.busy:
                    raise _Busy()
                await _tick(end, seen, read_task)
        finally:
            poll_task.cancel()
            read_task.cancel()


async def _run_session(base: str, index: int, cfg: LoadConfig,
                       reference: Callable[[str], tuple[int, ...]] | None) -> SessionResult:
    prompt = cfg.prompt(index)
    # autoplay=1: the link starts the run by itself, as a teacher's shared link would; the client
    # then only does what a browser does while it waits (fragment auto-reruns)
    query = urllib.parse.urlencode({"pair": cfg.pair, "prompt": prompt, "max_new": cfg.max_new_tokens,
                                    "gamma": cfg.gamma, "mode": "greedy", "drafter": cfg.drafter, "speed": "fastest",
                                    "autoplay": 1})
    ws_url = base.replace("http://", "ws://") + "/_stcore/stream"
    t_play, end = time.time(), time.time() + cfg.timeout_s
    refused, max_ahead, first_round = 0, 0, None
    try:
        while True:
            seen = _Seen()
            try:
                await _visit(ws_url, query, seen, end)
                break
            except _Busy:
                refused += 1  # told the queue is full: reload after a moment, like a pupil would
                await asyncio.sleep(RETRY_AFTER_S)
            finally:
                max_ahead = max(max_ahead, seen.max_ahead)
                if first_round is None and seen.first_round_at is not None:
                    first_round = seen.first_round_at - t_play
        latency = time.time() - t_play
        assert seen.json_url is not None
        doc = await asyncio.to_thread(_fetch_json, base + seen.json_url)
        tokens = tuple(doc["speculative"]["tokens"])
        base_tokens = tuple(doc.get("baseline", {}).get("tokens", ()))
        want = reference(prompt) if reference else tokens
        problems = []
        if doc.get("meta", {}).get("pair") != cfg.pair:
            problems.append(f"the run used pair {doc.get('meta', {}).get('pair')!r}, not {cfg.pair!r}")
        if tokens != want:
            problems.append("speculative tokens differ from the single-session reference")
        if reference and base_tokens != want:
            problems.append("baseline tokens differ from the single-session reference")
        return SessionResult(index, prompt, not problems, latency, max_ahead, tokens, "; ".join(problems) or None,
                             refused, doc["speculative"].get("decode_ms"), first_round)
    except Exception as exc:  # noqa: BLE001 - a failed session is a result, not a crash of the test
        return SessionResult(index, prompt, False, None, max_ahead, (), f"{type(exc).__name__}: {exc}", refused)


async def _tick(end: float, seen: _Seen, read_task: asyncio.Task[None]) -> None:
    if seen.exception:
        raise RuntimeError(f"the page raised {seen.exception}")
    if read_task.done():
        raise RuntimeError("the server closed the connection")
    if time.time() > end:
        raise TimeoutError("no result in time")
    await asyncio.sleep(0.05)


def _fetch_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read().decode("utf-8"))


# ------------------------------------------------------------------------------------------
# The whole test
# ------------------------------------------------------------------------------------------


def greedy_references(pair_name: str, max_new_tokens: int, prompts: set[str]) -> dict[str, tuple[int, ...]]:
    """Target-only greedy tokens of each prompt, computed alone in this process before the server starts (the
    single-session answers); the pair is released afterwards, so the test process does not hold a second copy."""
    import gc

    from specviz import models
    from specviz.core.engine import autoregressive_generate
    from specviz.core.progress import drain
    from specviz.core.trace import GenerationConfig

    pair = models.load_pair(pair_name)
    config = GenerationConfig(max_new_tokens=max_new_tokens, gamma=1)
    found = {}
    for prompt in sorted(prompts):
        ids = encode_prompt(pair.tokenizer, prompt)
        found[prompt] = tuple(drain(autoregressive_generate(pair.target, pair.tokenizer, ids, config, pair.eos_ids)).tokens)
    del pair
    gc.collect()
    return found


async def _all_sessions(base: str, cfg: LoadConfig, reference: Callable[[str], tuple[int, ...]],
                        server: Server, peak: list[float]) -> list[SessionResult]:
    async def watch_memory() -> None:
        while True:
            peak[0] = max(peak[0], server.rss_mb())
            await asyncio.sleep(0.2)

    mem = asyncio.create_task(watch_memory())
    tasks = []
    for i in range(cfg.sessions):
        tasks.append(asyncio.create_task(_run_session(base, i, cfg, reference)))
        await asyncio.sleep(cfg.stagger_s)
    results = await asyncio.gather(*tasks)
    mem.cancel()
    return list(results)


def run_loadtest(cfg: LoadConfig, server: Server | None = None) -> LoadReport:
    """Start a server (unless given one), run `cfg.sessions` sessions at once, and report."""
    reference = greedy_references(cfg.pair, cfg.max_new_tokens, {cfg.prompt(i) for i in range(cfg.sessions)}).__getitem__
    own = server is None
    server = server or Server(class_memory=cfg.class_memory)
    try:
        server.wait_ready()
        _warm(server, cfg)
        start_rss = server.rss_mb()
        peak = [start_rss]
        t0 = time.time()
        results = asyncio.run(_all_sessions(server.url, cfg, reference, server, peak))
        wall = time.time() - t0
    finally:
        if own:
            server.stop()
    return LoadReport(cfg, tuple(sorted(results, key=lambda r: r.index)), wall, peak[0], start_rss)


def _warm(server: Server, cfg: LoadConfig) -> None:
    """One session first, so the pair is loaded before the clock starts (a class arrives after the teacher)."""
    warm = LoadConfig(sessions=1, pair=cfg.pair, max_new_tokens=2, gamma=cfg.gamma, timeout_s=cfg.timeout_s,
                      drafter=cfg.drafter)  # a remembering drafter's datastore loads here too
    first = asyncio.run(_run_session(server.url, 10_000, warm, None))
    if not first.ok:
        raise RuntimeError(f"the warm-up session failed: {first.error}")
