"""Same answer: greedy runs token for token, and sampled continuations tested against the target's exact law."""

from __future__ import annotations

from typing import Any

import streamlit as st

from specviz import host
from specviz.app import drift_section, jobs, predict
from specviz.app.pairs import pair_or_message
from specviz.app.prompt import Prompt, encode, preset_buttons, repaired_prompt
from specviz.settings import Settings
from specviz.app.shell import chart, font_size, lesson_md, run_page, table
from specviz.app.sidebar import settings
from specviz.core import drafters
from specviz.core.limits import SAMPLE_TOKENS_RANGE, SAMPLES_RANGE
from specviz.labs import same_answer
from specviz.labs.same_answer import FitTest, GreedyComparison, Reference, SampleConfig, SampleCounts, SpecConfig
from specviz.presets import get_preset
from specviz.app.settings import cut_long_prompt
from specviz.viz import export
from specviz.viz import predict as predict_view
from specviz.viz import same_answer as same_answer_view
from specviz.viz.strip import md_escape

P = "same_answer."  # session_state prefix of this page
DEFAULT_PROMPT = "story"  # measured: SmolLM2's int8 draft and its target disagree here, so a lossy rule shows
DEFAULT_SAMPLES = 2000  # measured on smollm2-135m, 2 tokens: ~5 s target alone + ~7 s speculative on this CPU
DEFAULT_TOP_K = 3  # k=3 is caught at p ≈ 0 on the default prompt; k=1 distorts too little for 2000 samples
ALPHA = 0.01  # the test's significance level
ss = st.session_state


# ------------------------------------------------------------------------------------------
# Words per level
# ------------------------------------------------------------------------------------------


def _names(level: str) -> dict[str, str]:
    if level == "d1":
        return {"target": "big model alone", "spec": "with the helper", "exact": "what the big model wants",
                "same": "same?", "other": "everything else", "x": "the next words (· between pieces, ␣ = space)",
                "y": "how often (share of all tries)", "greedy_target": "big model alone",
                "greedy_spec": "with the helper"}
    return {**same_answer_view.DEFAULT_NAMES, "same": "same?"}


def _p_text(fit: FitTest) -> str:
    """A p-value that stays readable when it underflows to 0."""
    if fit.pvalue >= 1e-4:
        return f"{fit.pvalue:.3g}"
    return f"10^{fit.log10_p:.0f}" if fit.log10_p > -1e6 else "≈ 0"


# ------------------------------------------------------------------------------------------
# State and prompt
# ------------------------------------------------------------------------------------------


def _init_state() -> None:
    ss.setdefault(P + "prompt", get_preset(DEFAULT_PROMPT).prompt)
    ss.setdefault(P + "n", DEFAULT_SAMPLES)
    ss.setdefault(P + "tokens", 2)
    ss.setdefault(P + "wrong", False)
    ss.setdefault(P + "k", DEFAULT_TOP_K)


def _use_preset(preset_id: str) -> None:
    ss[P + "prompt"] = get_preset(preset_id).prompt


def _prompt_box() -> str:
    preset_buttons(P, _use_preset)
    prompt = st.text_area("Prompt (both parts continue this text)", key=P + "prompt", height=90,
                          on_change=cut_long_prompt, args=(ss, P + "prompt"))
    if note := ss.pop(P + "prompt.note", None):
        st.warning(note, icon=":material/content_cut:")
    return prompt


# ------------------------------------------------------------------------------------------
# Jobs: submitted on a button press; each part shows only what this pupil asked for
# ------------------------------------------------------------------------------------------


def _request(flag: str) -> None:
    ss[P + flag] = True


def _slot(name: str, what: tuple[str, ...], button: str, d1: bool) -> jobs.Slot:
    changed = ("You changed something. Press **{button}** to try again." if d1 else
               "The prompt or the settings changed since this result. Press **{button}** to run them; "
               "until then the previous result stays on screen.")
    return jobs.Slot(P + name, what, button, changed=changed, adopt=False, group=True,
                     gone="This result is no longer in memory. Press **{button}** to run it again.")


# ------------------------------------------------------------------------------------------
# Part 1: greedy, token by token
# ------------------------------------------------------------------------------------------


