"""Where it helps: the source rule, reading `specviz bench` files, running the presets, and the bars."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from specviz.core import drafters
from specviz.bench import harness as bench
from specviz.bench import report
from specviz import models
from specviz.labs import where_it_helps
from specviz.core.trace import GenerationConfig
from specviz.core.progress import Progress, drain
from specviz.presets import Preset, get_preset
from specviz.core.sampling import SamplingConfig
from specviz.viz import where_it_helps as where_it_helps_view


def test_default_source_follows_the_pair_and_the_file():
    assert where_it_helps.default_source("qwen-coder", True)[0] == "bench"
    assert where_it_helps.default_source("qwen-coder", False)[0] == "run"  # nothing to read: run it
    for fast in ("smollm2-135m", "tiny-random"):
        source, why = where_it_helps.default_source(fast, True)
        assert source == "run" and fast in why


# ---------------------------------------------------------------------------------------------
# benchmark files


def _row(workload: str, method: str, speedup: float, alpha: float | None, mode: str = "greedy") -> bench.BenchRow:
    kind = bench.WORKLOADS_BY_NAME[workload].kind
    family = bench.METHODS_BY_NAME[method].family
    return bench.BenchRow(
        pair="smollm2-135m", workload=workload, kind=kind, mode=mode, method=method, family=family, repeats=3,
        new_tokens=32, ms_per_token=100.0 / speedup, ms_per_token_min=90.0, ms_per_token_max=110.0,
        tokens_per_s=10.0 * speedup, speedup=speedup, acceptance_rate=alpha, alpha_checked=alpha,
        tokens_per_target_call=None if alpha is None else 1 + 3 * alpha, c=0.1, expected_speedup=None, expected_speedup_measured_verify=None, gamma=4.0,
        peak_rss_mb=900.0, identical_to_baseline=None if method == "target" else True, identical_to_hf_plain=None,
    )


@pytest.fixture()
def bench_dir(tmp_path):
    rows = []
    for wl, sp, a in (("story", 0.9, 0.4), ("code", 2.0, 0.9), ("list", 2.5, 1.0)):  # out of the presets' order
        rows += [_row(wl, "target", 1.0, None), _row(wl, "spec-g4", sp, a), _row(wl, "spec-g8", sp * 0.9, a),
                 _row(wl, "spec-g4", sp * 0.8, a * 0.8, mode="sample"), _row(wl, "llama.cpp", 1.2, None)]
    path = tmp_path / "bench-smollm2-135m.csv"
    report.rows_frame(rows).to_csv(path, index=False)
    path.with_suffix(".md").write_text(
        "# specviz bench: SmolLM2 (`smollm2-135m`)\n\n- machine: Linux, AMD EPYC, 2 cores; device cpu\n"
        "- date: 2026-11-29T10:34:24+00:00\n- command: `python -m specviz bench --pair smollm2-135m`\n"
        "- settings: 3 repeats\n\n| table |\n", encoding="utf-8")
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n", encoding="utf-8")  # not a bench file: ignored
    return tmp_path


def test_reads_a_bench_file_with_its_provenance(bench_dir):
    path = where_it_helps.find_bench("smollm2-135m", bench_dir)
    assert path == bench_dir / "bench-smollm2-135m.csv"
    f = where_it_helps.read_bench(path)
    assert f.pairs == ("smollm2-135m",) and f.modes("smollm2-135m") == ("greedy", "sample")
    assert f.date == "2026-11-29T10:34:24+00:00" and f.machine.startswith("Linux, AMD EPYC")
    assert f.command == "python -m specviz bench --pair smollm2-135m" and f.settings == "3 repeats"
    # the baseline is not a bar, nor llama.cpp's rows (another engine, not a helper of ours)
    assert f.methods("smollm2-135m", "greedy") == ("spec-g4", "spec-g8")
    res = where_it_helps.bench_results(f, "smollm2-135m", "spec-g4", "greedy")
    assert [r.workload for r in res.rows] == ["code", "list", "story"]  # the presets' order
    assert [r.speedup for r in res.rows] == pytest.approx([2.0, 2.5, 0.9])
    assert [r.acceptance for r in res.rows] == pytest.approx([0.9, 1.0, 0.4])
    assert [r.group for r in res.rows] == ["predictable", "predictable", "creative"]
    assert res.rows[0].title == get_preset("code").title and res.rows[0].baseline_ms_per_token == pytest.approx(100.0)
    assert res.rows[0].identical is True and res.source == "bench" and "spec-g4" in res.method
    assert res.group_mean("predictable", "speedup") == pytest.approx(2.25)
    sample = where_it_helps.bench_results(f, "smollm2-135m", "spec-g4", "sample")
    assert [r.speedup for r in sample.rows] == pytest.approx([1.6, 2.0, 0.72])


def test_finds_a_differently_named_file_by_its_rows_and_misses_cleanly(bench_dir, tmp_path):
    (bench_dir / "bench-smollm2-135m.csv").rename(bench_dir / "old-run.csv")
    assert where_it_helps.find_bench("smollm2-135m", bench_dir) == bench_dir / "old-run.csv"
    assert where_it_helps.find_bench("qwen-coder", bench_dir) is None
    assert where_it_helps.find_bench("qwen-coder", tmp_path / "missing") is None


def test_a_csv_that_is_not_a_bench_file_is_a_clear_error(bench_dir):
    with pytest.raises(where_it_helps.BenchReadError, match="not a `specviz bench` file"):
        where_it_helps.read_bench(bench_dir / "notes.csv")


def test_the_shipped_qwen_benchmark_reads():
    path = where_it_helps.find_bench("qwen-coder")
    if path is None:
        pytest.skip("no benchmarks/bench-qwen-coder.csv in this checkout")
    f = where_it_helps.read_bench(path)
    res = where_it_helps.bench_results(f, "qwen-coder", "spec-g4", "greedy")
    assert res.rows and all(r.speedup and r.speedup > 0 for r in res.rows)


ALL = ("spec-g2", "spec-g4", "spec-g8", "spec-adaptive", "ngram")
EAGLE = ("eagle", "eagle-adaptive", "eagle-tree")


@pytest.mark.parametrize("drafter,gamma,adaptive,methods,want", [
    ("model", 8, False, ALL, "spec-g8"), ("model", 5, False, ALL, "spec-g4"), ("model", 4, True, ALL, "spec-adaptive"),
    ("ngram", 4, False, ALL, "ngram"), ("model", 3, True, ("spec-g2", "spec-g4"), "spec-g4"),
    ("tree", 4, False, ALL + ("spec-tree",), "spec-tree"), ("tree", 8, False, ALL, "spec-g8"),
    # a head chain is shown as the head's own method, not the draft model's of the same γ
    ("eagle", 4, False, ALL + EAGLE, "eagle"), ("eagle", 6, False, ALL + EAGLE, "eagle"),
    ("eagle", 4, True, ALL + EAGLE, "eagle-adaptive"), ("eagle-tree", 4, False, ALL + EAGLE, "eagle-tree"),
    ("eagle", 8, False, ALL, "spec-g8"),
])
def test_default_method_is_the_closest_to_the_sidebar(drafter, gamma, adaptive, methods, want):
    assert where_it_helps.default_method(methods, drafter, gamma, adaptive) == want
    assert where_it_helps.default_method(("hf-assisted",), "model", 4, False) == "hf-assisted"
    assert where_it_helps.default_method((), "model", 4, False) is None


# ---------------------------------------------------------------------------------------------
# running the presets (tiny random pair: the real engine, instant)


def _drain(steps):
    """(every item the job yielded, its result)."""
    items = []
    return items, drain(steps, items.append)


def test_run_now_measures_every_workload_and_skips_what_cannot_fit():
    pair = models.load_pair("tiny-random")
    too_long = Preset("huge", "creative", "Huge", "word " * 600, "does not fit")  # 3000 bytes > 2048 positions
    presets = (get_preset("code"), get_preset("story"), too_long)
    spec = GenerationConfig(max_new_tokens=12, gamma=3)
    cfg = where_it_helps.WorkloadsConfig("tiny-random", "model", spec, GenerationConfig(max_new_tokens=12, gamma=1),
                                    presets)
    progress, res = _drain(where_it_helps.workload_steps(pair, cfg))
    assert all(isinstance(p, Progress) for p in progress)
    done = [p.done for p in progress]
    assert done == sorted(done) and done[-1] == progress[-1].total == 12 * 2 * 2 * 2  # 2 workloads, 2 runs, twice
    assert [r.workload for r in res.rows] == ["code", "story"]
    assert all(r.repeats == 2 and r.speedup_low <= r.speedup_high for r in res.rows)
    assert res.repeated and res.timing_spread == max(r.repeat_spread for r in res.rows)
    rounds = [p.message for p in progress if p.message.endswith("target alone…")]
    code, story = get_preset("code").title, get_preset("story").title
    assert [m.split(":")[0] for m in rounds] == [f"{code} (run 1 of 2)", f"{story} (run 1 of 2)", "Huge (run 1 of 2)",
                                                f"{code} (run 2 of 2)", f"{story} (run 2 of 2)"]  # taking turns
    assert [r.group for r in res.rows] == ["predictable", "creative"]
    for r in res.rows:
        assert r.speedup and r.speedup > 0 and 0 <= r.acceptance <= 1 and r.tokens_per_round >= 1
        assert r.identical is True  # greedy: speculative text == target alone
    assert len(res.skipped) == 1 and res.skipped[0].startswith("Huge") and "tokens" in res.skipped[0]
    assert res.source == "run" and "γ = 3" in res.method and res.target_step_ms > 0
    assert hash(cfg) == hash(where_it_helps.WorkloadsConfig("tiny-random", "model", spec,
                                                       GenerationConfig(max_new_tokens=12, gamma=1), presets))


def test_method_words_say_the_settings():
    sampled = GenerationConfig(max_new_tokens=32, gamma=6, adaptive=True,
                               sampling=SamplingConfig(mode="sample", temperature=0.7))
    words = where_it_helps.method_words("model", sampled)
    assert "adaptive γ ≤ 6" in words and "T = 0.7" in words and "32" in words
    assert drafters.spec("ngram").title in where_it_helps.method_words("ngram", GenerationConfig())
    tree = where_it_helps.method_words("tree", GenerationConfig())
    assert drafters.spec("tree").title in tree and "γ" not in tree  # γ does not size a tree


# ---------------------------------------------------------------------------------------------
# the bars


def _wrow(wl: str, group: str, speed: float | None, acc: float | None) -> where_it_helps.WorkloadRow:
    return where_it_helps.WorkloadRow(wl, wl.title(), group, speed, acc, 2.0, 100.0, 150.0, 32.0, True)


def test_bars_show_speedup_with_a_no_gain_line_and_acceptance_by_group():
    rows = [_wrow("code", "predictable", 1.8, 0.9), _wrow("list", "predictable", 2.2, 1.0),
            _wrow("story", "creative", 0.9, 0.35), _wrow("poem", "creative", None, None)]
    fig = where_it_helps_view.workload_bars(rows, "d2", 13)
    assert isinstance(fig, go.Figure)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 4  # two groups × two panels
    colours = {t.name: t.marker.color for t in bars}
    assert colours["predictable"] != colours["creative"]
    speed = [t for t in bars if t.xaxis == "x" and t.name == "creative"][0]
    assert list(speed.x) == ["Story", "Poem"] and list(speed.y) == [0.9, None] and speed.text[1] == "–"
    acc = [t for t in bars if t.xaxis == "x2" and t.name == "predictable"][0]
    assert list(acc.y) == pytest.approx([90.0, 100.0])
    lines = [s for s in fig.layout.shapes if s.y0 == 1.0 and s.y1 == 1.0]
    assert len(lines) == 1
    # the 1× line is explained in the axis title, not by a label that sat on the first bar
    assert not any(a.text == "1× = no gain" for a in fig.layout.annotations)
    assert fig.layout.yaxis.title.text == "speed-up (×) · dashed 1× = no gain" and "acceptance" in fig.layout.yaxis2.title.text
    assert fig.layout.xaxis.title.text == "workload"
    kids = where_it_helps_view.workload_bars(rows, "d1")
    assert {t.name for t in kids.data} == {"easy to guess", "hard to guess"}


def test_the_default_press_is_short_and_full_length_is_a_choice():
    from specviz.settings import Settings

    s = Settings(pair="tiny-random", max_new_tokens=64)
    short, full = where_it_helps.workloads_config(s), where_it_helps.workloads_config(s, full=True)
    assert short.spec.max_new_tokens == short.baseline.max_new_tokens == where_it_helps.SHORT_TOKENS
    assert full.spec.max_new_tokens == full.baseline.max_new_tokens == 64 and full.spec.gamma == s.gamma
    few = Settings(pair="tiny-random", max_new_tokens=12)  # already short: the sidebar's own length
    assert where_it_helps.workloads_config(few) == where_it_helps.workloads_config(few, full=True)
    assert where_it_helps.workloads_config(few).spec.max_new_tokens == 12


def test_repeated_runs_draw_whiskers_and_judge_winners_by_their_own_spread():
    """Run now, each workload twice: its bar is the medians' speed-up, its whisker the two runs' own speed-ups, and
    the noise a winner must beat is the widest whisker (never less than the floor)."""
    def row(wl: str, group: str, speed: float, low: float, high: float) -> where_it_helps.WorkloadRow:
        return where_it_helps.WorkloadRow(wl, wl.title(), group, speed, 0.8, 2.0, 50.0, 80.0, 24.0, True,
                                          speedup_low=low, speedup_high=high, repeats=2)

    rows = (row("code", "predictable", 1.60, 1.50, 1.65), row("story", "creative", 1.30, 1.05, 1.40))
    res = where_it_helps.WorkloadResults("run", "tiny-random", "m", rows)
    assert res.timing_spread == pytest.approx(1.40 / 1.05 - 1) and res.margin == pytest.approx(1.40 / 1.05 - 1)
    assert [r.workload for r in res.leaders()] == ["code", "story"]  # 1.6 against 1.3: within 33 %: about the same
    narrow = where_it_helps.WorkloadResults("run", "tiny-random", "m", (rows[0], row("story", "creative", 1.30, 1.28, 1.32)))
    assert narrow.margin == pytest.approx(1.65 / 1.50 - 1) and [r.workload for r in narrow.leaders()] == ["code"]
    words = where_it_helps_view.noise_sentence(res, "d5")
    assert "each workload ran 2 times" in words and "up to 33%" in words and where_it_helps_view.noise_sentence(res, "d1") == ""
    fig = where_it_helps_view.workload_bars(rows, "d2")
    speed = [t for t in fig.data if t.xaxis == "x"]
    whiskers = {t.name: (list(t.error_y.array), list(t.error_y.arrayminus)) for t in speed}
    assert whiskers["predictable"] == (pytest.approx([0.05]), pytest.approx([0.10]))
    assert whiskers["creative"] == (pytest.approx([0.10]), pytest.approx([0.25]))
    table = where_it_helps_view.workload_table(res, "d5").data
    assert list(table["runs' speed-ups"]) == ["1.50× to 1.65×", "1.05× to 1.40×"]
    once = where_it_helps.WorkloadResults("bench", "p", "m", (_wrow("code", "predictable", 1.8, 0.9),))
    assert not once.repeated and "runs' speed-ups" not in where_it_helps_view.workload_table(once, "d5").data
