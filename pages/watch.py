"""Watch it work: pick or type a prompt, press play, and watch real speculative decoding round by round."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from specviz.app import ui
from specviz.core.trace import RoundTrace
from specviz.lessons import labels, lesson
from specviz.app.runner import JobView, RunnerBusy
from specviz.core.metrics import compare
from specviz.presets import DEFAULT_PRESET, PRESETS, get_preset
from specviz.app.settings import Settings, prompt_problem, shown
from specviz.viz import export
from specviz.viz import watch as watch_view
from specviz.viz import playback as pb
from specviz.viz import strip

P = "watch."  # session_state prefix of this page
# name -> (seconds per tick, frames per tick). Ticks stay at 2-3 per second at most: the browser and
# the models share this machine's CPU, and every redraw slows the runs being measured.
SPEEDS: dict[str, tuple[float, int]] = {
    "slow": (0.9, 1), "normal": (0.45, 1), "fast": (0.35, 2), "fastest": (0.35, 4),
}
WAIT_TICK = 1.0  # seconds between redraws while paused and a run is still computing
MAX_LANES = 6  # lanes on screen: the current round and the ones before it
PROMPT_URL_MAX = 1500  # longer prompts stay out of the URL
MAX_PROMPT_CHARS = 20_000  # the prompt box's limit (the model's context is checked separately)
ss = st.session_state


# ------------------------------------------------------------------------------------------
# State helpers and control callbacks (no model work here: only moving the replay cursor)
# ------------------------------------------------------------------------------------------


def _init_state() -> None:
    if P + "prompt" in ss:
        return
    url_prompt, url_preset = ui.read_query("prompt"), ui.read_query("preset")
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
    speed = ui.read_query("speed")
    if speed is not None and speed not in SPEEDS:
        notes.append(f"Ignored `speed={shown(speed)}` in the link: choose one of {', '.join(SPEEDS)}.")
    ss[P + "speed"] = speed if speed in SPEEDS else "normal"
    if ui.read_query("autoplay") == "1":  # a link that starts the demo by itself (once per session)
        _request_play()
    ss[P + "notes"] = notes


def _ref() -> ui.RunRef | None:
    return ss.get(P + "run")


def _views(ref: ui.RunRef | None) -> tuple[JobView | None, JobView | None]:
    if ref is None:
        return None, None
    spec, plain = ui.job(ref.spec_key), ui.job(ref.plain_key)
    return (spec.view() if spec else None), (plain.view() if plain else None)


def _rounds() -> tuple[RoundTrace, ...]:
    spec, _ = _views(_ref())
    return spec.rounds if spec else ()


def _use_preset(preset_id: str) -> None:
    ss[P + "prompt"] = get_preset(preset_id).prompt


def _request_play() -> None:
    ss[P + "play_request"] = True
    ss[P + "playing"] = True  # optimistic, so the button already reads "Pause"; undone if the prompt cannot run


def _pause() -> None:
    ss[P + "playing"] = False


def _step() -> None:
    rounds = _rounds()
    ss[P + "playing"] = False
    cur = pb.locate(rounds, ss[P + "frame"])
    if cur is None:
        return
    target = cur.round if not cur.complete(rounds) else min(cur.round + 1, len(rounds) - 1)
    ss[P + "frame"] = pb.round_end_frame(rounds, target)


def _back() -> None:
    rounds = _rounds()
    ss[P + "playing"] = False
    cur = pb.locate(rounds, ss[P + "frame"])
    if cur is None:
        return
    ss[P + "frame"] = pb.round_end_frame(rounds, cur.round - 1) if cur.round > 0 else 0


def _replay() -> None:
    ss[P + "frame"] = 0
    ss[P + "playing"] = _ref() is not None
    ss[P + "race_t0"] = None


def _start_race() -> None:
    ss[P + "race_t0"] = time.time()


# ------------------------------------------------------------------------------------------
# Page sections
# ------------------------------------------------------------------------------------------


def _header(s: Settings) -> None:
    st.title("Watch it work" if s.level != "d1" else "Watch the helper at work")
    for note in ss.pop(P + "notes", []):
        st.warning(note, icon=":material/link:")
    ui.lesson_md(s.level, "intro")
    if s.level == "d1":
        ui.lesson_md("d1", "picture")


def _prompt_box() -> str:
    ui.preset_buttons(P, _use_preset, {"predictable": " — the helper should guess well",
                                       "creative": " — many good next words"})
    prompt = st.text_area("Prompt (the models continue this text)", key=P + "prompt", height=110,
                          max_chars=MAX_PROMPT_CHARS, persist_state="session")
    preset = next((p.id for p in PRESETS if p.prompt == prompt), None)
    url: dict[str, str] = {"speed": ss[P + "speed"]} if ss[P + "speed"] != "normal" else {}
    if preset and preset != DEFAULT_PRESET:
        url["preset"] = preset
    elif not preset and len(prompt) <= PROMPT_URL_MAX:
        url["prompt"] = prompt
    ui.write_page_query(url, ("preset", "prompt", "speed", "autoplay"))
    return prompt


def _d1_question(finished: bool) -> None:
    if ss.get(P + "revealed") or (finished and ss.get(P + "seen_end")):
        ss[P + "revealed"] = True
        st.html(f'<div class="sv-answer">{_md_to_html(lesson("d1", "answer"))}</div>')
        return
    with st.container(border=True):
        st.markdown(lesson("d1", "question"))
        st.radio("Your guess", ("Yes, it gets worse", "No, it only takes longer", "Not sure"), key=P + "d1_guess",
                 horizontal=True, index=None, label_visibility="collapsed", persist_state="session")
        st.caption("The answer appears after the first run.")


def _md_to_html(text: str) -> str:
    """Tiny Markdown-to-HTML for our own lesson text (bold only), escaped first."""
    parts = strip.esc(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def _controls(has_run: bool) -> None:
    playing = ss[P + "playing"]
    with st.container(horizontal=True, gap="small", vertical_alignment="bottom"):
        if playing:
            st.button("Pause", key=P + "pause", icon=":material/pause:", on_click=_pause, shortcut="K",
                      type="primary")
        else:
            st.button("Play", key=P + "play", icon=":material/play_arrow:", on_click=_request_play, shortcut="K",
                      type="primary")
        st.button("Step back", key=P + "back", icon=":material/skip_previous:", on_click=_back,
                  disabled=not has_run, shortcut="J", help="Show the previous round (J)")
        st.button("Step one round", key=P + "step", icon=":material/skip_next:", on_click=_step,
                  disabled=not has_run, shortcut="L", help="Finish this round, or show the next one (L)")
        st.button("Replay", key=P + "replay", icon=":material/replay:", on_click=_replay, disabled=not has_run,
                  shortcut="Home", help="Replay the recorded rounds from the start (Home). Replays never call a model.")
        st.select_slider("Animation speed", options=list(SPEEDS), key=P + "speed", width=260, persist_state="session")
    st.caption("Keyboard: **K** play/pause · **J** step back · **L** step one round · **Home** replay")


def _handle_play(pair: Any, prompt: str, ids: list[int], s: Settings) -> None:
    """Start a run for the current prompt and settings, or resume/replay the one on screen.

    Submitting is idempotent: a run that exists (queued, running or done) is reused, and a
    failed or stopped one is queued again, so Play never repeats model work that is on record.
    """
    if not ss.pop(P + "play_request", False):
        return
    old = _ref()
    try:
        new = ui.start_runs(pair, prompt, ids, s)
    except RunnerBusy as exc:
        ss[P + "busy"] = str(exc)  # shown after the rerun that puts the Play button back
        ss[P + "playing"] = False
        st.rerun()
    if old is None or old.spec_key != new.spec_key:
        if old is not None:
            ui.cancel_runs(old, new)
        ss[P + "run"] = new
        ss[P + "frame"] = 0
        ss[P + "race_t0"] = None
    else:
        spec, _ = _views(new)
        if spec and spec.finished and ss[P + "frame"] >= pb.total_frames(spec.rounds) - 1:
            ss[P + "frame"] = 0  # at the end: play again from the start
    ss[P + "playing"] = True


def _chart(name: str, sig: tuple[Any, ...], build: Callable[[], Any]) -> None:
    """Draw a plotly figure, rebuilding it only when its inputs changed (keeps animation ticks cheap)."""
    cached = ss.get(P + "fig." + name)
    if cached is None or cached[0] != sig:
        cached = ss[P + "fig." + name] = (sig, build())
    if cached[1] is not None:
        st.plotly_chart(cached[1], key=P + name, config={"displayModeBar": False})


def _status(spec: JobView, plain: JobView | None, s: Settings, run: Settings, L: Any) -> None:
    """One line on the run's progress (and the baseline's), in the level's words."""
    d1 = s.level == "d1"
    if spec.state == "failed":
        st.error(f"This run stopped: {spec.error}", icon=":material/warning:")
    elif spec.state == "cancelled":
        st.info("This run was stopped because a newer one started. Press **Play** to run it again.")
    elif spec.state == "queued":
        ref = _ref()
        job = ui.job(ref.spec_key) if ref else None
        line = ui.wait_line(job) if job else None
        st.info(line or "Waiting for the models…", icon=":material/hourglass_top:")
    elif spec.state == "running":
        st.caption(f":material/settings: {L['thinking'].capitalize()} (round {len(spec.rounds) + 1})")
    elif spec.state == "done" and spec.generation is not None:
        g = spec.generation
        done = (f":material/check_circle: Finished: {len(g.tokens)} {L['tokens']} in {g.target_calls} big-model turns." if d1 else
                f":material/check_circle: Run complete: {len(g.tokens)} tokens in {g.target_calls} target calls "
                f"({'stopped at end-of-text' if g.stop_reason == 'eos' else 'reached max new tokens'}).")
        st.caption(done + " The animation replays the recorded rounds.")
    if plain is not None and plain.state == "cancelled":
        st.caption("The plain run for comparison was stopped; press **Play** to measure it again.")
    elif plain is not None and not plain.finished:
        made = sum(len(r.new_ids) for r in plain.rounds)
        st.caption(f":material/timer: Measuring plain decoding for comparison… {made}/{run.max_new_tokens}")
    elif plain is not None and plain.state == "failed":
        st.caption(f"The plain run for comparison failed: {plain.error}")


