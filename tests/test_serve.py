"""The batched executor: many runs in one forward, each run's logits bit-identical to the same run alone (tiny models and real weights)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.core import drafters
from specviz.core.forward import forward
from specviz.core.engine import autoregressive_generate, autoregressive_program, speculative_generate, speculative_program
from specviz.core.kv import CachedLM
from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.core.drafters.tree import TreeConfig
from specviz.models.packed import pack_linears
from specviz.serve.batch import MAX_RUNS, Batch, run_together
from specviz.serve.exact import batch_exactness
from tests.test_app_settings import _wait
from tests.test_engine import IdTokenizer

V = 64


TOK = IdTokenizer()


def aligned_lm(seed: int, packed: bool = True) -> LlamaForCausalLM:
    """A tiny Llama whose widths are multiples of 16 (rows start on vector boundaries), with packed linears."""
    torch.manual_seed(seed)  # test-only: builds weights
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)).eval()
    if packed:
        assert pack_linears(model)
    return model


@pytest.fixture(scope="module")
def target():
    return aligned_lm(0)


@pytest.fixture(scope="module")
def draft():
    return aligned_lm(1)


def greedy(n, gamma=4, adaptive=False):
    return GenerationConfig(max_new_tokens=n, gamma=gamma, adaptive=adaptive, sampling=SamplingConfig("greedy"))


def sampled(n, seed, gamma=3):
    return GenerationConfig(max_new_tokens=n, gamma=gamma, sampling=SamplingConfig("sample", temperature=1.0, seed=seed))


# six runs of every kind: drafters, modes, prompt lengths and budgets all differ
RUNS = (
    ("model", [1, 2, 3, 4, 5], greedy(20)),
    ("tree", [7, 8, 9], greedy(17)),
    ("ngram", [1, 2, 3, 1, 2, 3, 1, 2], greedy(15)),
    ("none", [5, 6, 7, 8, 9, 10, 11], greedy(12)),
    ("model", [3, 4], sampled(18, seed=3)),
    ("model", [9] * 12, greedy(16, gamma=8, adaptive=True)),
    ("tree", [2, 9, 4, 4], sampled(11, seed=5)),
)


def program(target, draft, kind, prompt, cfg):
    if kind == "none":
        return autoregressive_program(target, TOK, prompt, cfg)
    return speculative_program(target, drafters.build(kind, draft, adaptive=cfg.adaptive,
                                                    tree=TreeConfig(budget=8, branching=2, depth=4, min_score=0.0)),
                               TOK, prompt, cfg)


def alone(target, draft, kind, prompt, cfg):
    if kind == "none":
        return drain(autoregressive_generate(target, TOK, prompt, cfg))
    return drain(speculative_generate(target, drafters.build(kind, draft, adaptive=cfg.adaptive,
                                                           tree=TreeConfig(budget=8, branching=2, depth=4, min_score=0.0)),
                                      TOK, prompt, cfg))


def test_packed_passes_give_each_run_the_logits_it_gets_alone(target):
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7], list(range(20, 41))]
    alone_out = []
    for p in prompts:
        lm = CachedLM(target)
        lm.prefill(p[:-3])
        alone_out.append(lm.logits(p, 4 if len(p) > 4 else len(p)))
    lms = [CachedLM(target) for _ in prompts]
    for lm, p in zip(lms, prompts):
        lm.prefill(p[:-3])
    packed = forward(target, [lm.feed(p, 4 if len(p) > 4 else len(p)) for lm, p in zip(lms, prompts)])
    assert all(torch.equal(a, b.logits) for a, b in zip(alone_out, packed))


def test_runs_of_every_kind_together_equal_each_run_alone(target, draft):
    assert batch_exactness(target).exact
    gens, sharing, _ = run_together([program(target, draft, *r) for r in RUNS], target)
    for (kind, prompt, cfg), gen, share in zip(RUNS, gens, sharing):
        solo = alone(target, draft, kind, prompt, cfg)
        assert gen.tokens == solo.tokens, kind
        if cfg.sampling.greedy:  # the promise: the target's own greedy text
            assert gen.tokens == drain(autoregressive_generate(target, TOK, prompt, greedy(cfg.max_new_tokens))).tokens
        if not cfg.adaptive:  # every draw replays (the adaptive policy reads timings, which sharing changes)
            assert [r.uniforms for r in gen.rounds] == [r.uniforms for r in solo.rounds]
        assert share.most > 1  # it really shared passes
    assert max(s.most for s in sharing) == len(RUNS)


def _rows_fed(model):
    """A counter of the rows a model's passes compute (its embedding sees every fed id once) and its hook."""
    seen = [0]
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, args, _o: seen.__setitem__(0, seen[0] + args[0].numel()))
    return seen, hook


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "one-run-a-forward"])
def test_runs_on_one_prompt_compute_its_first_pass_once_and_each_ends_as_it_would_alone(target, draft, packed):
    """A class pressing Play on one preset: the prompt's first pass is one pass's rows for all of them, nothing else
    changes; where the target's passes are not packed (serve.exact refused it) too, each twin's pass being the same rows alone."""
    from specviz.serve.exact import Exactness

    prompt = [4, 5, 6, 7, 8, 9, 10]
    runs = [("model", prompt, sampled(10, seed=s)) for s in range(5)] + [("tree", prompt, greedy(9)),
                                                                          ("model", [4, 5, 6], greedy(8))]
    assert batch_exactness(target).exact  # its check (once per model) runs passes of its own: before the counting
    seen, hooks = zip(*(_rows_fed(m) for m in (target, draft)))
    try:
        solos = [alone(target, draft, *r) for r in runs]
        alone_rows = [n[0] for n in seen]
        for n in seen:
            n[0] = 0
        exactness = batch_exactness if packed else (lambda model, rows: Exactness(False, rows, "refused for the test"))
        gens, sharing, _ = run_together([program(target, draft, *r) for r in runs], target, exactness=exactness)
    finally:
        for h in hooks:
            h.remove()
    for gen, solo in zip(gens, solos):
        assert gen.tokens == solo.tokens and [r.uniforms for r in gen.rounds] == [r.uniforms for r in solo.rounds]
    shared = 5 * (len(prompt) - 1)  # the tree run and four model runs rode on one model run's prefill of 6 rows
    assert seen[0][0] == alone_rows[0] - shared  # the target
    assert seen[1][0] == alone_rows[1] - shared  # the draft model, which both drafters prefill the same way
    assert packed or max(s.passes for s in sharing) > 0 and all(s.most <= 6 for s in sharing)  # only twins shared


