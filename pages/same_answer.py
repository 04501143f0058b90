"""Same answer: greedy runs token for token, and sampled continuations tested against the target's exact law."""

from __future__ import annotations

from typing import Any

import streamlit as st

from specviz.labs import same_answer
from specviz.app import ui
from specviz.app.policy import bounded
from specviz.core.drafters import make_drafter
from specviz.core.trace import GenerationConfig
from specviz.labs.same_answer import FitTest, GreedyComparison, Reference, SampleConfig, SampleCounts, SpecConfig
from specviz.presets import get_preset
from specviz.core.sampling import SamplingConfig
from specviz.app.settings import Settings, prompt_problem
from specviz.viz import same_answer as same_answer_view

P = "same."  # session_state prefix of this page
DEFAULT_PROMPT = "story"  # measured: SmolLM2's int8 draft and its target disagree here, so a lossy rule shows
DEFAULT_SAMPLES = 2000  # measured on smollm2-135m, 2 tokens: ~5 s target alone + ~7 s speculative on this CPU
DEFAULT_TOP_K = 3  # k=3 is caught at p ≈ 0 on the default prompt; k=1 distorts too little for 2000 samples
ALPHA = 0.01  # the test's significance level
MAX_PROMPT_CHARS = 20_000
POLL = 1.0  # seconds between status redraws while a job runs
ss = st.session_state


# ------------------------------------------------------------------------------------------
# Words per level
# ------------------------------------------------------------------------------------------


def _names(level: str) -> dict[str, str]:
    if level == "d1":
        return {"target": "big model alone", "spec": "with the helper", "exact": "what the big model wants",
                "same": "same?", "other": "everything else", "x": "the next words (· between pieces, ␣ = space)",
                "y": "how often (share of all tries)"}
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
    ui.preset_buttons(P, _use_preset)
    return st.text_area("Prompt (both parts continue this text)", key=P + "prompt", height=90,
                        max_chars=MAX_PROMPT_CHARS)


# ------------------------------------------------------------------------------------------
# Jobs: submit on a button press, keep the keys, poll while they run
# ------------------------------------------------------------------------------------------


def _request(flag: str) -> None:
    ss[P + flag] = True


def _views(keys: tuple[tuple[Any, ...], ...]) -> list[Any] | None:
    """The jobs' views, or None when one of them is gone from the runner (evicted: press again)."""
    jobs = [ui.job(k) for k in keys]
    if any(j is None for j in jobs):
        return None
    return [j.view() for j in jobs]


def _shown_keys(name: str, current: tuple[tuple[Any, ...], ...], L1: bool) -> tuple[tuple[Any, ...], ...] | None:
    keys = ss.get(P + name)
    if keys is not None and keys != current:
        st.info("The prompt or the settings changed since this result. Press the button to run them; "
                "until then the previous result stays on screen." if not L1 else
                "You changed something. Press the button to try again.", icon=":material/sync:")
    return keys


# ------------------------------------------------------------------------------------------
# Part 1: greedy, token by token
# ------------------------------------------------------------------------------------------


def _greedy_config(s: Settings) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=s.max_new_tokens, gamma=s.gamma, adaptive=s.adaptive,
                            sampling=SamplingConfig("greedy"))


def _greedy_section(pair: Any, prompt: str, ids: list[int], s: Settings) -> None:
    d1 = s.level == "d1"
    st.subheader("1 · The same words, one by one" if d1 else "1 · Greedy: the very same tokens")
    ui.lesson_md(s.level, "same_greedy")
    config = _greedy_config(s)
    key = ("same.greedy", pair.spec.name, prompt, s.drafter, config)
    problem = prompt_problem(prompt, len(ids), pair.context_length, s.max_new_tokens)
    st.caption(f"{pair.spec.title} · drafter: {ui.DRAFTER_TITLES[s.drafter]} · γ = {s.gamma}"
               f"{' (adaptive)' if s.adaptive else ''} · {s.max_new_tokens} new tokens · greedy "
               "(the sidebar's pair, drafter, γ and max new tokens)")
    st.button("Run both and compare" if not d1 else "Let both write", key=P + "greedy_go", type="primary",
              icon=":material/compare_arrows:", on_click=_request, args=("greedy_req",), disabled=bool(problem))
    if problem:
        st.info(problem, icon=":material/edit:")
    if ss.pop(P + "greedy_req", False) and not problem:
        drafter = make_drafter(s.drafter, pair.draft, adaptive=s.adaptive)
        job_ids = list(ids)
        if ui.submit_job(key, lambda: same_answer.greedy_comparison(pair.target, drafter, pair.tokenizer, job_ids, config,
                                                                  pair.eos_ids)):
            ss[P + "greedy"] = (key,)
    keys = _shown_keys("greedy", (key,), d1)
    if keys is None:
        return
    views = _views(keys)
    if views is None:
        st.warning("This result is no longer in memory. Press the button to run it again.")
        return
    view = views[0]
    if not view.finished:
        ui.poll_jobs(keys, ("Greedy runs",), every=POLL)
        return
    if view.state != "done":
        ui.show_job_status(ui.job(keys[0]), view, "Greedy runs")
        return
    _greedy_result(view.result, s)


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
        st.error(f"### ✗ Different from token {i + 1} on: {cmp.n_same} of {n} positions match\n\n"
                 "Both texts come from the target. A pass that scores several tokens adds up its numbers in a "
                 "different order than a one-token pass; on a near-tie between the two likeliest tokens that "
                 "rounding can pick the other one, and the texts go separate ways from there. "
                 "The table marks the first difference.", icon=":material/error:")
    if not d1:
        c1, c2, c3 = st.columns(3)
        c1.metric("target passes (speculative / alone)", f"{cmp.target_calls_spec} / {cmp.target_calls_plain}")
        c2.metric("drafted tokens accepted", f"{cmp.accepted} / {cmp.drafted}" if cmp.drafted else "–")
        speed = cmp.plain_ms / cmp.spec_ms if cmp.spec_ms > 0 else None
        c3.metric("speed-up on this machine", f"{speed:.2f}×" if speed else "–",
                  help="Target-only decode time ÷ speculative decode time, measured here (a shared 2-core CPU, "
                  "no GPU). Timing is not the point of this page; the tokens are.")
    table = same_answer_view.greedy_table(cmp, _names(s.level))
    first = cmp.first_divergence
    st.dataframe(table, hide_index=True, height=min(36 * (len(table) + 1), 420), key=P + "greedy_table",
                 row_height=34 if s.presenter else None)
    if first is not None:
        st.caption(f"First difference at token {first + 1}.")
    with st.expander("The two texts in full" if not d1 else "Read both texts"):
        names = _names(s.level)
        st.markdown(f"**{names['target']}**")
        st.code(cmp.plain_text or " ", language=None, wrap_lines=True)
        st.markdown(f"**{names['spec']}**")
        st.code(cmp.spec_text or " ", language=None, wrap_lines=True)