def _lanes(rounds: tuple[RoundTrace, ...], cur: pb.Cursor | None, waiting: bool, s: Settings, L: Any) -> str:
    html: list[str] = []
    if cur is None:
        return strip.computing_lane_html(0, L)
    if waiting:
        html.append(strip.computing_lane_html(cur.round + 1, L))
    for i in range(cur.round, max(-1, cur.round - MAX_LANES), -1):
        r = rounds[i]
        state = pb.lane_state(r, cur.step) if i == cur.round else pb.full_lane(r)
        detail = f"draft {r.draft_ms:.0f} ms · verify {r.verify_ms:.0f} ms" if s.level == "d5" and state.final_shown else ""
        html.append(strip.lane_html(r, state, L, current=(i == cur.round and not waiting), detail=detail))
    hidden = cur.round + 1 - MAX_LANES
    if hidden > 0:
        html.append(f'<div class="sv-summary">… and {hidden} earlier {"turns" if s.level == "d1" else "rounds"}</div>')
    return "".join(html)


def _active_steps(state: pb.LaneState | None) -> tuple[int, ...]:
    if state is None:
        return ()
    return {"draft": (1,), "verify": (2, 3), "final": (4,)}[state.phase]


def _shown_rounds(rounds: tuple[RoundTrace, ...], cur: pb.Cursor | None) -> tuple[RoundTrace, ...]:
    """Rounds whose result is on screen (the current one only once complete)."""
    if cur is None:
        return ()
    return rounds[: cur.round + (1 if cur.complete(rounds) else 0)]


