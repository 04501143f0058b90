"""What a class sees in viz/ and the labs' words: the text in view, long pastes, numbers said from the data, predictions answered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specviz.app.settings import cut_long_prompt

from specviz.settings import MAX_PROMPT_CHARS, Settings
from specviz.core.trace import Generation, GenerationConfig, RoundTrace
from specviz.labs import how_far, why_cheap
from specviz.labs.how_far import GammaPoint
from specviz.labs import ranking
from specviz.labs.where_it_helps import WorkloadResults, WorkloadRow
from specviz.lessons import labels, lesson
from specviz.viz import how_far as how_far_view
from specviz.viz import playback as pb
from specviz.viz import predict
from specviz.viz import strip, style
from specviz.viz import watch as watch_view
from specviz.viz import where_it_helps as where_view
from specviz.viz import why_cheap as why_cheap_view
from tests.test_viz import _round

ROOT = Path(__file__).resolve().parent.parent
L = labels("d2")


# ------------------------------------------------------------------------------------------ 1: text in view


def test_a_long_prompt_is_folded_to_its_last_lines_and_the_box_scrolls_from_its_end():
    prompt = "".join(f"line {i}\n" for i in range(200)) + "last words"
    head, tail = strip.fold_prompt(prompt)
    assert head + tail == prompt and tail.count("\n") == strip.PROMPT_TAIL_LINES - 1 and tail.endswith("last words")
    html_out = strip.text_html(prompt, [], L)
    assert '<details class="sv-fold">' in html_out and f"{len(head):,} characters folded" in html_out
    assert html_out.index("last words") > html_out.index("</details>")  # the tail is outside the fold
    assert strip.fold_prompt("short prompt") == ("", "short prompt")
    assert "<details" not in strip.text_html("short prompt", [], L)
    one_line = "word " * 400  # no newlines: cut by characters, at a word boundary
    head, tail = strip.fold_prompt(one_line)
    assert head + tail == one_line and len(tail) <= strip.PROMPT_TAIL_CHARS and tail.startswith("word")
    css = (ROOT / "assets" / "style.css").read_text()
    for box in (".sv-text {", ".sv-race-text {"):  # column-reverse keeps the scroll at the end: newest text in view
        rule = css[css.index(box):css.index("}", css.index(box))]
        assert "flex-direction: column-reverse" in rule and "overflow-y: auto" in rule


# ------------------------------------------------------------------------------------------ 2: a long paste


def test_a_paste_over_the_limit_is_cut_with_a_note_not_emptied():
    state = {"watch.prompt": "x" * (MAX_PROMPT_CHARS + 5000)}
    cut_long_prompt(state, "watch.prompt")
    assert state["watch.prompt"] == "x" * MAX_PROMPT_CHARS
    assert "25,000 characters" in state["watch.prompt.note"] and "cut the last 5,000" in state["watch.prompt.note"]
    ok = {"watch.prompt": "short"}
    cut_long_prompt(ok, "watch.prompt")
    assert ok == {"watch.prompt": "short"}
    for page in ("watch", "how_far", "same_answer"):  # no page gives its box a max_chars any more
        assert "max_chars" not in (ROOT / "pages" / f"{page}.py").read_text()


# ------------------------------------------------------------------------------------------ 3: D5 numbers


def _point(gamma: int, speedup: float) -> GammaPoint:
    return GammaPoint(gamma, 0.7, 0.8, 2.0, 0.1, speedup, 50.0, 2.0, 64, True)


def test_how_far_sentence_says_where_the_points_really_sit():
    book = how_far.leviathan_curves(0.8, 0.1)
    at = dict(zip(book.gammas, book.speedup))
    points = [_point(1, at[1] - 0.5), _point(4, at[4] - 0.6), _point(8, at[8] + 0.4)]
    said = how_far_view.curve_position_sentence(points, book, None)
    assert "below the textbook curve at γ = 1 and 4" in said and "above it at γ = 8" in said
    on = how_far_view.curve_position_sentence([_point(4, at[4])], book, None)
    assert "on the textbook curve" in on and "below" not in on
    cost = how_far.verify_cost_curves(0.8, 0.1, how_far.VerifyFit(1.0, 0.25, 9))
    with_cost = how_far_view.curve_position_sentence(points, book, cost)
    assert f"Its best γ is {cost.best}, the textbook's {book.best}" in with_cost


def _gen(rounds: tuple[RoundTrace, ...], kind: str = "speculative", gamma: int = 4) -> Generation:
    tokens = tuple(t for r in rounds for t in r.new_ids)
    ms = sum(pb.round_ms(r) for r in rounds)
    return Generation(kind, "model" if kind == "speculative" else "none", GenerationConfig(max_new_tokens=64, gamma=gamma),
                      (1, 2), tokens, "text", rounds, 1.0, ms, "max_new_tokens")


def _with_ms(r: RoundTrace, draft_ms: float, verify_ms: float) -> RoundTrace:
    from dataclasses import replace
    return replace(r, draft_ms=draft_ms, verify_ms=verify_ms)


def test_watch_tradeoff_uses_the_measured_verify_cost_and_stars_its_best_gamma():
    # verify passes over 5 tokens cost 2 target steps (20 ms against 10 ms one-token steps)
    spec = _gen(tuple(_with_ms(_round(i, ("a", "b", "c", "d"), 3, "x", position=4 * i), 4.0, 20.0) for i in range(6)))
    plain = _gen(tuple(_with_ms(_round(i, (), 0, "y", position=i), 0.0, 10.0) for i in range(24)), "autoregressive")
    trade = how_far.run_tradeoff(spec, plain)
    assert trade is not None and trade.verify_steps == pytest.approx(2.0)
    assert trade.textbook.alpha == pytest.approx(0.75) and trade.textbook.c == pytest.approx(0.1)
    assert trade.with_cost.best < trade.textbook.best  # a dearer check favours shorter drafts
    assert trade.expected() < trade.expected(with_cost=False)
    fig = watch_view.tradeoff_figure(trade.textbook, trade.with_cost, trade.gamma, trade.measured, L)
    stars = [t for t in fig.data if t.marker is not None and t.marker.symbol == "star"]
    assert len(stars) == 1 and stars[0].x[0] == trade.with_cost.best
    dashed = [t for t in fig.data if t.line is not None and t.line.dash == "dash"]
    assert [t.name for t in dashed] == [L["expected_textbook"]]
    assert fig.layout.legend.y < 0  # the legend sits below the plot, clear of the title
    said = watch_view.tradeoff_sentence(trade.textbook, trade.with_cost, trade.verify_steps, trade.gamma, trade.measured)
    assert "cost 2.00 one-token target steps (more than the textbook's 1 step)" in said
    assert f"Best γ: {trade.with_cost.best} with the measured cost, {trade.textbook.best} by the textbook." in said
    assert re.search(r"this run measured \d+\.\d\d×", said)


def test_a_draft_that_cannot_pay_is_said_from_its_own_c():
    slow = how_far.RunTradeoff(how_far.leviathan_curves(0.86, 0.9), None, 4.0, None, 0.8)
    line = watch_view.cannot_pay_line(slow, "cuda")
    assert line and "CUDA" in line and "c = 0.90" in line and "prompt lookup" in line
    assert f"{how_far.best_case_speedup(4, 0.9):.2f}×" in line
    fast = how_far.RunTradeoff(how_far.leviathan_curves(0.86, 0.1), None, 4.0, None, 2.0)
    assert watch_view.cannot_pay_line(fast, "cpu") is None


# ------------------------------------------------------------------------------------------ 4: headline from data


def _wrow(title: str, group: str, speed: float, baseline_ms: float = 20.0) -> WorkloadRow:
    return WorkloadRow(title.lower(), title, group, speed, 0.5, 2.0, 10.0, baseline_ms, 32.0, True)


def _res(*rows: WorkloadRow) -> WorkloadResults:
    return WorkloadResults("run", "tiny-random", "speculative", rows)


def test_where_it_helps_headline_follows_the_measurement():
    usual = _res(_wrow("Code", "predictable", 2.0), _wrow("Poem", "creative", 1.1))
    said = where_view.headline(usual)
    assert "Code** gained most (2.00×, next Poem at 1.10×" in said and "the usual pattern" in said
    flipped = _res(_wrow("Code", "predictable", 1.22), _wrow("Poem", "creative", 1.55))
    said = where_view.headline(flipped)
    assert "Poem** gained most (1.55×" in said and "the opposite of the usual pattern" in said
    assert "hard-to-guess writing gained more" in where_view.headline(flipped, "d1")


def test_where_it_helps_names_no_winner_within_the_runs_noise():
    # issue 62's run: Code 1.39×, the story 1.41×, one baseline disturbed (113 ms against 74–88 ms)
    res = _res(_wrow("Code", "predictable", 1.39, 80.0), _wrow("A numbered list", "predictable", 1.2, 74.0),
               _wrow("A story opening", "creative", 1.41, 113.0), _wrow("A poem", "creative", 0.9, 88.0))
    assert res.timing_spread == pytest.approx(113 / 74 - 1) and res.margin == pytest.approx(113 / 74 - 1)
    assert [r.title for r in res.leaders()] == ["A story opening", "Code", "A numbered list"]
    d1, d2 = where_view.headline(res, "d1"), where_view.headline(res, "d2")
    assert "about the same with **a story opening, code and a numbered list**" in d1 and "won" not in d1
    assert "about the same" in d1.split(". ")[-1]  # the groups' means too: never "easy writing won" beside a tie
    assert "gained about the same (1.20× to 1.41×): closer than this run's 53% noise" in d2
    assert "74 to 113 ms per token" in where_view.noise_sentence(res, "d2") and not where_view.noise_sentence(res, "d1")
    # a steady clock: the same speed-ups are now a win, the floor still keeps a 1.39 against 1.41 tie
    steady = _res(_wrow("Code", "predictable", 1.39), _wrow("A story opening", "creative", 1.41),
                  _wrow("A poem", "creative", 1.0))
    assert steady.margin == ranking.MIN_MARGIN and len(steady.leaders()) == 2
    clear = _res(_wrow("Code", "predictable", 1.7), _wrow("A story opening", "creative", 1.41))
    assert [r.title for r in clear.leaders()] == ["Code"] and "Code** gained most" in where_view.headline(clear)


def test_a_tie_counts_either_prediction_right():
    answer = predict.reveal_workload("A story opening", 1.41, [("Code", 1.39)], 0.53)
    assert answer.rights == ("A story opening", "Code")
    for choice in answer.rights:
        assert f"You predicted “{choice}” — right!" in predict.verdict_html(choice, answer)
    assert "the answer is “about the same: A story opening and Code”" in predict.verdict_html("A poem", answer)
    assert "1.39× to 1.41×" in answer.measured and "53%" in answer.measured
    alone = predict.reveal_workload("Code", 2.0)
    assert alone.rights == ("Code",) and "— right!" not in predict.verdict_html("A poem", alone)


# ------------------------------------------------------------------------------------------ 5: predictions


def test_each_prediction_is_judged_against_the_measurement():
    assert predict.race_choice(0.8) == predict.RACE.choices[0] and predict.race_choice(1.74) == predict.RACE.choices[2]
    assert predict.cheap_choice(1.16) == predict.CHEAP.choices[0] and predict.cheap_choice(16.0) == predict.CHEAP.choices[2]
    right = predict.verdict_html("No, a wrong guess only costs a little time", predict.reveal_worse(True, 5))
    assert "right!" in right and "word for word the same" in right
    wrong = predict.verdict_html("Yes, it gets worse", predict.reveal_worse(True, 5), predict.D1_WORSE.text)
    assert "the answer is “No, a wrong guess only costs a little time”" in wrong
    # the answer never stands without its question (a teacher saw "No, it only takes longer" beside "a bit faster")
    assert wrong.index("Question: If the helper guesses wrong") < wrong.index("the answer is")
    asked = predict.verdict_html(None, predict.reveal_race(1.5), "Which **helper** <i>wins</i>?")
    assert "Which <b>helper</b> &lt;i&gt;wins&lt;/i&gt;?" in asked  # bold kept, anything else escaped
    assert "You predicted" not in predict.verdict_html(None, predict.reveal_race(1.5))
    q = predict.gamma_question([1, 4, 8])
    assert q.choices == ("1 guess", "4 guesses", "8 guesses") and predict.reveal_gamma(4, 1.8).right in q.choices
    assert predict.gamma_question([1, 4, 8], "d1").choices == q.choices and "γ" not in predict.gamma_question([1], "d1").text
    xss = "<img src=x onerror=alert(1)>"
    assert "<img" not in predict.verdict_html(xss, predict.reveal_workload(xss, 1.2))


# ------------------------------------------------------------------------------------------ 6: small things


def test_the_inspector_hides_p_until_the_verdict_and_the_speed_up_waits_for_a_few_rounds():
    r = _round(0, ("a", "b"), 1, "x")
    before = strip.rule_table_html(r, 0, "d5", False)
    assert "0.5000" not in before and "0.8000" in before and "after the check" in before  # q known, p not yet
    assert "0.5000" in strip.rule_table_html(r, 0, "d5", True)
    pts = pb.settled(pb.running_points((r, _round(1, ("c",), 1, "y"), _round(2, ("d",), 1, "z")), 20.0))
    assert [p.speedup is None for p in pts] == [True, True, False]
    assert Settings().level == "d1"  # a fresh visit opens at the story
    assert labels("d1")["tokens"] == "word pieces" and "word pieces" in lesson("d1", "intro")
    assert "same story" not in lesson("d1", "race")


# ------------------------------------------------------------------------------------------ 8 and 9: GPU, batches


def test_the_shipped_gpu_figures_hold_only_valid_numbers_and_say_what_follows():
    raw = json.loads((ROOT / "assets" / "verify_cost_gpu.json").read_text())
    text = json.dumps(raw)
    for invalid in ("alpha", "speedup", "run_tokens_per_call"):  # random weights: no α and no speed-up
        assert f'"{invalid}' not in text
    assert "random weights" in raw["note"]
    ref = why_cheap.load_reference()
    assert ref is not None and ref.pass_cost.ratios[-1] == pytest.approx(1.16, abs=0.01)
    assert 0.85 <= ref.step_cost.c_at(1) <= 0.95
    said = why_cheap_view.gpu_sentence(ref, 4)
    assert "**1.16** one-token steps" in said and "cannot pay" in said and "Prompt lookup" in said
    assert set(why_cheap_view.step_cost_table(ref.step_cost)["batch"]) == {1, 2, 4, 8, 16, 32, 64}
    for level in ("d2", "d5"):  # the lesson states no figure: the recording's sentence, named with its machine, does
        text = " ".join(lesson(level, "cheap_hardware").split())
        assert "1.16" not in text and "85–95" not in text and "second machine below" in text


# ------------------------------------------------------------------------------------------ 4: the int8 draft


def test_the_int8_draft_keeps_its_down_projections_out_of_activation_int8(monkeypatch):
    """fbgemm's dynamic int8 quantizes each pass's activations with one scale, which the few huge channels of a down
    projection's input wipe out: there the down projections stay fp32. rowgemm's int8 keeps activations in fp32, so
    every linear, the down projections included, holds int8 weights, the output layer over the whole vocabulary unless
    SPECVIZ_DRAFT_VOCAB=head asks for the head's ids only."""
    import torch

    from specviz.models import load_pair, rowgemm
    from specviz.models.int8w import Int8WLinear
    from specviz.models.packed import PackedLinear

    pair = load_pair("tiny-random", "int8")
    dynamic = torch.ao.nn.quantized.dynamic.Linear
    kinds = {name.rsplit(".", 1)[-1]: type(mod) for name, mod in pair.draft.named_modules()
             if isinstance(mod, (torch.nn.Linear, PackedLinear, dynamic, Int8WLinear))}  # PackedLinear: a wrong kind
    if rowgemm.kernel() is not None:
        assert set(kinds.values()) == {Int8WLinear} and pair.draft.lm_head.ids is None  # every id: the default
        monkeypatch.setenv("SPECVIZ_DRAFT_VOCAB", "head")
        assert load_pair("tiny-random", "int8").draft.lm_head.ids is not None  # the tiny head's vocabulary
    else:
        assert kinds["down_proj"] is torch.nn.Linear  # fp32 (and not packed): its input's outlier channels do not survive
        assert kinds["up_proj"] is dynamic and kinds["q_proj"] is dynamic and kinds["lm_head"] is dynamic