def _greedy_section(pair: Any, prompt: Prompt, s: Settings) -> None:
    d1 = s.level == "d1"
    st.subheader("1 · The same words, one by one" if d1 else "1 · Greedy: the very same tokens")
    lesson_md(s.level, "same_greedy")
    config = same_answer.greedy_config(s)
    variant = _twin_toggle(pair, s)
    key = ("same_answer.greedy", pair.spec.name, prompt.text, s.drafter, config, variant)
    problem = prompt.problem(s.max_new_tokens)
    st.caption(same_answer_view.greedy_plan(s.level, pair.spec.title, drafters.spec(s.drafter).title, s.gamma,
                                            s.adaptive, s.max_new_tokens))
    label = "Run both and compare" if not d1 else "Let both write"
    asking = st.container()  # the prediction above the button, drawn once we know whether this visitor has a result
    st.button(label, key=P + "greedy_go", type="primary", icon=":material/compare_arrows:", on_click=_request,
              args=("greedy_req",), disabled=bool(problem))
    if problem:
        st.info(problem, icon=":material/edit:")
    slot = _slot("greedy", ("Greedy runs",), label, d1)
    if ss.pop(P + "greedy_req", False) and not problem:
        jobs.start(slot, {key: lambda: same_answer.greedy_job(pair, prompt.ids, s.drafter, config, variant)})
    done = jobs.results(slot, (key,))
    if not done:
        with asking:
            predict.ask(P, predict_view.SAME, "Answer, then press the button: the two texts answer it.")
        return
    cmp = done[0]
    predict.reveal(P, predict_view.SAME, predict_view.reveal_same(cmp.n_same, cmp.n_compared, cmp.target_calls_spec,
                                                                  cmp.target_calls_plain))
    _greedy_result(cmp, s)


def _twin_toggle(pair: Any, s: Settings) -> bool:
    """D5 only: the switch that runs both greedy runs on the target's int8 twin (the same-arithmetic lesson)."""
    if s.level != "d5":
        return False
    with st.expander("The promise needs the same arithmetic", icon=":material/calculate:"):
        lesson_md(s.level, "same_arithmetic")
        if not pair.bit_exact:
            st.caption(f"The sidebar's target runs in {pair.target_precision}, which is not bit-exact here already: "
                       "the runs above use it. Choose fp32 (or automatic) to compare with the int8 twin.")
            return False
        if pair.device.type != "cpu":
            st.caption("Dynamic int8 runs on CPUs only; this server keeps its models on the GPU.")
            return False
        return st.toggle("Run both on the target's int8 twin (batch-variant arithmetic)", key=P + "twin",
                         help="The target's Linear layers in dynamic int8, quantized once from the loaded target; "
                         "it shares every other tensor, so it adds about a fifth of the target's size in memory "
                         "(qwen-coder: 1.15 GB, about 30 s the first time).")


def _shown(token: str) -> str:
    """A token in a Markdown sentence: quoted, whitespace visible, Markdown escaped (model text)."""
    return "«" + md_escape(same_answer_view.visible(token)) + "»"


def _gap_line(cmp: GreedyComparison) -> str | None:
    """Where the runs part: what each picked and how close the target's own top two were there (escaped text)."""
    d = cmp.gap
    if d is None or d.top2_gap is None:  # identical, or one run ended first: no pair of picks to weigh
        return None
    i = d.position
    spec = _shown(cmp.spec_texts[i]) if i < len(cmp.spec_texts) else "(the end)"
    plain = _shown(cmp.plain_texts[i]) if i < len(cmp.plain_texts) else "(the end)"
    model = "int8 twin" if cmp.batch_variant else "target"
    return (f"At token {i + 1} the target alone chose {plain}, the speculative run kept {spec}. One more pass of "
            f"the {model} over the text before it puts its own top two tokens **{d.top2_gap:.3g}** logits apart, and "
            f"these two picks {d.pair_gap:.3g} apart: one of the three pass shapes moved their difference by at "
            "least that much.")