def test_a_target_whose_rows_depend_on_the_pass_is_served_one_run_per_forward(draft):
    plain = aligned_lm(0, packed=False)
    found = batch_exactness(plain)
    if found.exact:
        pytest.skip("torch's plain linears are row-invariant on this CPU: nothing to refuse here")
    assert "one per forward" in found.reason
    gens, sharing, _ = run_together([program(plain, draft, *r) for r in RUNS[:4]], plain)
    assert all(s.most == 1 for s in sharing)  # never packed...
    for (kind, prompt, cfg), gen in zip(RUNS[:4], gens):
        assert gen.tokens == alone(plain, draft, kind, prompt, cfg).tokens  # ...and still each run's own result


def test_a_failing_or_cancelled_run_leaves_the_others_untouched(target, draft):
    def broken():
        yield from autoregressive_program(target, TOK, [1, 2, 3], greedy(3))
        raise RuntimeError("this run breaks after its last round")

    batch = Batch()
    batch.add("ok", program(target, draft, *RUNS[0]), target)
    batch.add("bad", broken(), target)
    batch.add("gone", program(target, draft, *RUNS[3]), target)
    outcomes = {}
    batch.tick()
    batch.cancel("gone")
    while batch.active:
        for o in batch.tick():
            outcomes[o.key] = o
    assert set(outcomes) == {"ok", "bad"}
    assert isinstance(outcomes["bad"].error, RuntimeError)
    assert outcomes["ok"].generation.tokens == alone(target, draft, *RUNS[0]).tokens