@pytest.mark.real
def test_smollm2_int8_draft_overlaps_its_target_more_than_with_every_linear_in_int8():
    """Σmin(p, q) at T 0.8 on the story preset, along the target's own continuation."""
    import copy

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from specviz.models import load_pair
    from specviz.models.packed import unpack_linears
    from specviz.presets import get_preset

    pair = load_pair("smollm2-135m", draft_precision="fp32")
    ids = torch.tensor([pair.tokenizer(get_preset("story").prompt)["input_ids"]])
    with torch.no_grad():
        full = pair.target.generate(ids, max_new_tokens=30, do_sample=False)
        p = torch.softmax(pair.target(full).logits[0, ids.shape[1] - 1:] / 0.8, -1)  # (30+1, V)

        def overlap(model: torch.nn.Module) -> float:
            q = torch.softmax(model(full).logits[0, ids.shape[1] - 1:] / 0.8, -1)
            return float(torch.minimum(p, q).sum(-1).mean())

        every = quantize_dynamic(unpack_linears(copy.deepcopy(pair.target)), {torch.nn.Linear: per_channel_dynamic_qconfig},
                                 dtype=torch.qint8)
        ours = load_pair("smollm2-135m").draft
        assert overlap(ours) > 0.6 and overlap(ours) > overlap(every) + 0.15