def _greedy_result(cmp: GreedyComparison, s: Settings) -> None:
    d1, n = s.level == "d1", cmp.n_compared
    if cmp.identical:
        head = (f"### ✓ Exactly the same: {n} of {n} words" if d1 else
                f"### ✓ Identical: {n} of {n} tokens")
        body = ("The helper did not change a single word. It only changed how many turns the big model needed."
                if d1 else
                f"Speculative decoding produced exactly the target's greedy output, token for token "
                f"({cmp.target_calls_spec} target passes instead of {cmp.target_calls_plain}).")
        st.success(f"{head}\n\n{body}", icon=":material/check_circle:")
    else:
        i = cmp.first_divergence or 0
        why = ("Both texts come from the target's int8 twin. Dynamic int8 picks one scale for all the tokens of a "
               "pass, so a token's numbers depend on the tokens scored beside it: a verify pass and a one-token "
               "step compute different logits, and where the two likeliest tokens are close the runs choose "
               "differently." if cmp.batch_variant else
               "Both texts come from the target. A pass that scores several tokens adds up its numbers in a "
               "different order than a one-token pass; on a near-tie between the two likeliest tokens that "
               "rounding can pick the other one, and the texts go separate ways from there.")
        st.error(f"### ✗ Different from token {i + 1} on: {cmp.n_same} of {n} positions match\n\n"
                 f"{why} The table marks the first difference.", icon=":material/error:")
    if not d1:
        c1, c2, c3 = st.columns(3)
        c1.metric("target passes (speculative / alone)", f"{cmp.target_calls_spec} / {cmp.target_calls_plain}")
        c2.metric("drafted tokens accepted", f"{cmp.accepted} / {cmp.drafted}" if cmp.drafted else "–")
        speed = cmp.plain_ms / cmp.spec_ms if cmp.spec_ms > 0 else None
        c3.metric("speed-up on this machine", f"{speed:.2f}×" if speed else "–",
                  help=f"Target-only decode time ÷ speculative decode time, measured here ({host.machine_words()}). "
                  "Timing is not the point of this page; the tokens are.")
    rows_table = same_answer_view.greedy_table(cmp, _names(s.level))
    first = cmp.first_divergence
    table(rows_table, height=min(36 * (len(rows_table) + 1), 420), key=P + "greedy_table",
                 row_height=34 if s.presenter else None)
    if first is not None:
        gap = _gap_line(cmp) if not d1 else None
        st.caption(gap or f"First difference at token {first + 1}.")
    st.download_button("Download the comparison (JSON)", export.record_json(cmp), file_name="specviz-same-greedy.json",
                       mime="application/json", icon=":material/download:", key=P + "greedy_json")
    with st.expander("The two texts in full" if not d1 else "Read both texts"):
        names = _names(s.level)
        st.markdown(f"**{names['target']}**")
        st.code(cmp.plain_text or " ", language=None, wrap_lines=True)
        st.markdown(f"**{names['spec']}**")
        st.code(cmp.spec_text or " ", language=None, wrap_lines=True)


# ------------------------------------------------------------------------------------------
# Part 2: sampling, tested against the exact probabilities
# ------------------------------------------------------------------------------------------


def _sampling_controls(s: Settings) -> None:
    d1 = s.level == "d1"
    lo, hi = SAMPLES_RANGE
    with st.container(horizontal=True, gap="medium", vertical_alignment="bottom"):
        st.slider("Samples N (per method)" if not d1 else "How many tries", lo, hi, step=100, key=P + "n", width=320,
                  help="More samples find smaller differences, and take longer.")
        st.slider("Tokens per sample" if not d1 else "Words per try", *SAMPLE_TOKENS_RANGE, key=P + "tokens", width=220)
    with st.container(horizontal=True, gap="medium", vertical_alignment="center"):
        unsuited = same_answer.lossy_rule_unsuited(s.drafter)
        st.toggle("Use a WRONG acceptance rule (a lossy shortcut)" if not d1 else "Let the big model be lazy",
                  key=P + "wrong", help=unsuited or same_answer.RULE_TITLES["topk"], disabled=bool(unsuited))
        if unsuited:
            st.caption(unsuited)
        elif ss[P + "wrong"]:
            st.slider("k (accept any guess in the target's top k)", *same_answer.TOP_K_RANGE, key=P + "k", width=260)


