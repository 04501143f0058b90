"""The busy-server lab: real batched runs measured as a job (limits, progress), its recordings, and words that match its numbers."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from specviz.bench import timing
from specviz.labs import busy
from specviz.labs import why_cheap as vc
from specviz.bench.batch import BatchConfig, BatchReport, SizeResult, batch_steps, report_from_dict
from specviz.viz import predict as predict_view
from specviz.viz import why_cheap as why_cheap_view
from tests.test_labs_why_cheap import _drain

NUMBER = re.compile(r"\d+\.\d\d")


def _size(b: int, speedup: float, lo: float, hi: float, steps: float, alpha: float = 0.8) -> SizeResult:
    return SizeResult(batch=b, plain_tokens_per_s=10.0 * b, spec_tokens_per_s=10.0 * b * speedup, plain_alone_tokens_per_s=5.0,
                      spec_alone_tokens_per_s=8.0, speedup=speedup, speedup_range=(lo, hi), identical=True, alpha=alpha,
                      tokens_per_target_call=3.1, plain_wall_s=1.0, spec_wall_s=1.0, runs_per_target_pass=float(b),
                      verify_steps=steps)


def _report(rows: list[SizeResult], context: int = 0) -> BatchReport:
    return BatchReport("qwen-coder", 32, 4, context, True, "shared", tuple(rows), "cpu: test, 2 threads", None,
                       kv_bytes_per_token=57_344, weight_bytes=3_000_000_000)


DECLINES = _report([_size(1, 1.63, 1.55, 1.70, 1.40), _size(2, 1.47, 1.40, 1.52, 1.87), _size(4, 1.04, 1.0, 1.1, 3.31),
                    _size(8, 0.74, 0.70, 0.80, 4.54), _size(16, 0.78, 0.75, 0.81, 7.01)])
FLAT = _report([_size(1, 1.20, 1.00, 1.50, 1.30), _size(16, 1.15, 1.05, 1.30, 2.0)])


def _numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


@pytest.mark.parametrize("level", ["d1", "d2", "d5"])
def test_every_number_in_the_words_is_one_of_the_reports_own(level: str) -> None:
    for report in (DECLINES, FLAT):
        own = {f"{x:.{d}f}" for s in report.sizes for x in (s.speedup, *s.speedup_range, s.verify_steps or 0,
                                                               s.alpha or 0, s.tokens_per_target_call or 0)
               for d in ((1, 2) if level == "d1" else (2,))}  # D1 rounds to one decimal
        for text in (busy.busy_words(report, level), busy.pattern_words(report, level)):
            assert _numbers(text) <= own, text


def test_the_words_follow_the_measurement_not_the_textbook() -> None:
    assert DECLINES.declines and not FLAT.declines
    d1 = busy.busy_words(DECLINES, "d1")
    assert "**1.6×**" in d1 and "**0.8×**" in d1 and "With **16** pupils" in d1  # D1: one decimal
    assert "half again as fast (**1.6×**)" in d1 and "slower (**0.8×**)" in d1  # the phrase matches the number
    assert "checking is no longer free" in d1
    flat = busy.busy_words(FLAT, "d1")
    assert "no longer free" not in flat and "kept its gain" in flat
    # one repeat (no range of its own): a 4 % fall is within the noise floor, never "no longer free"
    one = _report([_size(1, 1.20, 1.20, 1.20, 1.3), _size(16, 1.15, 1.15, 1.15, 2.0)])
    assert one.declines and "no longer free" not in busy.busy_words(one, "d1")
    assert "textbook decline shows" in busy.pattern_words(DECLINES, "d5")
    assert "No clear decline" in busy.pattern_words(FLAT, "d2") and "1.00–1.50×" in busy.pattern_words(FLAT, "d2")
    d2 = busy.busy_words(DECLINES, "d2")
    assert "**1.40** one-token steps at batch 1 and **7.01** at batch 16" in d2
    d5 = busy.busy_words(DECLINES, "d5")
    assert "token-identical" in d5 and "α is 0.80 at batch 1 and 0.80 at batch 16" in d5
    mixed = replace(DECLINES, sizes=(*DECLINES.sizes[:-1], replace(DECLINES.sizes[-1], alpha=0.54)))
    assert "α falls from 0.80 at batch 1 to 0.54 at batch 16" in busy.busy_words(mixed, "d5")
    broken = replace(DECLINES, sizes=(replace(DECLINES.sizes[0], identical=False), *DECLINES.sizes[1:]))
    assert "some batched runs differed" in busy.busy_words(broken, "d5")


def test_the_long_context_words_give_the_kv_caches_share_of_the_weights() -> None:
    long = _report([_size(1, 1.5, 1.4, 1.6, 1.3), _size(8, 0.9, 0.85, 0.95, 4.0)], context=1500)
    share = busy.kv_share(long, 8)
    assert share == pytest.approx(8 * 1532 * 57_344 / 3e9)
    said = busy.long_words(long, DECLINES)
    assert f"**{share:.0%}**" in said and "not reached on this machine" in said and "(short prompts: 0.74×)" in said
    assert "MagicDec (2024)" in said and "**1.50×** at batch 1 and **0.90×** at batch 8" in said


def test_the_gpu_words_read_the_shipped_figures() -> None:
    reference = vc.load_reference()
    assert reference is not None and reference.step_cost is not None
    said = busy.gpu_words(reference)
    sc = reference.step_cost
    import statistics

    one, many = statistics.median(sc.target_step_ms[0]), statistics.median(sc.target_step_ms[-1])
    assert f"{many:.1f} ms against {one:.1f} ms" in said and f"**{many / one:.2f}×**" in said
    assert f"c = {sc.c_at(1):.2f}" in said and "pass costs only" in said
    assert busy.gpu_words(None) == ""


def test_the_prediction_is_judged_by_the_largest_batch() -> None:
    answer = predict_view.reveal_busy(16, 0.78, 1.63)
    assert answer.right == "Slower than without the helper" and "0.78×" in answer.measured and "1.63×" in answer.measured
    assert predict_view.busy_choice(1.7) == predict_view.BUSY.choices[0]
    assert predict_view.busy_choice(1.0) == "About the same"


def test_the_figure_has_whiskers_for_each_recording() -> None:
    long = _report([_size(1, 1.5, 1.4, 1.6, 1.3), _size(8, 0.9, 0.85, 0.95, 4.0)], context=1500)
    fig = why_cheap_view.busy_figure(DECLINES, long)
    whiskers = [t for t in fig.data if t.error_y is not None and t.error_y.array is not None]
    assert [len(t.x) for t in whiskers] == [5, 2]
    assert whiskers[0].error_y.array[0] == pytest.approx(1.70 - 1.63)
    assert "1500 tokens" in whiskers[1].name


def test_a_report_round_trips_through_its_json_and_the_table_and_csv_hold_every_size() -> None:
    back = report_from_dict(json.loads(json.dumps(DECLINES.as_dict())))
    assert back == DECLINES
    rows = busy.table_rows(back)
    assert [r["batch"] for r in rows] == [1, 2, 4, 8, 16]
    csv = busy.csv_text(rows).splitlines()
    assert csv[0].startswith("batch,plain tokens/s") and len(csv) == 6
    with pytest.raises(ValueError):
        report_from_dict({**DECLINES.as_dict(), "sizes": []})


@pytest.mark.parametrize("path", [busy.RECORDING, busy.LONG_RECORDING])
def test_the_shipped_recordings_are_real_measurements_of_the_default_pair(path) -> None:
    report = busy.load_recording(path)
    assert report is not None, f"{path.name} is missing: {busy.RECORD_COMMAND}"
    assert report.pair == "qwen-coder" and report.exact and report.machine.startswith("cpu")
    assert all(s.identical for s in report.sizes)  # every batched run equals the same run alone
    assert [s.batch for s in report.sizes] == ([1, 2, 4, 8, 16] if path == busy.RECORDING else [1, 2, 4, 8])
    for s in report.sizes:
        assert s.speedup_range[0] <= s.speedup <= s.speedup_range[1]
        assert s.speedup == pytest.approx(s.spec_tokens_per_s / s.plain_tokens_per_s, rel=0.25)
    if path == busy.LONG_RECORDING:
        assert report.context == 1500 and report.kv_bytes_per_token > 0


# ------------------------------------------------------------------------------------------
# The measurement as a job (tiny random pair: mechanics only)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from specviz.models import load_pair

    return load_pair("tiny-random")


class StepClock:
    """A clock that advances 10 s each time it is read: the time limit's arithmetic without waiting."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 10.0
        return self.t