# ------------------------------------------------------------------------------------------ 7: layout


def test_long_tick_labels_break_into_lines_and_the_workload_panels_stack():
    assert style.wrap_tick("Copying from the prompt") == "Copying from<br>the prompt"
    assert style.wrap_tick("Code") == "Code"
    fig = where_view.workload_bars([_wrow("Copying from the prompt", "predictable", 1.2), _wrow("Poem", "creative", 0.9)])
    assert fig.layout.xaxis.tickangle == 0 and "Copying from<br>the prompt" in fig.data[0].x
    assert fig.layout.yaxis2.domain[1] < fig.layout.yaxis.domain[0]  # acceptance below the speed-up, not beside it
    assert not any(a.text == "1× = no gain" for a in fig.layout.annotations)  # no label sitting on the Code bar
    running = watch_view.running_figure(pb.running_points((_round(0, ("a",), 1, "x"),), 20.0), L, font_size=19)
    assert running.layout.height >= 360  # presenter type gets a taller plot


def _gpoint(gamma: int, speedup: float) -> GammaPoint:
    return GammaPoint(gamma, 0.7, 0.8, 2.0, 0.1, speedup, 50.0, 1.2, 32, True)


def test_how_far_names_one_fastest_gamma_only_beyond_the_margin():
    points = [_gpoint(1, 1.3), _gpoint(4, 1.85), _gpoint(8, 1.9)]
    lead = ranking.leaders(points, lambda p: p.speedup, ranking.MIN_MARGIN)
    assert [p.gamma for p in lead] == [8, 4]
    said = how_far_view.fastest_words(lead)
    assert "**4 guesses and 8 guesses per turn** came out about the same (1.9 times" in said
    answer = predict.reveal_gamma(8, 1.9, [(4, 1.85)], ranking.MIN_MARGIN)
    assert "— right!" in predict.verdict_html("4 guesses", answer) and "— right!" in predict.verdict_html("8 guesses", answer)
    assert "— right!" not in predict.verdict_html("1 guess", answer)
    one = ranking.leaders([_gpoint(1, 1.3), _gpoint(4, 1.9)], lambda p: p.speedup, ranking.MIN_MARGIN)
    assert "The fastest was **4 guesses per turn**" in how_far_view.fastest_words(one) and "1.9 times" in \
        how_far_view.fastest_words(one)