def _figures(shown: tuple[RoundTrace, ...], spec: JobView, plain: JobView | None, all_shown: bool, s: Settings,
             L: Any, spec_id: Any) -> None:
    """Running figures: tokens per target call, acceptance, measured speed-up (and c, expected at D5)."""
    base = pb.baseline_ms_per_token(plain.rounds) if plain is not None and plain.state == "done" else None
    points = pb.running_points(shown, base)
    last = points[-1] if points else None
    final = compare(spec.generation, plain.generation) if (
        all_shown and spec.generation and plain is not None and plain.generation) else None
    speed = final.speedup if final else (last.speedup if last else None)
    if s.level == "d1":
        calls, made = len(shown), sum(len(r.new_ids) for r in shown)
        st.markdown(f"**{made} words** written in **{calls} big-model turns**.  \n"
                    f"Without the helper it would take **{made} turns**.")
        st.markdown(f"With the helper it was **{strip.speed_words(speed)}**." if speed else
                    "Now we time the big model working alone, to see how much sooner the helper made it…")
        return
    c1, c2, c3 = _metric_slots(3, s)
    c1.metric(L["metric_tpc"], f"{last.tokens_per_call:.2f}" if last else "–")
    c2.metric(L["metric_acc"], f"{last.acceptance:.0%}" if last and last.acceptance is not None else "–")
    c3.metric(L["metric_speed"], f"{speed:.2f}×" if speed else "…", **_measuring(speed),
              help="Target-only ms per token ÷ speculative ms per token, same prompt and settings, measured here.")
    if s.level == "d5":
        d1c, d2c = _metric_slots(2, s)
        full = compare(spec.generation, plain.generation) if (
            spec.generation and plain is not None and plain.generation) else None
        c = full.c if full else None
        expected = full.expected_speedup if full else None
        d1c.metric(L["metric_c"], f"{c:.3f}" if c is not None else "…", **_measuring(c))
        d2c.metric(L["metric_expected"], f"{expected:.2f}×" if expected else "…", **_measuring(expected),
                   help="(1 − α^(γ+1)) / ((1 − α)(γc + 1)) with this run's α and measured c")
    if points:
        _chart("running", (spec_id, len(points), base, s.level, s.presenter),
               lambda: watch_view.running_figure(points, L, ui.font_size(s)))