def test_a_pass_that_fails_packed_is_answered_run_by_run(target, draft, monkeypatch):
    """A forward that raises for the packed pass (say, out of memory) is undone and retried alone for each run."""
    from specviz.core import forward as fwd
    from specviz.serve import batch as batch_module

    real = fwd.forward

    def fails_when_packed(model, feeds):
        if len(feeds) > 1 and model is target:
            real(model, feeds)  # the caches are extended, then it fails: the executor must crop them back
            raise MemoryError("no room for the packed pass")
        return real(model, feeds)

    monkeypatch.setattr(batch_module, "forward", fails_when_packed)
    gens, sharing, _ = run_together([program(target, draft, *r) for r in RUNS[:4]], target)
    for (kind, prompt, cfg), gen in zip(RUNS[:4], gens):
        assert gen.tokens == alone(target, draft, kind, prompt, cfg).tokens


@pytest.mark.real
@pytest.mark.slow
def test_real_pair_runs_together_match_alone_and_the_targets_greedy_text(qwen_pair):
    """Default pair, default precision: six runs with different prompts, drafters and modes share passes; each equals itself alone."""
    pair = qwen_pair
    found = batch_exactness(pair.target)
    assert found.exact, found.reason
    enc = [pair.tokenizer(p, add_special_tokens=False)["input_ids"] for p in (
        "def fibonacci(n):", "Shopping list:\n1.", "Once upon a time, in a quiet village by the sea, there lived",
        "SELECT name FROM pupils WHERE", "The capital of France is", "for i in range(10):")]
    tree = TreeConfig()
    runs = [
        (drafters.build("model", pair.draft), enc[0], greedy(12)),
        (drafters.build("tree", pair.draft, tree=tree), enc[1], greedy(10)),
        (drafters.build("ngram", None), enc[2], greedy(9)),
        (None, enc[3], greedy(8)),
        (drafters.build("model", pair.draft), enc[4], sampled(8, seed=2)),
        (drafters.build("model", pair.draft, adaptive=True), enc[5], greedy(11, gamma=8, adaptive=True)),
    ]

    def prog(d, ids, cfg):
        if d is None:
            return autoregressive_program(pair.target, pair.tokenizer, ids, cfg, pair.eos_ids)
        return speculative_program(pair.target, d, pair.tokenizer, ids, cfg, pair.eos_ids)

    gens, sharing, _ = run_together([prog(*r) for r in runs], pair.target)
    assert max(s.most for s in sharing) == 6
    for (d, ids, cfg), gen in zip(runs, gens):
        target_only = drain(autoregressive_generate(pair.target, pair.tokenizer, ids, cfg, pair.eos_ids))
        if cfg.sampling.greedy:
            assert gen.tokens == target_only.tokens  # the promise, on real weights, through shared passes
        else:  # sampled: the int8 draft's q may move in its last bits when batched, so compare the law, below
            assert len(gen.tokens) == cfg.max_new_tokens


@pytest.mark.real
@pytest.mark.slow
def test_sampled_runs_through_the_executor_follow_the_targets_law(qwen_pair):
    """Default pair: 400 sampled speculative runs of 2 tokens, MAX_RUNS at a time, against the target's exact law (the Same answer lab's test)."""
    from collections import Counter

    from specviz.labs.same_answer import SampleConfig, SampleCounts, exact_law, fit_test, target_memo
    pair = qwen_pair
    found = batch_exactness(pair.target)
    if not found.exact:
        pytest.skip(found.reason)
    sampling = SamplingConfig("sample", temperature=0.8, top_p=0.95)
    ids = pair.tokenizer("My favourite colour is", add_special_tokens=False)["input_ids"]
    cfg = SampleConfig(sampling, n_samples=400, n_tokens=2)
    drafter = drafters.build("model", pair.draft)
    programs = [speculative_program(pair.target, drafter, pair.tokenizer, ids, GenerationConfig(
        max_new_tokens=2, gamma=3, sampling=SamplingConfig("sample", temperature=0.8, top_p=0.95, seed=s),
        trace_top_n=1, stop_at_eos=False)) for s in range(cfg.n_samples)]
    gens, sharing, _ = run_together(programs, pair.target)
    assert max(s.most for s in sharing) == MAX_RUNS  # the executor's one batch limit
    assert sum(g.drafted for g in gens) > 0  # the rule was exercised
    law = drain(exact_law(target_memo(pair.target, sampling), pair.tokenizer, ids, cfg))
    seen = Counter(g.tokens for g in gens)
    counts = SampleCounts("speculative", "exact", tuple(seen.most_common()), cfg.n_samples, 0.0, 0, 0, 0, 0)
    test = fit_test(law, counts)
    assert test.n_bins >= 5 and test.pvalue > 1e-3, test