# ------------------------------------------------------------------------------------------
# Part 2: sampling, tested against the exact probabilities
# ------------------------------------------------------------------------------------------


def _sample_config(s: Settings) -> SampleConfig:
    sampling = SamplingConfig("sample", temperature=s.temperature, top_p=s.top_p, seed=s.seed)
    n = bounded(ss[P + "n"], *same_answer.SAMPLES_RANGE, DEFAULT_SAMPLES)  # the slider's range, held again here
    return SampleConfig(sampling, n_samples=n, n_tokens=bounded(ss[P + "tokens"], *same_answer.TOKENS_RANGE, 2))


def _spec_config(s: Settings) -> SpecConfig:
    wrong = bool(ss[P + "wrong"])
    return SpecConfig(gamma=s.gamma, drafter=s.drafter, rule="topk" if wrong else "exact",
                      top_k=bounded(ss[P + "k"], *same_answer.TOP_K_RANGE, DEFAULT_TOP_K) if wrong else 0)


def _sampling_controls(s: Settings) -> None:
    d1 = s.level == "d1"
    lo, hi = same_answer.SAMPLES_RANGE
    with st.container(horizontal=True, gap="medium", vertical_alignment="bottom"):
        st.slider("Samples N (per method)" if not d1 else "How many tries", lo, hi, step=100, key=P + "n", width=320,
                  help="More samples find smaller differences, and take longer.")
        st.slider("Tokens per sample" if not d1 else "Words per try", *same_answer.TOKENS_RANGE, key=P + "tokens", width=220)
    with st.container(horizontal=True, gap="medium", vertical_alignment="center"):
        st.toggle("Use a WRONG acceptance rule (a lossy shortcut)" if not d1 else "Let the big model be lazy",
                  key=P + "wrong", help=same_answer.RULE_TITLES["topk"])
        if ss[P + "wrong"]:
            st.slider("k (accept any guess in the target's top k)", *same_answer.TOP_K_RANGE, key=P + "k", width=260)