def _metric_slots(n: int, s: Settings) -> list[Any]:
    """Side by side normally; one under another in presenter mode, where large type needs the width."""
    return [st.container() for _ in range(n)] if s.presenter else list(st.columns(n))


def _measuring(value: float | None) -> dict[str, Any]:
    """Metric keyword arguments that say "measuring…" under a value that is not known yet."""
    if value is not None:
        return {}
    return {"delta": "measuring…", "delta_color": "off", "delta_arrow": "off"}


def _inspector(rounds: tuple[RoundTrace, ...], cur: pb.Cursor, s: Settings, L: Any, run_id: Any, run_mode: str) -> None:
    """Pick a drafted token: p(x), q(x), min(1, p/q) and u; and the chart of the latest rejection."""
    r = rounds[cur.round]
    state = pb.lane_state(r, cur.step)
    left, right = st.columns([2, 3], gap="large")
    with left:
        st.markdown(f"**Inspect {L['round_name'].format(n=r.index + 1).lower()}**")
        if state.drafts_shown:
            options = list(range(state.drafts_shown))
            default = min(r.n_accepted, state.drafts_shown - 1)
            key = f"{P}tok.{hash(run_id) % 10**8}.{r.index}.{state.drafts_shown}"  # a new widget per round
            pick = st.pills("Drafted tokens", options, default=default, key=key,
                            format_func=lambda i: strip.pill_label(r, i, i < state.verdicts_shown))
            if pick is not None:
                st.html(strip.rule_table_html(r, pick, s.level, pick < state.verdicts_shown))
        else:
            st.caption(L["no_guess"])
    with right:
        rejected = [x for x in _shown_rounds(rounds, cur) if x.q_top is not None]
        if state.verdicts_shown > r.n_accepted and r.q_top is not None and (not rejected or rejected[-1].index != r.index):
            rejected.append(r)
        if not rejected:
            st.caption("No rejection yet: the chart of p, q and the residual appears at the first rejected guess.")
            return
        last = rejected[-1]
        _chart("rejection", (run_id, last.index, s.level, s.presenter),
               lambda: watch_view.rejection_figure(last, L, font_size=ui.font_size(s)))
        ui.lesson_md(s.level, "greedy_residual" if run_mode == "greedy" else "sampling_residual")


