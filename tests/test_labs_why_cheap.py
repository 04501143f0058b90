"""specviz.labs.why_cheap on the tiny random pair: pass timing, batch caches, memory stop, speed-up maths, JSON, CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specviz.bench import timing
from specviz.core import metrics
from specviz import models
from specviz import cli
from specviz.labs import why_cheap as vc
from specviz.core.progress import Progress


@pytest.fixture(scope="module")
def pair() -> models.LoadedPair:
    return models.load_pair("tiny-random", device="cpu")


def _cost(times: tuple[tuple[float, ...], ...], ks: tuple[int, ...] = (1, 2, 4)) -> vc.PassCost:
    return vc.PassCost("x", timing.Machine("cpu", "test", 2), 10, ks, times)


def _drain(gen):  # type: ignore[no-untyped-def]
    items = []
    while True:
        try:
            items.append(next(gen))
        except StopIteration as end:
            return items, end.value


# ------------------------------------------------------------------------------------------ exact maths


def test_pass_cost_medians_ratios_and_linear_line():
    cost = _cost(((10.0, 12.0, 11.0), (15.0, 13.0, 14.0), (22.0, 90.0, 20.0)))
    assert cost.median_ms == (11.0, 14.0, 22.0)
    assert cost.step_ms == 11.0
    assert cost.ratios == pytest.approx((1.0, 14 / 11, 2.0))
    assert cost.linear_ms == (11.0, 22.0, 44.0)
    assert cost.spread == pytest.approx(90 / 20)  # the k = 4 repeats: one was disturbed
    assert timing.spread([(5.0, 5.0)]) == 1.0 and timing.spread([]) == 1.0


def test_step_is_the_one_token_pass_wherever_it_sits():
    cost = vc.PassCost("x", timing.Machine("cpu", "t", 1), 5, (1, 8), ((4.0,), (10.0,)))
    assert cost.ratios == (1.0, 2.5)


def test_speedup_at_cost_generalises_leviathan():
    for alpha, gamma, c in ((0.8, 4, 0.1), (0.3, 2, 0.5), (1.0, 5, 0.05), (0.0, 3, 0.2)):
        assert metrics.expected_speedup_at_cost(alpha, gamma, c, 1.0) == pytest.approx(
            metrics.expected_speedup(alpha, gamma, c))
    # α = 0.8, γ = 4: E[tokens] = (1 - 0.8^5) / 0.2 = 3.3616; verify costs 2 steps, c = 0.1 -> 3.3616 / 2.4
    assert metrics.expected_speedup_at_cost(0.8, 4, 0.1, 2.0) == pytest.approx(3.3616 / 2.4)
    assert metrics.expected_speedup_at_cost(0.8, 4, 0.1, 3.0) < metrics.expected_speedup_at_cost(0.8, 4, 0.1, 2.0)


def test_configs_refuse_bad_values():
    with pytest.raises(ValueError, match="include 1"):
        vc.PassCostConfig(ks=(2, 4))
    with pytest.raises(ValueError, match="repeats"):
        vc.PassCostConfig(repeats=0)
    assert vc.PassCostConfig(repeats=3) == vc.PassCostConfig(repeats=3)
    assert hash(vc.PassCostConfig()) == hash(vc.PassCostConfig())


# ------------------------------------------------------------------------------------------ memory


def test_batch_bytes_grows_with_batch_and_tokens(pair):
    cfg = pair.target.config
    one = timing.batch_bytes(cfg, 1, 5, 100)
    assert 0 < one < timing.batch_bytes(cfg, 2, 5, 100) < timing.batch_bytes(cfg, 4, 5, 100)
    assert timing.batch_bytes(cfg, 1, 5, 100) < timing.batch_bytes(cfg, 1, 9, 100)
    # the KV cache alone: 2 (k, v) x layers x kv_heads x head_dim x positions x 4 bytes
    d = timing.dims(cfg)
    assert one > 2 * d["layers"] * d["kv_heads"] * d["head_dim"] * 105 * 4


def test_memory_problem_names_the_batch_and_the_sizes():
    assert timing.memory_problem(10, timing.MEMORY_RESERVE + 10, 4) is None
    msg = timing.memory_problem(2**30, timing.MEMORY_RESERVE, 8)
    assert msg is not None and "batch 8" in msg and "MB" in msg


def test_available_bytes_on_cpu_is_positive():
    assert timing.available_bytes(torch.device("cpu")) > 0


# ------------------------------------------------------------------------------------------ real passes (tiny model)


def test_timed_pass_crops_the_cache_back_and_times_the_engines_own_pass(pair, monkeypatch):
    ids = vc.encode(pair.tokenizer, "hello world, hello")
    lm = timing.prefilled(pair.target, ids)
    assert lm.ids == ids and lm.cache.get_seq_length() == len(ids)
    passes = []
    real = timing.CachedLM.logits
    monkeypatch.setattr(timing.CachedLM, "logits", lambda self, seq, n: passes.append((list(seq), n)) or real(self, seq, n))
    ms = timing.timed_pass_ms(lm, vc.new_token_ids(ids, 8))
    assert ms > 0 and lm.cache.get_seq_length() == len(ids) and lm.ids == ids
    assert passes == [(ids + vc.new_token_ids(ids, 8), 8)]  # logits at every new position, as a verify pass


def test_several_targets_are_timed_turn_about(pair):
    config = vc.PassCostConfig(ks=(1, 2), repeats=3, warmup=1)
    items, costs = _drain(vc.measure_pass_costs({"a": pair.target, "b": pair.draft}, pair.tokenizer, config))
    assert [c.pair for c in costs] == ["a", "b"] and all(len(t) == 3 for c in costs for t in c.times_ms)
    names = [p.message.rsplit("(", 1)[-1] for p in items[1:]]
    assert names[:4] == ["a)", "b)", "a)", "b)"]  # k = 1 for both, then k = 2 for both


def test_measure_pass_cost_yields_progress_and_raw_times(pair):
    config = vc.PassCostConfig(ks=(1, 2, 4), repeats=3, warmup=1)
    items, cost = _drain(vc.measure_pass_cost(pair.target, pair.tokenizer, "tiny-random", config))
    assert all(isinstance(p, Progress) for p in items)
    done = [p.done for p in items[1:]]
    assert done == sorted(done) and items[0].message.startswith("reading the")
    assert items[-1].fraction == 1.0 and items[-1].total == (1 + 3) * 3
    assert cost.ks == (1, 2, 4) and [len(t) for t in cost.times_ms] == [3, 3, 3]
    assert all(t > 0 for ts in cost.times_ms for t in ts)
    assert cost.context_tokens == len(vc.encode(pair.tokenizer, vc.CONTEXT))
    assert cost.ratios[0] == 1.0 and cost.machine.device == "cpu" and cost.pair == "tiny-random"


# ------------------------------------------------------------------------------------------ JSON and CLI


def test_json_round_trip_and_reference_file(tmp_path):
    cost = _cost(((10.5, 11.25), (13.0, 12.0), (20.0, 21.0)))
    # an older file's "batch_effect" (the timed-pass estimate bench/batch replaced) is left unread
    text = json.dumps({"note": "test", "pass_cost": vc.pass_cost_to_dict(cost), "batch_effect": {"points": []}})
    path = tmp_path / "gpu.json"
    path.write_text(text, encoding="utf-8")
    ref = vc.load_reference(path)
    assert ref is not None and ref.note == "test"
    assert ref.pass_cost == cost and not hasattr(ref, "batch_effect")
    assert vc.load_reference(tmp_path / "missing.json") is None


def test_cli_prints_the_measurement_as_json(capsys):
    rc = cli.main(["why-cheap", "--pair", "tiny-random", "--device", "cpu", "--json", "-q", "--repeats", "1", "--ks", "1,2",
                  "--note", "unit test"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["note"] == "unit test"
    assert out["pass_cost"]["ks"] == [1, 2] and out["pass_cost"]["ratio_to_one_token"][0] == 1.0
    assert "batch_effect" not in out and all(math.isfinite(x) for x in out["pass_cost"]["ratio_to_one_token"])
    assert vc.pass_cost_from_dict(out["pass_cost"]).ks == (1, 2)


def test_cli_refuses_bad_arguments_in_one_line(capsys):
    assert cli.main(["why-cheap", "--pair", "tiny-random", "--ks", "2,4", "-q"]) == 2
    assert cli.main(["why-cheap", "--pair", "no-such-pair", "-q"]) == 2
    assert cli.main(["why-cheap", "--pair", "tiny-random", "--batches", "1,2", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("specviz: error:") for line in err)
    assert "specviz batch" in err[2]  # the batch effect is measured by real batched runs now
