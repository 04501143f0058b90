"""The lean pass (core.lean): transformers' own bits, op for op, for one run or many runs packed, trees and hidden states."""

import os

import pytest
import torch

from specviz.core import lean
from specviz.core.forward import forward
from specviz.core.kv import CachedLM, TreeLM
from specviz.models import load_pair, rowgemm


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny-random", target_precision="fp16w")


def _both(monkeypatch, model, make_feeds):
    """The same passes answered by the lean pass and by transformers' forward, each from fresh caches."""
    out = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("SPECVIZ_LEAN", mode)
        out[mode] = [forward(model, feeds) for feeds in make_feeds()]
    return out["1"], out["0"]


def _same(a, b):
    return all(torch.equal(x.logits, y.logits) and len(x.hidden) == len(y.hidden)
               and all(torch.equal(h, g) for h, g in zip(x.hidden, y.hidden)) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_the_tiny_models_are_lean_and_other_families_are_not(pair):
    assert lean.supports(pair.target) and lean.supports(pair.draft)

    class Other(torch.nn.Module):
        config = type("C", (), {"model_type": "gemma3_text"})()

    assert not lean.supports(Other())


@pytest.mark.parametrize("role", ["target", "draft"])
def test_prefill_steps_and_packed_runs_give_transformers_bits(pair, role, monkeypatch):
    model = getattr(pair, role)
    layers = tuple(range(model.config.num_hidden_layers + 1)) + (-1,)

    def passes():
        a, b, c = CachedLM(model), CachedLM(model), CachedLM(model)
        ids = list(range(40, 90))
        yield [a.feed(ids[:20], 20, layers)]  # a prefill, every hidden state
        yield [a.feed(ids[:21], 1), b.feed(ids[5:30], 3, layers=(0, -1), hidden_last=2)]  # a step packed with a prompt
        yield [a.feed(ids[:26], 5), b.feed(ids[5:31], 1), c.feed(ids[:3], 2)]  # three runs: verify, step, a tiny prompt

    lean_out, hf_out = _both(monkeypatch, model, passes)
    assert _same(lean_out, hf_out)


def test_a_tree_pass_gives_transformers_bits(pair, monkeypatch):
    def passes():
        lm = TreeLM(pair.target)
        ids = list(range(60, 80))
        yield [lm.prefill_feed(ids)]
        yield [lm.tree_feed(ids, [5, 6, 7, 8], [-1, -1, 0, 1], with_root=True)]

    lean_out, hf_out = _both(monkeypatch, pair.target, passes)
    assert _same(lean_out, hf_out)


def test_fused_projections_change_no_bit(pair, monkeypatch):
    """rowgemm.fuse gives q/k/v and gate/up one kernel call each: the same bits as one call per layer."""
    import copy

    if rowgemm.kernel() is None:
        pytest.skip("rowgemm cannot be built here")
    model = pair.target
    if not any(getattr(m, "fused_with", None) is not None for m in model.modules()):
        pytest.skip("this target's linears are not rowgemm panels here")
    plain = copy.deepcopy(model)
    for m in plain.modules():
        if getattr(m, "fused_with", None) is not None:
            m.fused_with = None  # each layer's own call again
    monkeypatch.setenv("SPECVIZ_LEAN", "1")
    ids = list(range(30, 70))
    fused, unfused = CachedLM(model), CachedLM(plain)
    a = forward(model, [fused.feed(ids, 7)])[0].logits
    b = forward(plain, [unfused.feed(ids, 7)])[0].logits
    assert torch.equal(a, b)