def _live(ref: ui.RunRef, s: Settings, status_at_run: tuple[Any, ...]) -> None:
    """One tick: advance the replay cursor if playing, then draw what has been recorded so far."""
    L = labels(s.level)
    spec, plain = _views(ref)
    if spec is None:
        st.warning("This run is no longer in memory. Press Play to run it again.")
        return
    rounds = spec.rounds
    total = pb.total_frames(rounds)
    if ss[P + "playing"] and total:
        ss[P + "frame"] = min(ss[P + "frame"] + SPEEDS[ss[P + "speed"]][1], total - 1)
    ss[P + "frame"] = max(0, min(ss[P + "frame"], max(total - 1, 0)))
    cur = pb.locate(rounds, ss[P + "frame"])
    at_end = cur is not None and ss[P + "frame"] >= total - 1 and cur.complete(rounds)
    if spec.finished and (at_end or not rounds):
        if ss[P + "playing"]:
            ss[P + "playing"] = False
        ss[P + "seen_end"] = True
    status = (spec.finished, plain.finished if plain else True, ss[P + "playing"])
    if status != status_at_run:
        st.rerun(scope="app")  # start/stop ticking and show the end-of-run sections

    _status(spec, plain, s, ref.settings, L)
    waiting = not spec.finished and (cur is None or at_end)
    state = pb.lane_state(rounds[cur.round], cur.step) if cur else None
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.subheader(L["lanes_title"])
        st.html(strip.legend_html(L))
        st.html(strip.steps_html([L[f"step{i}"] for i in range(1, 5)], _active_steps(None if waiting else state)))
        st.html(_lanes(rounds, cur, waiting, s, L))
        st.subheader(L["text_title"])
        segments = pb.text_segments(rounds, cur)
        st.html(strip.text_html(ref.prompt, segments, L, code="\n" in ref.prompt))
    with right:
        st.subheader("How it is going" if s.level == "d1" else "Running figures")
        _figures(_shown_rounds(rounds, cur), spec, plain, spec.finished and at_end, s, L, ref.spec_key)
    if cur is not None and s.level != "d1":
        st.divider()
        _inspector(rounds, cur, s, L, ref.spec_key, ref.settings.mode)


