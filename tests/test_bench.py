"""`python -m specviz bench`: end-to-end on tiny-random, the aggregation on synthetic numbers, the fairness guards.

Speed is never asserted: timings on a shared CPU are noise.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specviz.bench import harness as bench
from specviz.bench import report
from specviz.bench.harness import BenchError, RunRecord

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900  # tiny models, but the CPU is shared


def run_bench_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specviz", "bench", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=TIMEOUT_S, env={**os.environ, "TQDM_DISABLE": "1"},
    )


def read_csv(out: Path, pair: str = "tiny-random") -> pd.DataFrame:
    path = out / f"bench-{pair}.csv"
    assert path.is_file(), f"missing {path}"
    return pd.read_csv(path)


def check_outputs(out: Path, done: subprocess.CompletedProcess[str]) -> pd.DataFrame:
    """The three files exist and are well formed; the Markdown table is on stdout."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    df = read_csv(out)
    assert list(df.columns) == list(bench.CSV_COLUMNS)
    assert (df["ms_per_token"] > 0).all()
    assert (df["tokens_per_s"] > 0).all()
    assert (df["new_tokens"] > 0).all()
    assert (df["repeats"] >= 3).all()
    assert not df.duplicated(["pair", "workload", "mode", "method"]).any(), "one row per (workload, mode, method)"
    base = df[df["method"] == "target"]
    assert (base["speedup"] == 1.0).all()
    # acceptance by position: one cell of shares, each position at most the one before (empty without a drafter)
    for method, cell in zip(df["method"], df["acceptance_by_position"].fillna("")):
        shares = [float(x) for x in str(cell).split()]
        assert not shares or not (method == "target" or method.startswith("hf-")), (method, cell)  # ours only
        assert all(0 <= b <= a <= 1 for a, b in zip(shares, shares[1:])), (method, cell)
    md = (out / "bench-tiny-random.md").read_text(encoding="utf-8")
    assert md.startswith("# specviz bench")
    for part in ("- machine:", "- date:", "- command: `python -m specviz bench", "torch ", "transformers "):
        assert part in md
    assert "| workload | mode | method | ms/token |" in md
    md, _, passes = md.partition("## One pass over k new tokens")
    assert "| specviz, fp32" in passes and "(1.00) |" in passes, "our pass over 1, 5 and 16 tokens, after the runs"
    table, _, profiles = md.partition("## Round profile")
    assert table.count("\n| ") == len(df) + 1, "header plus one table line per row"
    ours = df[df["family"] == "ours"]
    for _, row in ours.iterrows():  # one profiled run of each of our methods, on each workload and mode
        assert f"**{row['method']}** on {row['workload']} ({row['mode']}):" in profiles
    assert profiles.count("| **the target's pass** | all |") == len(ours)
    assert "| workload | mode | method | ms/token |" in done.stdout, "the table is printed to stdout"
    page = (out / "bench-tiny-random.html").read_text(encoding="utf-8")
    assert 'class="plotly-graph-div"' in page
    assert "speed-up vs target-only" in page
    assert "specviz bench: [" in done.stderr, "progress lines go to stderr"
    return df


def test_quick_end_to_end_on_tiny_random(tmp_path: Path) -> None:
    # --max-new-tokens keeps the test short; everything else is --quick's own choice
    done = run_bench_cli("--pair", "tiny-random", "--quick", "--max-new-tokens", "12", "--out", str(tmp_path), "-q")
    df = check_outputs(tmp_path, done)
    # llama.cpp's methods need a pair made of packaged GGUF files: left out here, and the run says why
    ours_and_hf = [m for m in bench.QUICK_METHODS if bench.METHODS_BY_NAME[m].family != "llama"]
    expected = {(w, "greedy", m) for w in bench.QUICK_WORKLOADS for m in ours_and_hf}
    assert set(zip(df["workload"], df["mode"], df["method"])) == expected
    assert "left out llama.cpp's methods: tiny-random is not made of packaged GGUF files" in done.stderr
    spec = df[df["method"].str.startswith("spec-")]
    assert len(spec) and spec["identical_to_baseline"].astype(bool).all(), "greedy speculative == target-only"
    assert spec["acceptance_rate"].between(0, 1).all() and spec["alpha_checked"].between(0, 1).all()
    assert (spec["alpha_checked"] >= spec["acceptance_rate"] - 1e-9).all(), "checked positions are never more than drafted"
    assert (spec["tokens_per_target_call"] >= 1).all()
    chain, tree = spec[spec["method"] != "spec-tree"], spec[spec["method"] == "spec-tree"]
    assert (spec["c"] > 0).all() and (chain["expected_speedup"] > 0).all()
    assert len(tree) and tree["expected_speedup"].isna().all()  # Leviathan's chain formula is not applied to trees
    hf = df[df["family"] == "hf"]
    assert hf["acceptance_rate"].isna().all() and hf["c"].isna().all(), "not observable for transformers' methods"
    assert hf["identical_to_baseline"].notna().all()


