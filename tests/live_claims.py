"""The live lab tests' readings: every claim a lab page states about its run, checked against the run's downloaded
record (tests/test_browser_live.py plays the pages; these read what they show)."""

from __future__ import annotations

import re

from specviz import host


def _metrics(text: str) -> dict[str, tuple[str, str]]:
    """{label: (value, delta)} of the page's metrics, from PAGE_TEXT's "metric: label = value (delta)" lines."""
    found = {}
    for m in re.finditer(r"^metric: (.*?) = (.*?) \((.*)\)$", text, re.M):
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


def _plain(text: str) -> str:
    """Markdown as the browser shows it (bold marks gone)."""
    return text.replace("**", "")


def _how_far_claims(text: str, sweep: dict, level: str, predicted: str) -> None:
    """Every figure How far states about its run is the downloaded record's: the winner (or the tie) and its margin,
    the speed-up, α, c, the target's step, the checking passes' cost in steps, the baseline's ms per token."""
    from specviz.labs import ranking
    from specviz.labs.how_far import GammaPoint
    from specviz.viz import how_far as how_far_view
    from specviz.viz import predict as predict_view

    points = [GammaPoint(**{**p, "acceptance_by_position": tuple(p["acceptance_by_position"])}) for p in sweep["points"]]
    spread = ranking.widest_repeats_spread(points)
    margin = ranking.margin(spread)  # the repeats' own spread: the lead a winner needs
    lead = ranking.leaders(points, lambda p: p.speedup, margin)
    best = lead[0]
    answer = predict_view.reveal_gamma(best.gamma, best.speedup, [(p.gamma, p.speedup) for p in lead[1:]], margin)
    verdict = "— right!" if predicted in answer.rights else "the answer is"
    assert f"You predicted “{predicted}”" in text and verdict in text and answer.measured in text, (answer, text)
    if level == "d1":
        assert _plain(how_far_view.fastest_words(lead)) in text, text
        assert "γ" not in text.split("What happened")[1].split("One line of guesses")[0], "a symbol at D1"
        return
    shown = {"best γ (measured)": " ≈ ".join(str(p.gamma) for p in lead) + f" ({best.speedup:.2f}×)",
             "α (measured)": f"{sweep['alpha']:.2f}", "c (measured)": f"{sweep['c']:.3f}",
             "target step": f"{sweep['target_step_ms']:.0f} ms"}
    for label, value in shown.items():  # PAGE_TEXT's "metric: label = value (delta)" lines (no delta here)
        assert f"metric: {label} = {value} ()" in text, (label, value, text)
    assert spread is not None and f"differed by up to {spread:.0%} between its own runs" in text, (spread, text)
    said = ", ".join(f"γ = {p.gamma}: {p.verify_steps:.1f}" for p in points if p.verify_steps is not None)
    assert f"one checking pass of the target cost {said} one-token steps" in text, (said, text)
    assert (f"Target alone: {sweep['baseline_ms_per_token']:.0f} ms per token over {sweep['baseline_tokens']} "
            "tokens") in text


def _where_claims(text: str, record: dict, level: str, predicted: str) -> None:
    """Every figure Where it helps states about its run is the downloaded record's: the winner or the tie, the
    groups' verdict, the noise it was judged against, and the prediction's verdict."""
    from specviz.labs.where_it_helps import WorkloadResults, WorkloadRow
    from specviz.viz import predict as predict_view
    from specviz.viz import where_it_helps as where_view

    res = WorkloadResults(record["source"], record["pair"], record["method"],
                          tuple(WorkloadRow(**r) for r in record["rows"]), tuple(record["skipped"]),
                          record["target_step_ms"])
    best, *tied = res.leaders()
    answer = predict_view.reveal_workload(best.title, best.speedup, [(r.title, r.speedup) for r in tied], res.margin)
    verdict = "— right!" if predicted in answer.rights else "the answer is"
    assert f"You predicted “{predicted}”" in text and verdict in text and answer.measured in text, (answer, text)
    assert _plain(where_view.headline(res, level)) in text, (where_view.headline(res, level), text)
    if level != "d1":
        assert where_view.noise_sentence(res, level) in text
        assert f"One target step took {res.target_step_ms:.0f} ms (median)" in text


def _cheap_claims(text: str, record: dict, level: str, predicted: str) -> None:
    """Why checking is cheap's pass figures against the downloaded record: the steps per pass, the verdict, the
    machine and weights line."""
    from specviz.labs.why_cheap import pass_cost_from_dict
    from specviz.viz import predict as predict_view
    from specviz.viz import why_cheap as why_cheap_view

    cost = pass_cost_from_dict(record)
    answer = predict_view.reveal_cheap(cost.ratios[cost.ks.index(16)], cost.step_ms)
    verdict = "— right!" if predicted in answer.rights else "the answer is"
    assert f"You predicted “{predicted}”" in text and verdict in text and answer.measured in text, (answer, text)
    assert _plain(why_cheap_view.pass_words(cost, level)) in text, (why_cheap_view.pass_words(cost, level), text)
    assert why_cheap_view.machine_line(cost, level) in text
    assert (level == "d1") == ("KV cache" not in why_cheap_view.machine_line(cost, level))


