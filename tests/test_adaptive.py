"""The adaptive draft-length policy: decisions from measured rounds, and losslessness end to end."""

import pytest

from specviz.core.progress import drain
from specviz.core.adaptive import AdaptiveGamma
from specviz.core.drafters.model import ModelDrafter
from specviz.core import drafters
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.trace import GenerationConfig, RoundTrace
from specviz.core.metrics import compare
from specviz.core.sampling import SamplingConfig
from tests.test_engine import PROMPT, TOK, WrongDrafter, tiny_lm


def _round(k: int, n: int, draft_ms: float, verify_ms: float) -> RoundTrace:
    return RoundTrace(
        index=0, position=0, draft_ids=(1,) * k, draft_texts=("a",) * k, p_draft=(0.5,) * k, q_draft=(0.5,) * k,
        accept_probs=(1.0,) * k, uniforms=(0.1,) * k, accepted=tuple(i < n for i in range(k)), n_accepted=n,
        next_id=2, next_text="b", next_origin="target" if k == 0 else "correction", p_top=None, q_top=None,
        residual_top=None, draft_ms=draft_ms, verify_ms=verify_ms,
    )


def _drive(policy, outcome, rounds_n=60):
    """Feed the policy rounds whose cost/benefit comes from outcome(gamma); return the gammas chosen."""
    rounds, gammas = [], []
    for _ in range(rounds_n):
        g = policy(rounds)
        gammas.append(g)
        rounds.append(outcome(g))
    return gammas


def test_drafts_from_the_first_round():
    assert AdaptiveGamma(max_gamma=16).new_policy()([]) == 16


def test_keeps_drafting_while_it_clearly_pays_without_a_calibration_step():
    # 4 drafted, 4 accepted + 1: 5 tokens a round
    gammas = _drive(AdaptiveGamma(max_gamma=8).new_policy(), lambda g: _round(g and 4, g and 4, 40.0 * bool(g), 200.0 if g else 100.0))
    assert all(g == 8 for g in gammas)


def test_measures_a_plain_step_when_in_doubt_and_keeps_drafting_if_it_still_pays():
    # 2 tokens a round for 40 + 110 ms: 75 ms a token vs 100 ms per plain step
    gammas = _drive(AdaptiveGamma(max_gamma=8, min_rounds=3).new_policy(),
                    lambda g: _round(g and 4, 1 if g else 0, 40.0 * bool(g), 110.0 if g else 100.0), rounds_n=30)
    assert gammas[:4] == [8, 8, 8, 0]  # three rounds judged, then one plain step to compare with
    assert all(g == 8 for g in gammas[4:])


def test_switches_off_when_drafting_loses_and_probes_with_backoff():
    # every draft rejected: 1 token for 40 + 200 ms, vs 100 ms per plain step
    cfg = AdaptiveGamma(max_gamma=8, probe_after=4, min_rounds=3)
    gammas = _drive(cfg.new_policy(), lambda g: _round(g and 4, 0, 40.0 * bool(g), 200.0 if g else 100.0), rounds_n=90)
    pattern = "".join("d" if g else "p" for g in gammas)
    drafting_runs = [len(e) for e in pattern.split("p") if e]
    plain_runs = [len(e) for e in pattern.strip("p").split("d") if e]
    assert pattern.startswith("dddp")  # judged after min_rounds, with one plain step to compare
    assert set(drafting_runs) == {3}  # each probe is judged on min_rounds rounds, then switched off
    assert plain_runs[:3] == [4, 8, 16]  # the wait (calibration step included) doubles after each failed probe


def test_a_successful_probe_turns_drafting_back_on():
    state = {"good": False}

    def outcome(g):
        return _round(g and 4, 4 if state["good"] else 0, 40.0 * bool(g), 200.0 if g else 100.0)

    policy = AdaptiveGamma(max_gamma=8, probe_after=4).new_policy()
    rounds = []
    for _ in range(20):
        rounds.append(outcome(policy(rounds)))
    state["good"] = True
    gammas = []
    for _ in range(30):
        g = policy(rounds)
        gammas.append(g)
        rounds.append(outcome(g))
    assert gammas[-10:] == [8] * 10


@pytest.mark.parametrize("drafter_kind", ["right", "wrong", "other"])
def test_adaptive_greedy_is_lossless(drafter_kind):
    target = tiny_lm(0)
    drafter = {
        "right": ModelDrafter(target, min_confidence=0.4),
        "wrong": WrongDrafter(target),
        "other": drafters.build("model", tiny_lm(1), adaptive=True),
    }[drafter_kind]
    cfg = GenerationConfig(max_new_tokens=60, gamma=8, adaptive=True, sampling=SamplingConfig("greedy"))
    base = drain(autoregressive_generate(target, TOK, PROMPT, cfg))
    spec = drain(speculative_generate(target, drafter, TOK, PROMPT, cfg))
    assert spec.tokens == base.tokens
    assert max(len(r.draft_ids) for r in spec.rounds) <= 8


def test_confidence_stop_shortens_drafts():
    target, draft = tiny_lm(0), tiny_lm(1)
    cfg = GenerationConfig(max_new_tokens=40, gamma=8, sampling=SamplingConfig("greedy"))
    full = drain(speculative_generate(target, ModelDrafter(draft), TOK, PROMPT, cfg))
    short = drain(speculative_generate(target, ModelDrafter(draft, min_confidence=0.99), TOK, PROMPT, cfg))
    assert short.tokens == full.tokens
    assert short.drafted / len(short.rounds) < full.drafted / len(full.rounds)


def test_summary_uses_the_draft_length_actually_used_when_adaptive():
    target = tiny_lm(0)
    cfg = GenerationConfig(max_new_tokens=40, gamma=16, adaptive=True, sampling=SamplingConfig("greedy"))
    base = drain(autoregressive_generate(target, TOK, PROMPT, cfg))
    spec = drain(speculative_generate(target, ModelDrafter(target, min_confidence=0.4, min_tokens=3), TOK, PROMPT, cfg))
    drafted = [len(r.draft_ids) for r in spec.rounds if r.draft_ids]
    assert compare(spec, base).gamma == pytest.approx(sum(drafted) / len(drafted))
    assert compare(spec, base).gamma <= 16
