"""Watch it work: pick or type a prompt, press play, and watch real speculative decoding round by round."""

from __future__ import annotations

from typing import Any

import streamlit as st

from specviz.app import jobs
from specviz.app import watch_sections as sections
from specviz.app import watch_state as ws
from specviz.app.watch_state import P
from specviz.core import metrics
from specviz.app.pairs import pair_or_message
from specviz.app.prompt import encode, preset_buttons, repaired_prompt
from specviz.serve.worker import JobView
from specviz.app.settings import shown
from specviz.settings import Settings
from specviz.app.shell import font_size, lesson_md, run_page
from specviz.app.sidebar import settings, write_page_query
from specviz.labs import watch
from specviz.labs.watch import RoundTrace, RunRef
from specviz.lessons import labels, lesson
from specviz.models import drafting
from specviz.presets import DEFAULT_PRESET, PRESETS
from specviz.app.settings import cut_long_prompt
from specviz.app import predict
from specviz.viz import predict as predict_view
from specviz.viz import how_far as how_far_view
from specviz.viz import watch as watch_view
from specviz.viz import playback as pb
from specviz.viz import strip
from specviz.viz import tree as tree_view

MAX_LANES = 6  # lanes on screen: the current round and the ones before it
PROMPT_URL_MAX = 1500  # longer prompts stay out of the URL
ss = st.session_state


# ------------------------------------------------------------------------------------------
# Page sections
# ------------------------------------------------------------------------------------------


def _header(s: Settings) -> None:
    st.title("Watch it work" if s.level != "d1" else "Watch the helper at work")
    notes = ss.get(P + "notes", [])
    if notes and ss.setdefault(P + "notes_for", s) == s:  # kept through the page's own reruns (Play's), as the sidebar's
        for note in notes:
            st.warning(note, icon=":material/link:")
    else:
        ss.pop(P + "notes", None)
    lesson_md(s.level, "intro")
    if s.level == "d1":
        lesson_md("d1", "picture")


def _prompt_box() -> str:
    preset_buttons(P, ws.use_preset, {"predictable": " — the helper should guess well",
                                    "creative": " — many good next words"})
    prompt = st.text_area("Prompt (the models continue this text)", key=P + "prompt", height=110,
                          on_change=cut_long_prompt, args=(ss, P + "prompt"), persist_state="session")
    if note := ss.pop(P + "prompt.note", None):
        st.warning(note, icon=":material/content_cut:")
    preset = next((p.id for p in PRESETS if p.prompt == prompt), None)
    url: dict[str, str] = {"speed": ss[P + "speed"]} if ss[P + "speed"] != "normal" else {}
    if preset and preset != DEFAULT_PRESET:
        url["preset"] = preset
    elif not preset and len(prompt) <= PROMPT_URL_MAX:
        url["prompt"] = prompt
    write_page_query(url, ("preset", "prompt", "speed", "autoplay"))
    return prompt


def _d1_question(finished: bool) -> None:
    """Ask before the run; after it, judge the recorded choice against this run's own check."""
    if ss.get(P + "revealed") or (finished and ss.get(P + "seen_end")):
        ss[P + "revealed"] = True
        spec, plain = ws.views(ws.ref())
        if spec and spec.generation:
            same = None
            if plain and plain.generation and spec.generation.config.sampling.greedy:
                same = spec.generation.tokens == plain.generation.tokens
            rejected = sum(1 for r in spec.generation.rounds if r.n_accepted < len(r.draft_ids))
            predict.reveal(P, predict_view.D1_WORSE, predict_view.reveal_worse(same, rejected))
        st.html(f'<div class="sv-answer">{_md_to_html(lesson("d1", "answer"))}</div>')
        return
    predict.ask(P, predict_view.D1_WORSE, "The answer appears after the first run.")