# ------------------------------------------------------------------------------------------
# The server's runner: shared runs in one batch, labs alone, bounded memory
# ------------------------------------------------------------------------------------------


def _shared(target, draft, kind, prompt, cfg):
    from specviz.serve.batch import SharedRun

    return lambda: SharedRun(program(target, draft, kind, prompt, cfg), target)


def test_the_runner_batches_runs_that_join_while_others_run_and_runs_labs_alone(target, draft):
    import threading

    from specviz.serve.worker import Runner

    runner = Runner(str)
    first = runner.submit("a", _shared(target, draft, "none", [1, 2, 3], greedy(60)), shared=True)
    assert _wait(lambda: len(first.view().rounds) >= 2, 120)  # running...
    joined = [runner.submit(("r", i), _shared(target, draft, *r), shared=True) for i, r in enumerate(RUNS)]
    assert _wait(lambda: all(j.view().finished for j in [first, *joined]), 120)
    for j, r in zip(joined, RUNS):
        view = j.view()
        assert view.state == "done" and view.generation.tokens == alone(target, draft, *r).tokens
        assert len(view.rounds) == len(view.generation.rounds)  # every round was streamed as it happened
        assert view.sharing.most > 1
    assert first.view().sharing.most > 1  # ...they joined the run that was already going

    gate, seen = threading.Event(), []

    def lab():
        seen.append(runner.sharing_now())  # alone: no shared run is advancing now
        gate.wait(10)
        yield 0
        return "lab"

    before = runner.submit("b", _shared(target, draft, "none", [4, 5], greedy(40)), shared=True)
    lab_job = runner.submit("lab", lab)
    after = runner.submit("c", _shared(target, draft, "none", [6], greedy(5)), shared=True)
    assert _wait(lambda: lab_job.view().state == "running", 120)
    assert before.view().finished and after.view().state == "queued"  # first come, first served
    gate.set()
    assert _wait(lambda: after.view().finished, 120) and seen == [0]


def _runner_threads() -> int:
    import threading

    return sum(1 for t in threading.enumerate() if t.name == "specviz-runner")


def test_the_runners_thread_ends_when_idle_and_the_next_job_starts_one(target, draft):
    """An idle worker thread would keep torch's OpenMP team alive, which slows every other thread's parallel ops
    (serve/worker.py, Runner): it ends once nothing is queued or running, and a later job gets a new one."""
    from specviz.serve.worker import Runner

    runner = Runner(str)
    assert _wait(lambda: _runner_threads() == 0, 30)  # other tests' runners have ended too
    first = runner.submit("a", _shared(target, draft, "model", [1, 2, 3], greedy(12)), shared=True)
    lab = runner.submit("lab", lambda: iter(()))  # a job that runs alone
    assert _wait(lambda: first.view().finished and lab.view().finished, 120) and _runner_threads() <= 1
    assert _wait(lambda: _runner_threads() == 0, 30)
    again = runner.submit("b", _shared(target, draft, "model", [1, 2, 3], greedy(12)), shared=True)
    assert _wait(lambda: again.view().finished, 120)
    assert again.view().generation.tokens == first.view().generation.tokens
    assert _wait(lambda: _runner_threads() == 0, 30)


def test_a_stopped_shared_run_leaves_the_batch_and_the_others_finish(target, draft):
    from specviz.serve.worker import Runner

    runner = Runner(str)
    long = runner.submit("long", _shared(target, draft, "none", [1, 2], greedy(200)), shared=True)
    other = runner.submit("other", _shared(target, draft, *RUNS[0]), shared=True)
    assert _wait(lambda: len(long.view().rounds) >= 3, 120)
    long.cancel()
    assert _wait(lambda: long.view().finished and other.view().finished, 120)
    assert long.view().state == "cancelled" and len(long.view().rounds) < 200
    assert other.view().generation.tokens == alone(target, draft, *RUNS[0]).tokens


