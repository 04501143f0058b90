"""The drafter seam and registry (specviz.core.drafters, rounds, tree): a drafter defined here, registered from here, hears the target's features."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch

from specviz.core import drafters
from specviz.core.drafters import DrafterSpec, Parts
from specviz.core.drafters.ngram import find_ngram_continuation
from specviz.core.engine import autoregressive_generate, speculative_generate, speculative_program
from specviz.core.progress import drain
from specviz.core.rounds import Session, Draft, Kept, Steps
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.core.tree import ChainAsTree
from specviz.serve.batch import run_together
from specviz.serve.exact import batch_exactness
from tests.test_serve import TOK, aligned_lm

LAYERS = (-1, 1)  # the last layer after the final norm (what EAGLE reads), and the first decoder layer's output
PROMPTS = ([1, 5, 2, 7, 1, 5, 2, 7, 1, 5], [3, 3, 4, 3, 3, 4, 3], [6, 2, 6, 2, 6, 2, 6, 2, 6])


class _HearingSession(Session):
    """Proposes by prompt lookup (so rounds accept drafts) and writes down every verdict it hears."""

    features = LAYERS

    def __init__(self, vocab: int, heard: list[Kept]) -> None:
        self.vocab = vocab
        self.heard = heard

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()
        tokens = find_ngram_continuation(ids, 3, 1, gamma)
        q = torch.zeros(len(tokens), self.vocab)
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return Draft(tuple(tokens), q)

    def hear(self, kept: Kept) -> None:
        self.heard.append(kept)


@dataclass(frozen=True, eq=False)
class HearingDrafter:
    """A drafter that exists only in this file: chains, or the same proposals played as tree rounds."""

    shape: str = "chain"
    name: str = "hearing-test"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sessions", [])

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int):
        heard: list[Kept] = []
        self.sessions.append(heard)  # type: ignore[attr-defined]
        session = _HearingSession(vocab_size, heard)
        return session if self.shape == "chain" else ChainAsTree(session, gamma=4)


@pytest.fixture
def registered():
    """Register the test's drafter (chain and tree) from this file alone; remove it afterwards."""
    for shape in ("chain", "tree"):
        drafters.register(DrafterSpec(
            name=f"hearing-{shape}", title=f"a test drafter ({shape})", words="It guesses by lookup and listens.",
            needs_draft_model=False, needs_features=True, shape=shape, length="variable", leviathan=False,  # type: ignore[arg-type]
            make=lambda parts, shape=shape: HearingDrafter(shape, f"hearing-{shape}")))
    yield
    for shape in ("chain", "tree"):
        drafters.unregister(f"hearing-{shape}")


@pytest.fixture(scope="module")
def target():
    """A tiny Llama with packed linears: rows give the same bits whatever shares their pass, so the executor packs runs."""
    return aligned_lm(0)