def _cost(ratio16: float, weights: str = "gguf on blockgemm (avx2)") -> why_cheap.PassCost:
    from specviz.bench.timing import Machine

    step = 80.0
    times = tuple((step * r, step * r) for r in (1.0, 1.0, 1.05, 1.4, ratio16))
    return why_cheap.PassCost("qwen-coder", Machine("cpu", "AMD EPYC", 2), 93, (1, 2, 4, 8, 16), times, weights)


def test_the_pass_words_and_machine_line_are_the_records():
    cheap, dear = _cost(1.66), _cost(9.0)
    assert "took **1.7 times** as long as writing one word — not 16 times" in why_cheap_view.pass_words(cheap, "d1")
    assert "were not cheap this time" in why_cheap_view.pass_words(dear, "d1")
    d2 = why_cheap_view.pass_words(cheap, "d2")
    assert "took **80 ms** here" in d2 and "2 tokens ≈ **1.00**" in d2 and "16 tokens ≈ **1.66**" in d2
    assert "checking 4 tokens at once cost" in d2  # a chain of 4 guesses is checked in a pass of 5: the largest k ≤ 5
    line = why_cheap_view.machine_line(cheap, "d2")
    assert "AMD EPYC; 2 threads" in line and "target weights: gguf on blockgemm (avx2)" in line and "KV cache" in line
    kids = why_cheap_view.machine_line(cheap, "d1")
    assert "KV cache" not in kids and "93 words of code" in kids and "no graphics card" in kids
    back = why_cheap.pass_cost_from_dict(why_cheap.pass_cost_to_dict(cheap))  # the download reads back whole
    assert back.weights == cheap.weights and back.ks == cheap.ks and back.ratios == pytest.approx(cheap.ratios)


def test_a_batch_answer_that_stopped_short_says_so():
    assert "stopped before" not in predict.reveal_busy(16, 1.1, 1.6).measured
    short = predict.reveal_busy(4, 0.7, 0.53)
    assert "stopped before 16 runs (its time limit), so this answers for 4, not 16" in short.measured