def _race(ref: ui.RunRef, s: Settings) -> None:
    """Plain vs speculative decoding, replayed on a shared clock at measured speed."""
    L = labels(s.level)
    spec, plain = _views(ref)
    st.subheader("The race" if s.level == "d1" else "Race: plain vs speculative (replayed at measured speed)")
    ui.lesson_md(s.level, "race")
    if not (spec and plain and spec.generation and plain.generation):
        made = sum(len(r.new_ids) for r in plain.rounds) if plain else 0
        st.caption(f"The race starts once both runs are measured "
                   f"(plain run: {made}/{ref.settings.max_new_tokens} {L['tokens']}).")
        return
    st.button("Start the race", icon=":material/sports_score:", key=P + "race_go", on_click=_start_race, shortcut="G")
    spec_tl = pb.race_timeline(spec.rounds, len(spec.generation.tokens))
    plain_tl = pb.race_timeline(plain.rounds, len(plain.generation.tokens))
    end_ms = max(spec_tl.total_ms, plain_tl.total_ms)
    t0 = ss.get(P + "race_t0")
    racing = t0 is not None and (time.time() - t0) * 1000 < end_ms + 300

    @st.fragment(run_every=0.1 if racing else None)
    def race_view() -> None:
        start = ss.get(P + "race_t0")
        now_ms = 0.0 if start is None else min((time.time() - start) * 1000, end_ms)
        still = start is not None and now_ms < end_ms
        if racing and not still:
            st.rerun(scope="app")
        cols = st.columns(2, gap="medium")
        sides = ((cols[0], L["race_plain"], plain_tl, "sv-plain"), (cols[1], L["race_spec"], spec_tl, "sv-spec"))
        for col, title, tl, cls in sides:
            _, made = tl.at(now_ms)
            with col:
                st.html(strip.race_html(title, tl.text_at(now_ms), made, tl.tokens[-1] if tl.tokens else 0,
                                        now_ms >= tl.total_ms, cls))
        clock = f":material/timer: {now_ms / 1000:.1f} s — " if s.level != "d1" else ""
        hint = "Press **Start the race**. " if start is None else ""
        st.caption(f"{hint}{clock}replayed at measured speed (the two runs were computed one after the other).")
        if s.level != "d1":
            _chart("race", (ref.spec_key, s.level, s.presenter), lambda: watch_view.race_figure(spec_tl, plain_tl, L, ui.font_size(s)))

    race_view()


def _same_text(ref: ui.RunRef, s: Settings) -> None:
    spec, plain = _views(ref)
    if not (spec and plain and spec.generation and plain.generation):
        return
    same = spec.generation.tokens == plain.generation.tokens
    greedy = ref.settings.mode == "greedy"
    if greedy and same:
        msg = ("The helper did not change a single word: the big model alone wrote exactly the same text."
               if s.level == "d1" else
               "Greedy check: the speculative text is token-for-token identical to the target alone.")
        st.success(msg, icon=":material/check_circle:")
    elif greedy:
        n = next((i for i, (a, b) in enumerate(zip(spec.generation.tokens, plain.generation.tokens)) if a != b),
                 min(len(spec.generation.tokens), len(plain.generation.tokens)))
        st.warning(f"The texts differ from token {n + 1} on. Both come from the target, but a pass that scores several "
                   "tokens does its floating-point sums in a different order than a one-token pass, which can flip a "
                   "near-tie between the two most likely tokens.")
    else:
        st.info("Sampling: both runs follow the target's probabilities, but the random draws fall differently, "
                "so the two texts can differ. Same seed and settings replay a run exactly.")


def _downloads(ref: ui.RunRef) -> None:
    spec, plain = _views(ref)
    if not (spec and spec.generation):
        return
    base = plain.generation if plain and plain.generation else None
    meta = {"pair": ref.spec_key[1], "prompt": ref.prompt, "drafter": ref.settings.drafter}
    with st.container(horizontal=True, gap="small"):
        st.download_button("Download trace (CSV)", export.trace_csv(spec.generation), "specviz-trace.csv", "text/csv",
                           key=P + "csv", icon=":material/download:", on_click="ignore")
        st.download_button("Download trace (JSON)", export.trace_json(spec.generation, base, meta), "specviz-trace.json",
                           "application/json", key=P + "json", icon=":material/download:", on_click="ignore")