def _full_hidden(target: torch.nn.Module, ids: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """The asked layers at every position of ids, from one plain pass (transformers' own forward)."""
    with torch.inference_mode():
        out = target(torch.tensor([list(ids)]), output_hidden_states=True)
    return tuple(out.hidden_states[layer][0].float() for layer in LAYERS)


def _check_heard(target: torch.nn.Module, heard: list[Kept], prompt: Sequence[int], tokens: Sequence[int]) -> None:
    """The verdicts cover every position but the last exactly once, in order, with the target's own features there."""
    final = list(prompt) + list(tokens)
    assert heard[0].start == 0 and heard[0].drafted == 0 and heard[0].next_token is None
    assert heard[0].hidden[0].shape[0] == len(prompt) - 1
    position = 0
    for kept in heard:
        rows = kept.hidden[0].shape[0]
        assert kept.start == position and len(kept.hidden) == len(LAYERS)
        if kept.next_token is not None:
            assert rows == kept.accepted + 1 and len(kept.path) == kept.accepted
            assert list(kept.ids) == final[: len(kept.ids)]  # what it heard is what the run kept
        position += rows
    assert position == len(final) - 1  # the last token's row is never computed: the run stopped
    full = _full_hidden(target, final)
    got = [torch.cat([k.hidden[i] for k in heard]) for i in range(len(LAYERS))]
    for g, f in zip(got, full):
        torch.testing.assert_close(g, f[: len(final) - 1], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_drafter_from_this_file_hears_the_targets_features_alone(target, registered, shape):
    drafter = drafters.build(f"hearing-{shape}", target=target)
    assert drafters.spec(f"hearing-{shape}").needs_features and f"hearing-{shape}" in drafters.names()
    config = GenerationConfig(max_new_tokens=12, gamma=4, stop_at_eos=False)
    for prompt in PROMPTS:
        gen = drain(speculative_generate(target, drafter, TOK, prompt, config))
        plain = drain(autoregressive_generate(target, TOK, prompt, config))
        assert gen.tokens == plain.tokens  # listening changes nothing
        assert gen.accepted > 0  # rounds kept drafts, so verdicts had several rows
        if shape == "tree":
            assert any(r.tree is not None for r in gen.rounds)
        _check_heard(target, drafter.sessions[-1], prompt, gen.tokens)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_drafter_from_this_file_hears_the_same_features_under_the_batched_executor(target, registered, shape):
    config = GenerationConfig(max_new_tokens=12, gamma=4, stop_at_eos=False)
    alone, together = drafters.build(f"hearing-{shape}", target=target), drafters.build(f"hearing-{shape}", target=target)
    solo_gens = [drain(speculative_generate(target, alone, TOK, p, config)) for p in PROMPTS]
    programs = [speculative_program(target, together, TOK, p, config) for p in PROMPTS]
    gens, sharing, _ = run_together(programs, target)
    assert max(s.most for s in sharing) > 1  # the runs really shared passes
    exact = batch_exactness(target).exact
    assert exact  # so "the same features" below means the same bits
    for prompt, g, s, heard_alone, heard_together in zip(PROMPTS, gens, solo_gens, alone.sessions, together.sessions):
        assert g.tokens == s.tokens
        _check_heard(target, heard_together, prompt, g.tokens)
        for a, b in zip(heard_alone, heard_together):
            for x, y in zip(a.hidden, b.hidden):
                assert torch.equal(x, y)


def test_registry_describes_every_kind_once_and_refuses_what_it_cannot_build():
    built_in = ("model", "ngram", "tree")
    assert drafters.names()[:3] == built_in
    for spec in drafters.specs():
        assert spec.title and spec.words and spec.shape in ("chain", "tree") and spec.length in ("fixed", "variable")
    assert drafters.spec("tree").gamma_applies is False and drafters.spec("model").gamma_applies
    with pytest.raises(ValueError, match="unknown drafter 'oracle'.*model, ngram, tree"):
        drafters.spec("oracle")
    with pytest.raises(ValueError, match="needs a draft model"):
        drafters.build("tree", draft=None)
    assert drafters.build("ngram").name == "ngram"  # needs neither model


def test_a_registered_drafter_reaches_the_cli_and_the_app_settings(registered):
    from specviz.app.settings import parse_query
    from specviz.cli import build_parser

    args = build_parser().parse_args(["generate", "--prompt", "x", "--drafter", "hearing-chain"])
    assert args.drafter == "hearing-chain"
    found, notes = parse_query({"drafter": "hearing-tree"}, ("tiny-random",))
    assert found.drafter == "hearing-tree" and not notes


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_drafter_hears_the_targets_features_from_the_same_answer_labs_memo(target, registered, shape):
    """The Same answer lab's memo serves the hidden states a head reads, per prefix like p: sampled runs through it keep
    the plain run's every draw (memoising changes the cost, not a draw), hear the target's own features, and the
    second sample of a prompt asks the model for next to nothing."""
    from specviz.labs.same_answer import MemoTarget, target_memo

    sampling = SamplingConfig(mode="sample", temperature=1.0, seed=0)
    memo = target_memo(target, sampling)
    for prompt in PROMPTS[:2]:
        for seed in range(3):
            config = GenerationConfig(max_new_tokens=10, gamma=4, stop_at_eos=False,
                                      sampling=SamplingConfig(mode="sample", temperature=1.0, seed=seed))
            plain, memoised = (drafters.build(f"hearing-{shape}", target=target) for _ in range(2))
            a = drain(speculative_generate(target, plain, TOK, prompt, config))
            b = drain(speculative_generate(target, memoised, TOK, prompt, config, target_probs=MemoTarget(memo)))
            assert a.tokens == b.tokens and [r.uniforms for r in a.rounds] == [r.uniforms for r in b.rounds]
            _check_heard(target, memoised.sessions[-1], prompt, b.tokens)
            again = drafters.build(f"hearing-{shape}", target=target)
            misses = memo.misses
            c = drain(speculative_generate(target, again, TOK, prompt, config, target_probs=MemoTarget(memo)))
            assert c.tokens == b.tokens and memo.misses == misses  # the same sample again: every row from the memo
            _check_heard(target, again.sessions[-1], prompt, c.tokens)


def test_parts_carry_only_what_was_loaded():
    assert Parts().draft is None and Parts().target is None and not Parts().adaptive


# ------------------------------------------------------------------------------------------
# Every lab that takes the sidebar's drafter, with every drafter the sidebar offers
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_pair():
    from specviz import models

    return models.load_pair("tiny-random")


def _watch(pair, ids, s, prompt):
    from specviz.core.rounds import solo_run
    from specviz.labs import watch

    gen = drain(solo_run(watch.speculative_run(pair, ids, s).program))
    plain = drain(solo_run(watch.baseline_run(pair, ids, s).program))
    assert gen.tokens == plain.tokens and gen.drafter == s.drafter


def _how_far(pair, ids, s, prompt):
    from specviz.labs import how_far

    reason = how_far.unsuited(s.drafter)
    if reason:  # the page shows this sentence instead of a chart
        assert drafters.spec(s.drafter).title in reason
        with pytest.raises(ValueError, match="does not apply"):
            how_far.sweep_config(s, prompt, [1, 3])
        return
    sweep = drain(how_far.sweep_steps(pair, ids, how_far.sweep_config(s, prompt, [1, 3])))
    assert [p.gamma for p in sweep.points] == [1, 3] and all(p.identical for p in sweep.points)


def _where_it_helps(pair, ids, s, prompt):
    from dataclasses import replace

    from specviz.labs import where_it_helps
    from specviz.presets import PRESETS

    found = drain(where_it_helps.workload_steps(pair, replace(where_it_helps.workloads_config(s), presets=PRESETS[:2])))
    assert len(found.rows) == 2 and all(r.identical for r in found.rows)
    assert drafters.spec(s.drafter).title in found.method


def _same_answer_greedy(pair, ids, s, prompt):
    from specviz.labs import same_answer

    found = drain(same_answer.greedy_job(pair, ids, s.drafter, s.generation_config()))
    assert found.identical


def _same_answer_sampling(pair, ids, s, prompt):
    from specviz.labs import same_answer

    cfg = same_answer.SampleConfig(SamplingConfig(mode="sample", temperature=1.0, seed=3), n_samples=30, n_tokens=2)
    for wrong in (False, True):
        spec = same_answer.spec_config(s, wrong, 2)
        assert (spec.rule == "topk") == (wrong and same_answer.lossy_rule_unsuited(s.drafter) is None)
        counts = drain(same_answer.speculative_job(pair.target, pair.draft, pair.tokenizer, ids, cfg, spec, pair.head))
        assert counts.n == 30


LABS = {"watch": _watch, "how_far": _how_far, "where_it_helps": _where_it_helps,
        "same_answer_greedy": _same_answer_greedy, "same_answer_sampling": _same_answer_sampling}


@pytest.mark.parametrize("drafter", drafters.names())
@pytest.mark.parametrize("lab", LABS)
def test_every_lab_runs_with_every_drafter_on_the_tiny_pair(tiny_pair, lab, drafter):
    from specviz.settings import Settings

    prompt = "the cat sat on the mat and the cat sat"
    s = Settings(pair="tiny-random", drafter=drafter, max_new_tokens=10, gamma=3)
    ids = list(tiny_pair.tokenizer(prompt)["input_ids"])
    LABS[lab](tiny_pair, ids, s, prompt)