def _md_to_html(text: str) -> str:
    """Tiny Markdown-to-HTML for our own lesson text (bold only), escaped first."""
    parts = strip.esc(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def _controls(has_run: bool) -> None:
    playing = ss[P + "playing"]
    with st.container(horizontal=True, gap="small", vertical_alignment="bottom"):
        if playing:
            st.button("Pause", key=P + "pause", icon=":material/pause:", on_click=ws.pause, shortcut="K",
                      type="primary")
        else:
            st.button("Play", key=P + "play", icon=":material/play_arrow:", on_click=ws.request_play, shortcut="K",
                      type="primary")
        st.button("Step back", key=P + "back", icon=":material/skip_previous:", on_click=ws.back,
                  disabled=not has_run, shortcut="J", help="Show the previous round (J)")
        st.button("Step one round", key=P + "step", icon=":material/skip_next:", on_click=ws.step,
                  disabled=not has_run, shortcut="L", help="Finish this round, or show the next one (L)")
        st.button("Replay", key=P + "replay", icon=":material/replay:", on_click=ws.replay, disabled=not has_run,
                  shortcut="Home", help="Replay the recorded rounds from the start (Home). Replays never call a model.")
        st.button("Show the result now", key=P + "to_end", icon=":material/fast_forward:", on_click=ws.to_end,
                  disabled=not has_run, shortcut="End", help="Jump the replay to its end (End)")
        st.select_slider("Animation speed", options=list(ws.SPEEDS), key=P + "speed", width=260, persist_state="session")
    st.caption("Keyboard: **K** play/pause · **J** step back · **L** step one round · **Home** replay · **End** the result")


def _status(ref: RunRef, spec: JobView, plain: JobView | None, s: Settings, L: Any) -> None:
    """One line on the run (and the baseline's, if it failed or was stopped), in the level's words; the lanes show
    the rounds."""
    if spec.state in ("failed", "cancelled", "queued"):
        jobs.show_status(ref.spec_key, spec, "This run", "Play")
    elif line := watch.run_words(spec.generation if spec.state == "done" else None, spec.state == "running",
                                 len(spec.rounds), s.level == "d1", L):
        st.caption(line)
    if plain is not None:
        _baseline_line(ref, plain)


def _timing_line(ref: RunRef, spec: JobView, plain: JobView | None, s: Settings, L: Any) -> None:
    """While the run and its baseline are timed: where each stands, in one light block (the replay comes after)."""
    if spec.state in ("failed", "cancelled", "queued"):
        jobs.show_status(ref.spec_key, spec, "This run", "Play")
    if plain is not None and plain.state in ("failed", "cancelled", "queued"):
        _baseline_line(ref, plain)
    made = sum(len(r.new_ids) for r in spec.rounds)
    base = sum(len(r.new_ids) for r in plain.rounds) if plain is not None else 0
    total = max(1, 2 * ref.settings.max_new_tokens)
    st.progress(min(1.0, (made + base) / total), text=watch.measuring_words(
        made, len(spec.rounds), base, ref.settings.max_new_tokens, s.level == "d1", L))
    st.caption(watch.still_words(s.level == "d1"))


def _baseline_line(ref: RunRef, plain: JobView) -> None:
    """Where the target-only baseline stands: failed or stopped, waiting its turn, or being measured."""
    if plain.state in ("failed", "cancelled"):
        jobs.show_status(ref.plain_key, plain, "The plain run for comparison", "Play")
    elif not plain.finished:
        j = jobs.job(ref.plain_key)
        ahead = jobs.runner().ahead(j) if j and plain.state == "queued" else 0
        made = sum(len(r.new_ids) for r in plain.rounds)
        st.caption(watch.baseline_words(plain.state == "queued", ahead, made, ref.settings.max_new_tokens))


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


def _latest_tree_round(rounds: tuple[RoundTrace, ...], cur: pb.Cursor | None,
                       state: pb.LaneState | None) -> RoundTrace | None:
    """The latest tree round whose verdict is on screen (a run's last token may be a plain step without a tree)."""
    if cur is None:
        return None
    last = cur.round if state is not None and state.final_shown else cur.round - 1
    return next((rounds[i] for i in range(last, -1, -1) if rounds[i].tree is not None), None)


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
    points = pb.settled(pb.running_points(shown, base))
    last = points[-1] if points else None
    final = watch.comparison(spec.generation, plain.generation) if all_shown and plain is not None else None
    speed = final.speedup if final else (last.speedup if last else None)
    early = not final and shown and len(shown) < pb.SPEEDUP_FROM_ROUND
    shared = _shared(spec, plain, final.speedup, s) if final is not None else None  # type: ignore[arg-type]
    busy = shared is not None and shared.busy
    if s.level == "d1":
        calls, made = len(shown), sum(len(r.new_ids) for r in shown)
        st.markdown(f"**{made} {L['tokens']}** written in **{calls} big-model turns**.  \n"
                    f"Without the helper it would take **{made} turns**.")
        st.markdown("The computer was busy with something else while we timed it, so we cannot tell this time "
                    "how much sooner the helper made it. Press **Play** again when it is quiet." if busy else
                    f"With the helper it was **{strip.speed_words(speed)}**." if speed else
                    "After a few turns we can tell how much sooner it is." if early else
                    "Now we time the big model working alone, to see how much sooner the helper made it…")
        if shared is not None:
            _sharing_line(shared, s)
        return
    c1, c2, c3 = _metric_slots(3, s)
    c1.metric(L["metric_tpc"], f"{last.tokens_per_call:.2f}" if last else "–")
    c2.metric(L["metric_acc"], f"{last.acceptance:.0%}" if last and last.acceptance is not None else "–")
    c3.metric(L["metric_speed"], f"{speed:.2f}×" if speed else "…",
              **({"delta": "uncertain: busy", "delta_color": "off", "delta_arrow": "off"} if busy else
                 _measuring(speed)),
              help="Target-only ms per token ÷ speculative ms per token, same prompt and settings, measured here. "
                   f"Shown from round {pb.SPEEDUP_FROM_ROUND}: the first rounds include the models warming up.")
    if s.level == "d5":
        d1c, d2c = _metric_slots(2, s)
        d3c, _ = _metric_slots(2, s)  # two per row: three abreast cut the labels in the narrow column
        full = watch.comparison(spec.generation, plain.generation if plain is not None else None)
        c = full.c if full else None
        textbook = full.expected_speedup if full else None  # both from the run's one Comparison record
        with_cost = full.expected_speedup_measured_verify if full else None
        d1c.metric(L["metric_c"], f"{c:.3f}" if c is not None else "…", **_measuring(c))
        if spec.generation and not metrics.chain_formula_applies(spec.generation.drafter):  # e.g. a tree
            cost = full.verify_steps if full else None
            d2c.metric("nodes per tree", f"{full.gamma:.1f}" if full else "…", **_measuring(full.gamma if full else None))
            d3c.metric("tree pass (steps)", f"{cost:.2f}" if cost else "…", **_measuring(cost),
                       help="What one target pass over the whole tree costs, in one-token target steps, measured here. "
                            "Leviathan's expected speed-up is for chains, so it is not shown for trees.")
        else:
            _expected_metrics(d2c, d3c, textbook, with_cost, L)
    if shared is not None:
        _sharing_line(shared, s)
    if points:
        sections.cached_chart("running", (spec_id, len(points), base, s.level, s.presenter),
               lambda: watch_view.running_figure(points, L, font_size(s)))
    shares = metrics.acceptance_by_position(shown) if s.level == "d5" else ()
    if len(shares) > 1:  # D5: how often the k-th guess of a round was accepted, so far
        st.markdown("**Acceptance by position:** of the rounds so far, the share that accepted their k-th guess.")
        sections.cached_chart("positions", (spec_id, len(shown), s.level, s.presenter),
               lambda: how_far_view.position_figure([("this run", shares)], font_size(s)))
        st.caption(how_far_view.position_sentence(shares))


@st.cache_resource(show_spinner=False)
def _alone_record() -> watch.AloneRecord:
    """One per server: what each pair and settings gave when its run had the server to itself."""
    return watch.AloneRecord()


def _shared(spec: JobView, plain: JobView, speedup: float | None, s: Settings) -> watch.SharedServer | None:
    """How the server was shared while both runs were timed (None for a run from before this server's record)."""
    ref = ws.ref()
    if ref is None:
        return None
    reused = None if watch.timed_together(spec, plain) or plain.timed is None else plain.timed[0]
    return _alone_record().shared(ref, s.pair, spec.sharing, plain.sharing, speedup, plain.generation,
                                  watch.others_during(spec, plain), reused)


def _sharing_line(shared: watch.SharedServer, s: Settings) -> None:
    """How the server was shared while both runs were timed; a warning where the machine was busy with something else."""
    if shared.busy and s.level != "d1":
        st.warning(watch.busy_warning(shared), icon=":material/speed:")
    if line := watch.sharing_words(shared, s.level, shown(shared.alone_prompt or "")):
        st.caption(line)


def _expected_metrics(left: Any, right: Any, textbook: float | None, with_cost: float | None, L: Any) -> None:
    """Leviathan's expected speed-up, textbook and with the measured verify cost (chains only)."""
    left.metric(L["metric_expected"], f"{textbook:.2f}×" if textbook else "…", **_measuring(textbook),
                help="(1 − α^(γ+1)) / ((1 − α)(γc + 1)) with this run's α (accepted ÷ checked) and measured c: "
                     "a verify pass counted as one target step")
    right.metric(L["metric_expected_cost"], f"{with_cost:.2f}×" if with_cost else "…", **_measuring(with_cost),
                 help="The same formula with the measured cost of this run's verify pass in place of the 1")


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
        helper = watch.helper_sentence(r)
        if helper:
            st.caption(helper)
        if state.drafts_shown:
            options = list(range(state.drafts_shown))
            default = min(r.n_accepted, state.drafts_shown - 1)
            key = f"{P}tok.{hash(run_id) % 10**8}.{r.index}.{state.drafts_shown}"  # a new widget per round
            pick = st.pills("Drafted tokens", options, default=default, key=key, required=True,
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
        sections.cached_chart("rejection", (run_id, last.index, s.level, s.presenter),
               lambda: watch_view.rejection_figure(last, L, font_size=font_size(s)))
        lesson_md(s.level, "greedy_residual" if run_mode == "greedy" else "sampling_residual")


def _live(ref: RunRef, s: Settings, status_at_run: tuple[Any, ...]) -> None:
    """One tick: advance the replay cursor if playing, then draw what has been recorded so far."""
    inline = ss.pop(P + "live_inline", False)  # drawn by the page's own run, not by a tick of the fragment
    L = labels(s.level)
    spec, plain = ws.views(ref)
    if spec is None:
        st.warning("This run is no longer in memory. Press Play to run it again.")
        return
    rounds = spec.rounds
    status = ws.tick_status(spec, plain)
    if status != status_at_run and not inline:
        # start/stop ticking and show the end-of-run sections. Not during the page's own run: a job that left
        # the queue a moment ago would rerun the page at once and lose its one-time notes (the next tick does it)
        st.rerun(scope="app")
    if ws.measuring(spec, plain):
        _timing_line(ref, spec, plain, s, L)
        return
    cur, at_end = ws.advance(spec)
    _status(ref, spec, plain, s, L)
    waiting = not spec.finished and (cur is None or at_end)
    state = pb.lane_state(rounds[cur.round], cur.step) if cur else None
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.subheader(L["lanes_title"])
        st.html(strip.legend_html(L))
        st.html(strip.steps_html([L[f"step{i}"] for i in range(1, 5)], _active_steps(None if waiting else state)))
        st.html(_lanes(rounds, cur, waiting, s, L))
        tree_round = _latest_tree_round(rounds, cur, state)
        if tree_round is not None:
            st.html(tree_view.tree_html(tree_round, s.level))
            lesson_md(s.level, "tree")
        st.subheader(L["text_title"])
        segments = pb.text_segments(rounds, cur)
        st.html(strip.text_html(ref.prompt, segments, L, code="\n" in ref.prompt))
    with right:
        st.subheader("How it is going" if s.level == "d1" else "Running figures")
        _figures(_shown_rounds(rounds, cur), spec, plain, spec.finished and at_end, s, L, ref.spec_key)
    if cur is not None and s.level != "d1":
        st.divider()
        _inspector(rounds, cur, s, L, ref.spec_key, ref.settings.mode)


# ------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------


def main() -> None:
    s = settings()
    ws.init_state()
    _header(s)
    text = repaired_prompt(_prompt_box())
    ref = ws.ref()
    spec, plain = ws.views(ref)
    if s.level == "d1":
        _d1_question(bool(spec and spec.finished))
    _controls(has_run=bool(spec and spec.rounds))
    sections.memory_note(s)
    if busy := ss.pop(P + "busy", None):
        st.warning(busy, icon=":material/hourglass_top:")

    pair = pair_or_message(s.pair)
    if pair is None:
        ws.drop_play_request()
        return
    if (problem := drafting.why_not(s.drafter, pair)) is not None:
        st.info(f"{problem} Choose another drafter in the sidebar.", icon=":material/info:")
        ws.drop_play_request()
        return
    prompt = encode(pair, text)
    problem = prompt.problem(s.max_new_tokens)
    if problem:
        st.info(problem, icon=":material/edit:")
        ws.drop_play_request()
    else:
        ws.handle_play(pair, prompt, s)
        ref = ws.ref()
    if ref is None:
        if not problem:
            st.caption(f"Ready: {len(prompt.ids)} prompt tokens, {pair.spec.title}. Press **Play** to start.")
        sections.lessons(None, s)
        return
    if ref.asks != watch.run_ref(pair.spec.name, text, s).asks:
        st.info("The prompt or the settings changed since this run. Press **Play** to run them; "
                "until then the previous run stays on screen.", icon=":material/sync:")

    spec, plain = ws.views(ref)
    status = ws.tick_status(spec, plain)
    tick = ws.tick_seconds(ref, status)
    live = st.fragment(run_every=tick)(_live)
    with st.container(key="sv-live"):
        ss[P + "live_inline"] = True
        live(ref, s, status)
    st.divider()
    sections.same_text(ref, s)
    sections.drafter_verdict(ref, s, pair.device.type)
    sections.race(ref, s)
    sections.second_time(ref, s)
    sections.head_section(ref, s, pair)
    sections.downloads(ref)
    st.divider()
    sections.lessons(ref, s)


run_page(main)