def test_copy_workload_sampling_and_lookup_methods(tmp_path: Path) -> None:
    done = run_bench_cli(
        "--pair", "tiny-random", "--workloads", "copy", "--methods", "hf-plain,hf-assisted,hf-lookup,ngram,spec-g2",
        "--max-new-tokens", "10", "--out", str(tmp_path), "-q",
    )
    df = check_outputs(tmp_path, done)
    got = set(zip(df["workload"], df["mode"], df["method"]))
    for mode in ("greedy", "sample"):
        for m in ("target", "hf-plain", "hf-assisted", "hf-lookup", "ngram", "spec-g2"):
            assert ("copy", mode, m) in got
    sample = df[df["mode"] == "sample"]
    assert sample["identical_to_baseline"].isna().all(), "sampled runs are not compared token by token"
    greedy = df[df["mode"] == "greedy"]
    assert greedy[greedy["method"].isin(["hf-assisted", "hf-lookup"])]["identical_to_hf_plain"].notna().all()
    ours_spec = greedy[greedy["method"].isin(["ngram", "spec-g2"])]
    assert ours_spec["identical_to_baseline"].astype(bool).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--repeats", "2"], "--repeats must be >= 3"),
        (["--workloads", "code,nope"], "unknown workloads 'nope'"),
        (["--methods", "spec-g3"], "unknown methods 'spec-g3'"),
        (["--pair", "no-such-pair"], "unknown model pair"),
        (["--device", "tpu"], "invalid choice"),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    from tests.test_cli import run_cli

    done = run_cli("bench", *args, "--out", str(tmp_path), in_process=True)  # cli.main, as `python -m specviz` calls it
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specviz: error:") and message in lines[0], done.stderr
    assert not list(tmp_path.iterdir()), "nothing is written on a refusal"


def test_bench_does_not_import_streamlit() -> None:
    code = "import sys, specviz.bench.harness; assert 'streamlit' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------------
# aggregation on synthetic numbers


def rec(method: str, repeat: int, ms: float, tokens: tuple[int, ...] = (1, 2, 3), mode: str = "greedy",
        workload: str = "code", **kw) -> RunRecord:
    return RunRecord(pair="p", workload=workload, mode=mode, method=method, repeat=repeat, tokens=tokens,
                     ms_per_token=ms, **kw)


def by_method(rows: list[bench.BenchRow]) -> dict[str, bench.BenchRow]:
    return {r.method: r for r in rows}


def test_median_and_speedup() -> None:
    records = [
        rec("target", 0, 100.0), rec("spec-g4", 0, 50.0, acceptance_rate=0.5, alpha_checked=0.6, c=0.1, gamma=4.0),
        rec("target", 1, 300.0), rec("spec-g4", 1, 40.0, acceptance_rate=0.7, alpha_checked=0.8, c=0.2, gamma=4.0),
        rec("target", 2, 110.0), rec("spec-g4", 2, 1000.0, acceptance_rate=0.9, alpha_checked=0.95, c=0.05, gamma=4.0),
    ]
    rows = by_method(bench.aggregate(records))
    t, s = rows["target"], rows["spec-g4"]
    assert t.ms_per_token == 110.0 and t.speedup == 1.0  # median of 100, 300, 110: outliers do not move it
    assert s.ms_per_token == 50.0 and s.ms_per_token_min == 40.0 and s.ms_per_token_max == 1000.0
    assert s.speedup == pytest.approx(110.0 / 50.0)
    assert s.tokens_per_s == pytest.approx(20.0)
    assert s.acceptance_rate == 0.7 and s.alpha_checked == 0.8
    # c per repeat comes from metrics.compare against the same repeat's target step (tests/test_metrics.py)
    assert s.c == pytest.approx(0.1)
    assert s.gamma == 4.0
    a, g, c = 0.8, 4, 0.1  # Leviathan's formula reads the checked α, never the drafted acceptance
    assert s.expected_speedup == pytest.approx((1 - a ** (g + 1)) / ((1 - a) * (g * c + 1)))
    assert s.repeats == 3 and t.repeats == 3
    assert t.identical_to_baseline is None and s.identical_to_baseline is True