def _lessons(ref: ui.RunRef | None, s: Settings) -> None:
    """The deeper notes of D2 and D5 (D1 keeps to the story)."""
    if s.level == "d1":
        ui.lesson_md("d1", "where")
        return
    L = labels(s.level)
    spec, plain = _views(ref)
    st.subheader("Go deeper")
    if s.level == "d2":
        with st.expander("The four steps of a round", expanded=False):
            ui.lesson_md("d2", "round")
        with st.expander("The memory picture: why checking several tokens is cheap"):
            ui.lesson_md("d2", "memory")
            st.image(str(ui.ASSETS / "memory.svg"), width=640)
            if spec and spec.rounds:
                st.plotly_chart(watch_view.verify_cost_figure(spec.rounds, plain.rounds if plain else (), L, ui.font_size(s)),
                                key=P + "cost2", config={"displayModeBar": False})
        with st.expander("Exact, not approximate"):
            ui.lesson_md("d2", "rule")
            ui.lesson_md("d2", "analogy")
        ui.lesson_md("d2", "where")
        return
    with st.expander("The acceptance rule and the residual", expanded=True):
        ui.lesson_md("d5", "rule")
    with st.expander("Leviathan's trade-off", expanded=True):
        ui.lesson_md("d5", "tradeoff")
        if spec and plain and spec.generation and plain.generation:
            sm = compare(spec.generation, plain.generation)
            if sm.alpha_checked is not None and sm.c is not None:
                st.plotly_chart(watch_view.tradeoff_figure(sm.alpha_checked, sm.c, sm.gamma, sm.speedup, L, ui.font_size(s)),
                                key=P + "tradeoff", config={"displayModeBar": False})
        else:
            st.caption("The curve for this run's α and c appears once both runs are measured.")
    with st.expander("What one target pass costs here (measured)"):
        ui.lesson_md("d5", "cpu")
        if spec and spec.rounds:
            st.plotly_chart(watch_view.verify_cost_figure(spec.rounds, plain.rounds if plain else (), L, ui.font_size(s)),
                            key=P + "cost5", config={"displayModeBar": False})
    with st.expander("Beyond one draft model: batching, features, trees"):
        for key in ("batching", "eagle", "trees"):
            ui.lesson_md("d5", key)
    ui.lesson_md("d5", "where")


# ------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------


def main() -> None:
    s = ui.settings()
    _init_state()
    _header(s)
    prompt = ui.repaired_prompt(_prompt_box())
    ref = _ref()
    spec, plain = _views(ref)
    if s.level == "d1":
        _d1_question(bool(spec and spec.finished))
    _controls(has_run=bool(spec and spec.rounds))
    if busy := ss.pop(P + "busy", None):
        st.warning(f"The server is busy: {busy}.", icon=":material/hourglass_top:")

    pair = ui.pair_or_message(s.pair)
    if pair is None:
        if ss.pop(P + "play_request", False):
            ss[P + "playing"] = False
            st.rerun()
        return
    ids: list[int] = list(pair.tokenizer(prompt)["input_ids"]) if prompt.strip() else []
    problem = prompt_problem(prompt, len(ids), pair.context_length, s.max_new_tokens)
    if problem:
        st.info(problem, icon=":material/edit:")
        if ss.pop(P + "play_request", False):
            ss[P + "playing"] = False
            st.rerun()
    else:
        _handle_play(pair, prompt, ids, s)
        ref = _ref()
    if ref is None:
        if not problem:
            st.caption(f"Ready: {len(ids)} prompt tokens, {pair.spec.title}. Press **Play** to start.")
        _lessons(None, s)
        return
    spec_key, _ = ui.run_keys(pair.spec.name, prompt, s)
    if ref.spec_key != spec_key:
        st.info("The prompt or the settings changed since this run. Press **Play** to run them; "
                "until then the previous run stays on screen.", icon=":material/sync:")

    spec, plain = _views(ref)
    finished = (spec.finished if spec else True, plain.finished if plain else True)
    playing = ss[P + "playing"]
    status = (*finished, playing)
    tick = SPEEDS[ss[P + "speed"]][0] if playing else (WAIT_TICK if not all(finished) else None)
    live = st.fragment(run_every=tick)(_live)
    with st.container(key="sv-live"):
        live(ref, s, status)
    st.divider()
    _same_text(ref, s)
    _race(ref, s)
    _downloads(ref)
    st.divider()
    _lessons(ref, s)


ui.run_page(main)