def _sampling_section(pair: Any, prompt: Prompt, s: Settings) -> None:
    d1 = s.level == "d1"
    st.subheader("2 · Dice: the same chances" if d1 else "2 · Sampling: the same distribution")
    lesson_md(s.level, "same_sampling")
    _sampling_controls(s)
    cfg = same_answer.sample_config(s, int(ss[P + "n"]), int(ss[P + "tokens"]))
    spec = same_answer.spec_config(s, bool(ss[P + "wrong"]), int(ss[P + "k"]))
    sp = cfg.sampling
    st.caption(same_answer_view.sampling_plan(s.level, s.mode == "greedy", sp.temperature, sp.top_p, sp.seed,
                                              pair.spec.title, drafters.spec(s.drafter).title, s.gamma, cfg.n_tokens,
                                              same_answer.RULE_TITLES[spec.rule].split(':')[0]))
    ref_key = ("same_answer.ref", pair.spec.name, prompt.text, cfg)
    spec_key = ("same_answer.spec", pair.spec.name, prompt.text, cfg, spec)
    problem = prompt.problem(max(2, cfg.n_tokens))
    label = "Draw the samples" if not d1 else "Roll the dice"
    st.button(label, key=P + "sample_go", type="primary", icon=":material/casino:", on_click=_request,
              args=("sample_req",), disabled=bool(problem))
    if problem:
        st.info(problem, icon=":material/edit:")
    slot = _slot("sampling", ("Exact probabilities and target-only samples", "Speculative samples"), label, d1)
    if ss.pop(P + "sample_req", False) and not problem:
        ids = list(prompt.ids)
        jobs.start(slot, {
            ref_key: lambda: same_answer.reference_job(pair.target, pair.tokenizer, ids, cfg),
            spec_key: lambda: same_answer.speculative_job(pair.target, pair.draft, pair.tokenizer, ids, cfg, spec,
                                                                    pair.head_for(spec.drafter)),
        })
    if slot.shown() is None:
        st.caption(_pace_words(pair.spec.name, s, cfg))
        return
    done = jobs.results(slot, (ref_key, spec_key))
    shown = slot.shown()
    if done and shown:
        same_answer.PACE.note(pair.spec.name, shown[1][-1].drafter, shown[1][-2].n_tokens, done[0], done[1])
        _sampling_result(done[0], done[1], shown[1][-2], shown[1][-1], s)


def _pace_words(pair: str, s: Settings, cfg: SampleConfig) -> str:
    """How long the press will take here: from this server's last test of the same pair, helper and length."""
    found = same_answer.PACE.estimate(pair, s.drafter, cfg.n_tokens, cfg.n_samples)
    if found is None:
        return ("This server has not timed this test yet: the bars count the samples as they are drawn." if s.level != "d1"
                else "The bars show how far the tries have got.")
    seconds, timed_at = found
    if s.level == "d1":
        return f"About {_duration(seconds)} here for {cfg.n_samples} tries each (timed on the last tries here)."
    return (f"About {_duration(seconds)} on this server for {cfg.n_samples} samples each (from its last test, "
            f"of {timed_at}), with bars that count them.")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} minutes"