def _rss_mb() -> float:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_300_runs_in_a_row_leave_the_servers_memory_where_it_was(target, draft):
    """Soak: 300 speculative runs with their baselines, several at a time, through one runner; RSS grows <= 50 MB."""
    import gc

    from specviz.serve.worker import Runner

    runner = Runner(str, max_jobs=160)

    def wave(start, n):
        jobs = []
        for i in range(start, start + n):
            prompt = [1 + i % 50, 2 + i % 7, 3]
            jobs.append(runner.submit(("s", i), _shared(target, draft, "model", prompt, greedy(12)), shared=True))
            jobs.append(runner.submit(("p", i), _shared(target, draft, "none", prompt, greedy(12)), shared=True))
        assert _wait(lambda: all(j.view().finished for j in jobs), 120)
        assert all(j.view().state == "done" for j in jobs)

    for start in range(0, 96, 12):  # warm up: allocator pools, and the finished-job records up to max_jobs (192 > 160)
        wave(start, 12)
    gc.collect()
    before = _rss_mb()
    for start in range(96, 396, 12):
        wave(start, 12)
    gc.collect()
    grown = _rss_mb() - before
    print(f"\n300 runs and their baselines in a row: RSS {before:.0f} -> {before + grown:.0f} MiB")
    assert grown <= 50


# ------------------------------------------------------------------------------------------
# python -m specviz batch
# ------------------------------------------------------------------------------------------


def test_the_batch_command_prints_every_size_with_both_rates_and_identity(capsys):
    import json

    from specviz import cli

    code = cli.main(["batch", "--pair", "tiny-random", "--sizes", "1,3", "--max-new-tokens", "5", "--json", "-q"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [s["batch"] for s in out["sizes"]] == [1, 3]
    for s in out["sizes"]:
        assert s["plain_tokens_per_s"] > 0 and s["spec_tokens_per_s"] > 0 and s["identical"] is True
        assert s["speedup_range"][0] <= s["speedup"] <= s["speedup_range"][1]
    assert out["note"]  # shared passes or not, and why
    assert cli.main(["batch", "--pair", "tiny-random", "--sizes", "0,99", "-q"]) == 2  # sizes out of range: one line


def test_long_context_prompts_are_different_windows_of_one_document():
    from specviz.models import load_pair
    from specviz.bench.batch import batch_prompts, document_prompts

    tok = load_pair("tiny-random").tokenizer
    windows = document_prompts(tok, 4, 300)
    assert len(windows) == 4 and all(len(w) == 300 for w in windows)
    assert len({tuple(w) for w in windows}) == 4
    prompts = batch_prompts(12)
    assert len(set(prompts)) == 12 and prompts[0].startswith("def fibonacci")  # the presets first


def test_a_verdict_is_remembered_in_the_cache_for_the_same_model_code_and_machine(tmp_path, monkeypatch):
    """The start-up check's verdict is written beside the weights and read at the next start (same key): it is not
    measured again; another key (another kernel, precision or code) measures."""
    from specviz.models import load_pair
    from specviz.serve import exact

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    calls = []
    real = exact._check
    monkeypatch.setattr(exact, "_check", lambda model, rows: calls.append(rows) or real(model, rows))
    key = exact.verdict_key("tiny-random", "fp32", "oneDNN, float32")
    assert key == exact.verdict_key("tiny-random", "fp32", "oneDNN, float32")
    assert key != exact.verdict_key("tiny-random", "fp16w", "rowgemm avx512, fp16 weights")
    first = exact.batch_exactness(load_pair("tiny-random").target, 16, remember=key)
    assert calls == [16] and (tmp_path / "exactness" / f"{key}.json").is_file()
    again = exact.batch_exactness(load_pair("tiny-random").target, 16, remember=key)  # a new model object
    assert calls == [16] and again.exact == first.exact and "an earlier start" in again.reason
    exact.batch_exactness(load_pair("tiny-random").target, 32, remember=key)  # more rows than remembered
    assert calls == [16, 32]