def _sampling_section(pair: Any, prompt: str, ids: list[int], s: Settings) -> None:
    d1 = s.level == "d1"
    st.subheader("2 · Dice: the same chances" if d1 else "2 · Sampling: the same distribution")
    ui.lesson_md(s.level, "same_sampling")
    _sampling_controls(s)
    cfg, spec = _sample_config(s), _spec_config(s)
    sp = cfg.sampling
    where = ("The sidebar is on greedy, so this part uses the sidebar's sampling settings anyway: "
             if s.mode == "greedy" else "Sampling settings from the sidebar: ")
    st.caption(f"{where}temperature {sp.temperature:g}, top-p {sp.top_p:g}, seed {sp.seed} · {pair.spec.title} · "
               f"drafter: {ui.DRAFTER_TITLES[s.drafter]} · γ = {s.gamma} (fixed here; a sample drafts at most "
               f"{max(1, cfg.n_tokens - 1)} of them) · rule: {same_answer.RULE_TITLES[spec.rule].split(':')[0]}")
    ref_key = ("same.ref", pair.spec.name, prompt, cfg)
    spec_key = ("same.spec", pair.spec.name, prompt, cfg, spec)
    problem = prompt_problem(prompt, len(ids), pair.context_length, max(2, cfg.n_tokens))
    st.button("Draw the samples" if not d1 else "Roll the dice", key=P + "sample_go", type="primary",
              icon=":material/casino:", on_click=_request, args=("sample_req",), disabled=bool(problem))
    if problem:
        st.info(problem, icon=":material/edit:")
    if ss.pop(P + "sample_req", False) and not problem and ui.room_for(ref_key, spec_key):  # both or neither
        job_ids = list(ids)
        ref = ui.submit_job(ref_key, lambda: same_answer.reference_job(pair.target, pair.tokenizer, job_ids, cfg))
        sj = ui.submit_job(spec_key, lambda: same_answer.speculative_job(pair.target, pair.draft, pair.tokenizer, job_ids,
                                                                       cfg, spec))
        if ref and sj:
            ss[P + "sampling"] = (ref_key, spec_key)
    keys = _shown_keys("sampling", (ref_key, spec_key), d1)
    if keys is None:
        if pair.spec.name.startswith("qwen-coder"):
            st.caption("On the 1.5B pair every continuation not seen before costs a full target pass and each sample "
                       "handles a 152k-token vocabulary: measured on this shared CPU, the default 2000 two-token samples "
                       "took about 1 minute for the target alone and 2–4 minutes with speculation. SmolLM2-135M "
                       "finishes the default in well under a minute.")
        return
    views = _views(keys)
    if views is None:
        st.warning("This result is no longer in memory. Press the button to draw the samples again.")
        return
    if not all(v.finished for v in views):
        ui.poll_jobs(keys, ("Exact probabilities and target-only samples", "Speculative samples"), every=POLL)
        return
    for v, key, what in zip(views, keys, ("Target-only samples", "Speculative samples")):
        if v.state != "done":
            ui.show_job_status(ui.job(key), v, what)
            return
    _sampling_result(views[0].result, views[1].result, keys[1][-2], keys[1][-1], s)


def _sampling_result(ref: Reference, spec: SampleCounts, cfg: SampleConfig, spec_cfg: SpecConfig, s: Settings) -> None:
    d1, names = s.level == "d1", _names(s.level)
    fit_t, fit_s = same_answer.fit_test(ref.law, ref.target), same_answer.fit_test(ref.law, spec)
    wrong = spec_cfg.rule == "topk"
    _verdict(fit_t, fit_s, wrong, spec_cfg.top_k, spec.n, d1)
    rows = same_answer.histogram_rows(ref.law, ref.target, spec)
    title = f"{spec.n} samples each of the next {cfg.n_tokens} token{'s' if cfg.n_tokens > 1 else ''}"
    st.plotly_chart(same_answer_view.histogram_figure(rows, names, ui.font_size(s), title=title), key=P + "hist",
                    config={"displayModeBar": False})
    if not d1:
        c1, c2, c3, c4 = st.columns(4)
        c1.metric(f"χ² p-value, {names['target']}", _p_text(fit_t), help="Goodness of fit against the exact law.")
        c2.metric(f"χ² p-value, {names['spec']}", _p_text(fit_s))
        c3.metric("total variation, target alone", f"{fit_t.tv:.3f}",
                  help="½ Σ |observed share − exact probability| over the test's bins: the sampling-noise floor.")
        c4.metric("total variation, speculative", f"{fit_s.tv:.3f}")
    accepted = f"{spec.accepted} of {spec.drafted} guesses accepted" if spec.drafted else "nothing was drafted"
    st.caption(f"Measured on this machine (a shared 2-core CPU, no GPU): target alone {ref.target.seconds:.1f} s, "
               f"speculative {spec.seconds:.1f} s for {spec.n} samples each; {accepted}.")
    if s.level == "d5":
        st.caption(
            f"χ²: target alone {fit_t.chi2:.1f}, speculative {fit_s.chi2:.1f} on {fit_s.dof} degrees of freedom "
            f"({fit_s.n_bins} bins: every continuation with N·P ≥ {same_answer.MIN_EXPECTED:g}, the rest pooled). "
            f"Exact law: {len(ref.law.sequences)} continuations covering {ref.law.covered:.1%} of the mass, "
            f"{ref.law.forwards} target passes. Memoised distributions: the speculative samples ran "
            f"{spec.forwards} model passes for {spec.lookups} rows asked.")
        ui.lesson_md("d5", "same_test")


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
    ui.lesson_md(s.level, "same_why")
    if s.level != "d1":
        with st.expander("The wrong rule, and why it fails"):
            ui.lesson_md(s.level, "same_wrong")


def main() -> None:
    s = ui.settings()
    _init_state()
    st.title("Same answer" if s.level != "d1" else "Does the helper change the answer?")
    ui.lesson_md(s.level, "same_intro")
    prompt = ui.repaired_prompt(_prompt_box())
    pair = ui.pair_or_message(s.pair)
    if pair is None:
        return
    ids: list[int] = list(pair.tokenizer(prompt)["input_ids"]) if prompt.strip() else []
    st.divider()
    _greedy_section(pair, prompt, ids, s)
    st.divider()
    _sampling_section(pair, prompt, ids, s)
    st.divider()
    _lessons(s)


ui.run_page(main)