def test_identity_checks() -> None:
    records = []
    for r in range(3):
        records += [
            rec("target", r, 10.0, tokens=(1, 2, 3)),
            rec("spec-g2", r, 10.0, tokens=(1, 2, 3) if r < 2 else (1, 2, 4)),  # one repeat differs
            rec("hf-plain", r, 10.0, tokens=(1, 2, 9)),
            rec("hf-assisted", r, 10.0, tokens=(1, 2, 9)),
        ]
    rows = by_method(bench.aggregate(records))
    assert rows["spec-g2"].identical_to_baseline is False, "every repeat must match"
    assert rows["hf-plain"].identical_to_baseline is False
    assert rows["hf-assisted"].identical_to_baseline is False and rows["hf-assisted"].identical_to_hf_plain is True
    assert rows["hf-plain"].identical_to_hf_plain is None and rows["spec-g2"].identical_to_hf_plain is None


def test_sampled_rows_have_no_identity_and_groups_stay_apart() -> None:
    records = [rec("target", r, 10.0 + r, mode=m, workload=w) for r in range(3) for m in ("greedy", "sample") for w in ("code", "story")]
    records += [rec("spec-g4", r, 5.0, mode="sample", workload="story", tokens=(7,)) for r in range(3)]
    rows = bench.aggregate(records)
    assert len(rows) == 5
    story_sample = [r for r in rows if r.workload == "story" and r.mode == "sample"]
    assert [r.method for r in story_sample] == ["target", "spec-g4"]
    assert story_sample[1].speedup == pytest.approx(11.0 / 5.0)
    assert story_sample[1].identical_to_baseline is None
    assert story_sample[1].kind == "creative"


def test_missing_baseline_and_missing_metrics_stay_blank() -> None:
    rows = bench.aggregate([rec("hf-plain", r, 20.0) for r in range(3)])
    (row,) = rows
    assert row.speedup is None and row.c is None and row.expected_speedup is None and row.acceptance_rate is None
    table = report.markdown_table(rows)
    assert "| code (predictable) | greedy | `hf-plain` | 20.0 | 50.00 |  |" in table


def test_adaptive_gamma_is_mean_drafted_per_drafting_round() -> None:
    from types import SimpleNamespace

    from specviz.core import metrics

    rounds = [SimpleNamespace(draft_ids=ids) for ids in [(), (1, 2, 3), (), (4,), (5, 6)]]

    def gen(method: str) -> SimpleNamespace:  # the Generation fields effective_gamma reads, as the bench sets them
        m = bench.METHODS_BY_NAME[method]
        return SimpleNamespace(rounds=rounds, drafter=m.drafter, config=SimpleNamespace(gamma=m.gamma, adaptive=m.adaptive))

    assert metrics.effective_gamma(gen("spec-adaptive")) == pytest.approx(2.0)
    assert metrics.effective_gamma(gen("ngram")) == pytest.approx(2.0)
    assert metrics.effective_gamma(gen("spec-g8")) == 8.0


# ---------------------------------------------------------------------------------------------
# configuration and fairness guards


def test_config_defaults() -> None:
    quick = bench.make_config(quick=True)
    assert quick.pairs == ("qwen-coder",) and quick.modes == ("greedy",)
    assert quick.workloads == ("code", "list", "story") and quick.max_new_tokens == 32 and quick.repeats == 3
    full = bench.make_config()
    assert full.pairs == ("qwen-coder", "smollm2-135m") and full.modes == ("greedy", "sample")
    assert set(full.methods) == set(bench.METHODS_BY_NAME) and set(full.workloads) == set(bench.WORKLOADS_BY_NAME)
    picked = bench.make_config(pairs=["tiny-random"], quick=True, methods="hf-assisted,spec-g2", max_new_tokens=5, repeats=4)
    assert picked.pairs == ("tiny-random",) and picked.methods == ("target", "hf-assisted", "spec-g2")
    assert picked.max_new_tokens == 5 and picked.repeats == 4
    with pytest.raises(BenchError):
        bench.make_config(max_new_tokens=0)