def test_a_size_past_the_time_limit_is_not_started_and_the_report_says_why(tiny) -> None:
    cfg = BatchConfig(sizes=(1, 2, 4), max_new_tokens=4, repeats=1, time_limit_s=100.0)
    items, report = _drain(batch_steps(tiny, "tiny-random", cfg, available=lambda d: 1 << 40, clock=StepClock()))
    assert [s.batch for s in report.sizes] == [1] and report.stopped.startswith("stopped before batch 2")
    assert "limit of 100 s" in report.stopped
    assert any("s left" in p.message for p in items) and items[-1].message.startswith("batch 1 measured")
    assert all(0.0 <= p.fraction <= 1.0 for p in items)


def test_a_size_that_would_not_fit_in_memory_is_not_started(tiny) -> None:
    one = timing.batch_bytes(tiny.target.config, 1, 5, 200) + timing.batch_bytes(tiny.draft.config, 1, 1, 200)
    cfg = BatchConfig(sizes=(1, 16), max_new_tokens=4, repeats=1)
    _, report = _drain(batch_steps(tiny, "tiny-random", cfg, available=lambda d: timing.MEMORY_RESERVE + 4 * one))
    assert [s.batch for s in report.sizes] == [1] and "batch 16 would need" in report.stopped
    assert report.sizes[0].identical and report.kv_bytes_per_token > 0 and report.weight_bytes > 0


def test_the_time_limit_estimates_a_size_from_its_untimed_runs_alone_and_the_last_runs_together() -> None:
    """Batch 16 after 4: 24 runs alone still to time (at the mean so far) and the runs together at most 4x batch 4's;
    not all of batch 4 (its runs alone included) times 4, which stopped the lab's default before 16 in the app."""
    from specviz.bench.batch import _size_estimate

    assert _size_estimate(16, (4, 4.0), [0.5] * 8, 8) == pytest.approx(24 * 0.5 + 16.0)
    assert _size_estimate(4, (4, 4.0), [0.5] * 8, 8) == pytest.approx(4.0)  # nothing left to time alone
    assert _size_estimate(2, (1, 1.0), [], 0) == pytest.approx(2.0)
