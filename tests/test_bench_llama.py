"""llama.cpp beside the bench: reading its tools' real output (recorded on a Zen 4), its rows in the aggregation and
the report, the pass-cost table, and the agreement comparison's mechanics on the tiny random pair.

No test runs llama.cpp: its build is not part of the suite (benchmarks/llama_cpp.py makes it); the recordings below
are its tools' own output on the default pair's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from specviz.bench import agreement, harness as bench, llama, passes, report
from specviz.bench.harness import RunRecord

DATA = Path(__file__).parent / "data" / "llama"


def recorded(name: str) -> tuple[str, str]:
    return (DATA / f"{name}.stdout").read_text(), (DATA / f"{name}.stderr").read_text()


# ---------------------------------------------------------------------------------------------
# its output


def test_completion_output_gives_text_tokens_and_its_own_timers() -> None:
    run = llama.parse_completion(*recorded("completion-code"))
    assert run.text.startswith("    if n") and "[end of text]" not in run.text
    assert run.n_tokens == 32, "-n 32: the first token from the prompt's pass, then 31 eval runs"
    assert run.prefill_ms > 0 and run.decode_ms > run.prefill_ms
    assert run.ms_per_token == pytest.approx((run.prefill_ms + run.decode_ms) / 32)
    assert run.n_drafted is None and run.acceptance is None


def test_speculative_output_drops_the_echoed_prompt_and_reads_its_acceptance() -> None:
    prompt = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    run = llama.parse_speculative(*recorded("speculative-code"), prompt)
    assert not run.text.startswith("def fibonacci") and run.text.startswith("    if n")
    assert run.n_tokens >= 32 and 0 < run.n_accepted <= run.n_drafted
    assert run.acceptance == pytest.approx(run.n_accepted / run.n_drafted)
    plain = llama.parse_completion(*recorded("completion-code"))
    assert run.text[: len(plain.text)] == plain.text, "greedy on this preset: its first 32 tokens as its plain run's"


def test_output_it_cannot_read_is_an_error_not_a_figure() -> None:
    stdout, stderr = recorded("completion-code")
    with pytest.raises(llama.LlamaError, match="eval time"):
        llama.parse_completion(stdout, "\n".join(line for line in stderr.splitlines() if "eval time" not in line))
    with pytest.raises(llama.LlamaError, match="echo the prompt"):
        llama.parse_speculative(*recorded("speculative-code"), "another prompt")


def test_commands_are_greedy_raw_text_with_every_thread_setting() -> None:
    build = llama.LlamaBuild(Path("/x/bin"), "abc1234")
    cmd = llama.completion_command(build, Path("t.gguf"), "hi", 32, 2)
    assert cmd[0] == "/x/bin/llama-completion" and "-no-cnv" in cmd and "--no-display-prompt" in cmd
    assert cmd[cmd.index("--temp") + 1] == "0" and cmd[cmd.index("-t") + 1] == "2" and cmd[cmd.index("-n") + 1] == "32"
    assert "-ub" not in cmd
    one_by_one = llama.completion_command(build, Path("t.gguf"), "hi", 32, 2, ubatch=1)
    assert one_by_one[one_by_one.index("-ub") + 1] == "1"
    spec = llama.speculative_command(build, Path("t.gguf"), Path("d.gguf"), "hi", 32, 4, 2)
    assert spec[spec.index("--spec-draft-n-max") + 1] == "4" and spec[spec.index("-md") + 1] == "d.gguf"
    assert build.version == "llama.cpp@abc1234 (llama-cpp-python 0.3.36 sdist)"


def test_no_build_or_no_gguf_pair_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    assert llama.find_build() is None
    assert "no llama.cpp build for this CPU" in llama.why_no_peer("qwen-coder")
    assert "benchmarks/llama_cpp.py" in llama.why_no_peer("qwen-coder")
    assert llama.why_no_peer("tiny-random") == "tiny-random is not made of packaged GGUF files"
    with llama.peer_for("qwen-coder", 2) as peer:
        assert peer is None


def test_llama_bench_records_give_pass_and_step_times() -> None:
    records = [{"n_prompt": 5, "n_gen": 0, "avg_ns": 99e6, "stddev_ns": 1e6},
               {"n_prompt": 0, "n_gen": 32, "avg_ns": 32 * 30e6, "stddev_ns": 32 * 0.5e6}]
    found = llama.pass_costs(records)
    assert found == {"pass_ms": {5: (99.0, 1.0)}, "tg_ms": (30.0, 0.5)}


# ---------------------------------------------------------------------------------------------
# its rows in the bench


def rec(method: str, repeat: int, ms: float, tokens: tuple[int, ...], **kw) -> RunRecord:
    return RunRecord(pair="qwen-coder", workload="code", mode="greedy", method=method, repeat=repeat, tokens=tokens,
                     ms_per_token=ms, **kw)


def test_llama_rows_compare_with_our_target_and_with_its_own_plain_text() -> None:
    records = []
    for r in range(3):
        records += [rec("target", r, 30.0, (1, 2, 3)), rec("llama.cpp", r, 35.0, (1, 2, 3)),
                    rec("llama.cpp-spec-g4", r, 60.0, (1, 2, 3), acceptance_rate=0.8, gamma=4.0),
                    rec("llama.cpp-spec-g16", r, 70.0, (1, 9, 3), acceptance_rate=0.5, gamma=16.0)]
    rows = {row.method: row for row in bench.aggregate(records)}
    plain, g4, g16 = rows["llama.cpp"], rows["llama.cpp-spec-g4"], rows["llama.cpp-spec-g16"]
    assert {plain.family, g4.family, g16.family} == {"llama"}
    assert plain.identical_to_baseline is True and plain.identical_to_llama_plain is None
    assert g4.identical_to_llama_plain is True and g16.identical_to_llama_plain is False
    assert g16.identical_to_baseline is False and rows["target"].identical_to_llama_plain is None
    assert plain.speedup == pytest.approx(30.0 / 35.0) and g4.acceptance_rate == 0.8
    table = report.markdown_table(list(rows.values()))
    assert "| = llama.cpp |" in table and "`llama.cpp-spec-g16`" in table and "**NO**" in table
    assert list(bench.CSV_COLUMNS)[-1] == "identical_to_llama_plain"


def test_llama_methods_run_greedy_only_and_only_beside_a_peer() -> None:
    peer = llama.LlamaPeer(llama.LlamaBuild(Path("/x"), None), Path("d"), Path("t"), 2)
    method = bench.METHODS_BY_NAME["llama.cpp-spec-g4"]
    assert bench._runs_in(method, "greedy", peer) and not bench._runs_in(method, "sample", peer)
    assert not bench._runs_in(method, "greedy", None)
    assert bench._runs_in(bench.METHODS_BY_NAME["spec-g4"], "sample", None)
    assert {"llama.cpp", "llama.cpp-spec-g4", "llama.cpp-spec-g16"} <= set(bench.QUICK_METHODS)


def test_pass_table_shows_both_engines_in_ms_and_in_their_own_steps() -> None:
    costs = passes.PassCosts((1, 5, 16), 40, (30.0, 45.0, 150.0), "gguf on blockgemm (avx512)",
                             llama_ms=(30.0, 99.0, 203.0), llama_sd_ms=(0.1, 1.0, 2.0), llama_tg_ms=29.8,
                             llama_version="llama.cpp@0c1e570")
    text = "\n".join(passes.report_lines(costs))
    assert "| specviz, gguf on blockgemm (avx512) (median of repeats) | 30.0 ms (1.00) | 45.0 ms (1.50) | " \
           "150.0 ms (5.00) |" in text
    assert "| llama.cpp@0c1e570, `llama-bench -d 40` (mean) | 30.0 ms (1.00) | 99.0 ms (3.30) | 203.0 ms (6.77) |" in text
    assert "29.8 ms" in text
    alone = "\n".join(passes.report_lines(passes.PassCosts((1, 5, 16), 40, (30.0, 45.0, 150.0), "fp32")))
    assert "llama" not in alone


# ---------------------------------------------------------------------------------------------
# the agreement table's mechanics (tiny random pair: no claim about the real model)


@pytest.fixture(scope="module")
def tiny_pair():
    from specviz import models

    return models.load_pair("tiny-random", device="cpu")


def test_first_difference_and_the_token_that_holds_it() -> None:
    class Pieces:
        def decode(self, ids, skip_special_tokens=False):
            return "".join({1: "ab", 2: "c", 3: "de"}[i] for i in ids)

    assert agreement.first_difference("abcde", "abcXe") == 3
    assert agreement.first_difference("abc", "abcdef") is None
    assert agreement.token_at_char(Pieces(), [1, 2, 3], 3) == 2 and agreement.token_at_char(Pieces(), [1, 2, 3], 1) == 0


def test_same_text_agrees_and_a_changed_token_is_found_with_its_gap(tiny_pair) -> None:
    tok, prompt = tiny_pair.tokenizer, "abc abc abc"
    ids = tok(prompt)["input_ids"]
    ours, logits = agreement.greedy_with_logits(tiny_pair.target, ids, 12, tuple(tiny_pair.eos_ids))
    from specviz.core.engine import autoregressive_generate
    from specviz.core.progress import drain
    from specviz.core.sampling import SamplingConfig
    from specviz.core.trace import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=12, sampling=SamplingConfig(mode="greedy", seed=0))
    engine = drain(autoregressive_generate(tiny_pair.target, tok, ids, cfg, tuple(tiny_pair.eos_ids)))
    assert list(engine.tokens) == ours, "the comparison's greedy run is the engine's own"
    text = tok.decode(ours, skip_special_tokens=True)
    same = agreement.compare(tiny_pair, "p", prompt, text, 12)
    assert same.parting is None and same.same_tokens == len(ours) and agreement.verdict(same.parting) == "same text"
    # llama.cpp's text stand-in: our text up to token 5, then our runner-up there
    runner_up = int(logits[5].topk(2).indices[1])
    other = tok.decode(ours[:5] + [runner_up], skip_special_tokens=True)
    assert not tok.decode(ours[:6], skip_special_tokens=True).startswith(other), "the stand-in must differ in text"
    parted = agreement.compare(tiny_pair, "p", prompt, other, 12)
    p = parted.parting
    assert p is not None and parted.same_tokens == 5 and p.token_index == 5
    assert p.theirs_rank == 2 and p.gap == pytest.approx(float(logits[5][ours[5]] - logits[5][runner_up]))
    assert p.gap >= 0 and p.order_shift < 1e-3, "fp32 target: the two float orders agree to far below a logit"
    table = agreement.markdown([same, parted], ["# t"])
    assert "| p | all " in table and "| p | 5 | token 6:" in table