def test_workload_table() -> None:
    assert [w.name for w in bench.WORKLOADS] == ["code", "json", "list", "copy", "story", "poem"]
    assert {w.name for w in bench.WORKLOADS if w.copying} == {"copy"}
    copy_wl, code_wl = bench.WORKLOADS_BY_NAME["copy"], bench.WORKLOADS_BY_NAME["code"]
    every = list(bench.METHODS_BY_NAME)
    assert {m.name for m in bench.methods_for(copy_wl, every)} == set(every)
    assert {m.name for m in bench.methods_for(code_wl, every)} == set(every) - {"hf-lookup"}  # n-gram runs everywhere (a baseline of the memory drafters)
    with pytest.raises(Exception):
        copy_wl.name = "x"  # frozen


def test_workloads_are_the_app_presets() -> None:
    from specviz.presets import PRESETS

    assert [(w.name, w.kind, w.prompt, w.copying) for w in bench.WORKLOADS] == [
        (p.id, p.group, p.prompt, p.copies_prompt) for p in PRESETS]


@pytest.fixture(scope="module")
def tiny_pair():
    from specviz import models

    return models.load_pair("tiny-random", device="cpu")  # built fresh for this module: safe to edit its config


def test_hf_config_ignores_the_models_own_generation_settings(tiny_pair) -> None:
    gc = tiny_pair.target.generation_config
    saved = (gc.repetition_penalty, gc.no_repeat_ngram_size, gc.temperature)
    gc.repetition_penalty, gc.no_repeat_ngram_size, gc.temperature = 1.3, 3, 0.2
    try:
        for mode in ("greedy", "sample"):
            cfg = bench.hf_generation_config(tiny_pair, bench.METHODS_BY_NAME["hf-plain"], mode, 8)
            prepared, _ = tiny_pair.target._prepare_generation_config(cfg)
            assert prepared.repetition_penalty == 1.0 and prepared.no_repeat_ngram_size == 0
            assert prepared.do_sample is (mode == "sample")
            assert prepared.temperature == (0.7 if mode == "sample" else 1.0)
            if mode == "sample":
                assert prepared.top_k == 0 and prepared.top_p == 1.0
            assert list(prepared.eos_token_id) == list(tiny_pair.eos_ids) and prepared.max_new_tokens == 8
    finally:
        gc.repetition_penalty, gc.no_repeat_ngram_size, gc.temperature = saved


def test_hf_config_refuses_settings_it_cannot_neutralise(tiny_pair) -> None:
    gc = tiny_pair.draft.generation_config
    gc.min_p = 0.1
    try:
        with pytest.raises(BenchError, match="min_p"):
            bench.hf_generation_config(tiny_pair, bench.METHODS_BY_NAME["hf-assisted"], "sample", 8)
    finally:
        gc.min_p = None


def test_hf_lookup_config_and_greedy_equality(tiny_pair) -> None:
    lookup = bench.METHODS_BY_NAME["hf-lookup"]
    assert bench.hf_generation_config(tiny_pair, lookup, "greedy", 8).prompt_lookup_num_tokens == bench.LOOKUP_TOKENS
    prompt = tiny_pair.tokenizer("abcabcabc")["input_ids"]
    plain, ms = bench.run_hf(tiny_pair, bench.METHODS_BY_NAME["hf-plain"], prompt, "greedy", 0, 6)
    assert len(plain) == 6 and ms > 0 and math.isfinite(ms)
    ours = bench.run_ours(tiny_pair, bench.METHODS_BY_NAME["target"], prompt, "greedy", 0, 6)
    assert tuple(ours.tokens) == plain, "our target-only greedy equals transformers' plain greedy"


def test_peak_rss_and_names() -> None:
    if sys.platform.startswith("linux"):
        assert bench.reset_peak_rss() in (True, False)
        assert bench.peak_rss_mb() > 0
    assert report.safe_name("hf:HuggingFaceTB/SmolLM2-135M,./x") == "hf_HuggingFaceTB_SmolLM2-135M_._x"
    assert report.safe_name("qwen-coder") == "qwen-coder"


def test_modes_can_be_chosen_and_a_bad_one_is_refused() -> None:
    assert bench.make_config(quick=True, modes="sample").modes == ("sample",)
    assert bench.make_config(quick=True).modes == ("greedy",) and bench.make_config().modes == bench.MODES
    with pytest.raises(bench.BenchError, match="unknown modes 'beam'"):
        bench.make_config(modes="greedy,beam")