def _sampling_result(ref: Reference, spec: SampleCounts, cfg: SampleConfig, spec_cfg: SpecConfig, s: Settings) -> None:
    d1, names = s.level == "d1", _names(s.level)
    test = same_answer.judge(ref, spec)
    fit_t, fit_s = test.fit_target, test.fit_spec
    _verdict(fit_t, fit_s, spec_cfg.rule == "topk", spec_cfg.top_k, spec.n, d1)
    title = f"{spec.n} samples each of the next {cfg.n_tokens} token{'s' if cfg.n_tokens > 1 else ''}"
    chart(same_answer_view.histogram_figure(test.rows, names, font_size(s), title=title), P + "hist")
    if not d1:
        c1, c2, c3, c4 = st.columns(4)
        c1.metric(f"χ² p-value, {names['target']}", _p_text(fit_t), help="Goodness of fit against the exact law.")
        c2.metric(f"χ² p-value, {names['spec']}", _p_text(fit_s))
        c3.metric("total variation, target alone", f"{fit_t.tv:.3f}",
                  help="½ Σ |observed share − exact probability| over the test's bins: the sampling-noise floor.")
        c4.metric("total variation, speculative", f"{fit_s.tv:.3f}")
    st.caption(same_answer_view.sampling_times(ref.target, spec, s.level, host.machine_words()))
    record = same_answer.sampling_record(ref, spec, test, spec_cfg)
    st.download_button("Download the samples (JSON)", export.record_json(record), file_name="specviz-same-samples.json",
                       mime="application/json", icon=":material/download:", key=P + "sample_json")
    if s.level == "d5":
        st.caption(
            f"χ²: target alone {fit_t.chi2:.1f}, speculative {fit_s.chi2:.1f} on {fit_s.dof} degrees of freedom "
            f"({fit_s.n_bins} bins: every continuation with N·P ≥ {same_answer.MIN_EXPECTED:g}, the rest pooled). "
            f"Exact law: {len(ref.law.sequences)} continuations covering {ref.law.covered:.1%} of the mass, "
            f"{ref.law.forwards} target passes. Memoised distributions: the speculative samples ran "
            f"{spec.forwards} model passes for {spec.lookups} rows asked.")
        lesson_md("d5", "same_test")


def _verdict(fit_t: FitTest, fit_s: FitTest, wrong: bool, k: int, n: int, d1: bool) -> None:
    ok_s = fit_s.pvalue >= ALPHA
    if wrong and not ok_s:
        st.error(("### Caught! The lazy shortcut changed the chances.\n\nWith this rule some words come out far "
                  "too often. The real rule never does that." if d1 else
                  f"### Caught: p = {_p_text(fit_s)}\n\nThe top-{k} shortcut does not sample from the target's "
                  f"distribution, and {n} samples are plenty to see it (total variation {fit_s.tv:.3f} against "
                  f"{fit_t.tv:.3f} for the target alone)."), icon=":material/gpp_bad:")
    elif wrong:
        st.info(f"Not caught this time (p = {_p_text(fit_s)}). The top-{k} shortcut is still lossy, but its "
                "distortion here is too small for this many samples: try more samples or a larger k.",
                icon=":material/search:")
    elif ok_s:
        st.success(("### ✓ Same chances\n\nWith the helper, each word came out as often as the big model alone "
                    "would pick it." if d1 else
                    f"### ✓ Passes: p = {_p_text(fit_s)}\n\nThe speculative samples are consistent with the target's "
                    f"exact probabilities (α = {ALPHA:g}). Total variation {fit_s.tv:.3f}; the target-only samples, "
                    f"which are exact by construction, show {fit_t.tv:.3f} (pure sampling noise at this N)."), icon=":material/check_circle:")
    else:
        st.warning(f"The test flags this run (p = {_p_text(fit_s)}). At α = {ALPHA:g} one honest run in a hundred is "
                   "flagged by chance; change the seed in the sidebar and draw again. If it keeps failing, the rule "
                   "is not exact.", icon=":material/warning:")
    if fit_t.pvalue < ALPHA:
        st.caption(f"The target-only samples were flagged too (p = {_p_text(fit_t)}): that is chance, about one run "
                   "in a hundred, and shows what a false alarm looks like.")


# ------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------


def _lessons(s: Settings) -> None:
    st.subheader("Why it works" if s.level == "d1" else "Why the answer is the same")
    lesson_md(s.level, "same_why")
    if s.level != "d1":
        with st.expander("The wrong rule, and why it fails"):
            lesson_md(s.level, "same_wrong")


def main() -> None:
    s = settings()
    _init_state()
    st.title("Same answer" if s.level != "d1" else "Does the helper change the answer?")
    lesson_md(s.level, "same_intro")
    text = repaired_prompt(_prompt_box())
    pair = pair_or_message(s.pair)
    if pair is None:
        return
    prompt = encode(pair, text)
    st.divider()
    _greedy_section(pair, prompt, s)
    st.divider()
    _sampling_section(pair, prompt, s)
    st.divider()
    if s.level == "d5":
        drift_section.draw(P, pair, text, s.level)
        st.divider()
    _lessons(s)


run_page(main)