def _busy_claims(text: str, record: dict, level: str, predicted: str) -> None:
    """The live batch measurement's sentence and verdict against its downloaded report."""
    from specviz.bench.batch import report_from_dict
    from specviz.labs import busy
    from specviz.viz import predict as predict_view

    report = report_from_dict(record)
    first, last = report.sizes[0], report.sizes[-1]
    answer = predict_view.reveal_busy(last.batch, last.speedup, first.speedup)
    assert f"You predicted “{predicted}”" in text and answer.measured in text, (answer, text)
    assert _plain(busy.busy_words(report, level)) in text, (busy.busy_words(report, level), text)


def _precision_claims(text: str, record: dict, level: str, predicted: str) -> None:
    """Two precisions, one lesson: the level's words, the verdict and (D5) the best γ at the slider's α, each from the
    downloaded curves."""
    from specviz.app.precision_section import ALPHA
    from specviz.labs import precisions
    from specviz.viz import precisions as view
    from specviz.viz import predict as predict_view

    two = precisions.from_dict(record)
    top = two.four.cost.ks[-1]
    answer = predict_view.reveal_precision(view.cheaper_to_check(two, top), two.four.steps_at(top),
                                           two.sixteen.steps_at(top), top)
    assert f"You predicted “{predicted}”" in text and answer.measured in text, (answer, text)
    assert _plain(view.words(two, level)) in text, (view.words(two, level), text)
    assert (level == "d5") == (_plain(view.best_words(two, ALPHA)) in text)


def _same_greedy_claims(text: str, cmp: dict, level: str, predicted: str) -> None:
    """Every figure The same answer states about its greedy runs is the downloaded comparison's: identical or where
    they part, the words matched, the target's passes each way, the guesses kept, the speed-up."""
    from specviz.viz import predict as predict_view

    spec, plain = cmp["spec_tokens"], cmp["plain_tokens"]
    n, same = max(len(spec), len(plain)), sum(a == b for a, b in zip(spec, plain))
    answer = predict_view.reveal_same(same, n, cmp["target_calls_spec"], cmp["target_calls_plain"])
    verdict = "— right!" if predicted in answer.rights else "the answer is"
    assert f"You predicted “{predicted}”" in text and verdict in text and answer.measured in text, (answer, text)
    if spec == plain:
        assert (f"Exactly the same: {n} of {n} words" if level == "d1" else f"Identical: {n} of {n} tokens") in text
    else:
        assert f"{same} of {n} positions match" in text, text
    if level == "d1":
        return
    metrics = _metrics(text)
    assert metrics["target passes (speculative / alone)"][0] == f"{cmp['target_calls_spec']} / {cmp['target_calls_plain']}"
    assert metrics["drafted tokens accepted"][0] == f"{cmp['accepted']} / {cmp['drafted']}"
    assert metrics["speed-up on this machine"][0] == f"{cmp['plain_ms'] / cmp['spec_ms']:.2f}×", metrics


def _p_text(fit: dict) -> str:
    """A p-value as the page writes it (pages/same_answer.py: readable when it underflows)."""
    if fit["pvalue"] >= 1e-4:
        return f"{fit['pvalue']:.3g}"
    return f"10^{fit['log10_p']:.0f}" if fit["log10_p"] > -1e6 else "≈ 0"


def _same_sampling_claims(text: str, record: dict, level: str) -> None:
    """The sampling test's verdict, p-values, total variations and times are the downloaded record's (the exact rule:
    it passes at the page's α = 0.01, or the page says the run was flagged)."""
    fit_t, fit_s, spec, target = record["fit_target"], record["fit_spec"], record["speculative"], record["target"]
    passed = fit_s["pvalue"] >= 0.01
    if level == "d1":
        assert ("Same chances" in text) == passed, text
    else:
        assert (f"Passes: p = {_p_text(fit_s)}" if passed else f"The test flags this run (p = {_p_text(fit_s)})") in text
        metrics = _metrics(text)
        assert metrics["χ² p-value, target alone (sampled)"][0] == _p_text(fit_t), metrics
        assert metrics["χ² p-value, speculative (sampled)"][0] == _p_text(fit_s), metrics
        assert metrics["total variation, speculative"][0] == f"{fit_s['tv']:.3f}", metrics
    from specviz.labs.same_answer import SampleCounts
    from specviz.viz import same_answer as same_answer_view

    counts = [SampleCounts(**{**c, "counts": ()}) for c in (target, spec)]  # the times and tallies the line states
    assert same_answer_view.sampling_times(*counts, level, host.machine_words()) in text, text
